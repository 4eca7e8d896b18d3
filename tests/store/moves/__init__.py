"""Tests of refimpl/store/moves/."""
