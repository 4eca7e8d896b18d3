"""Tests of refimpl/store/state/."""
