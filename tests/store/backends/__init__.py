"""Tests of refimpl/store/backends/."""
