"""Tests of refimpl/store/clients/."""
