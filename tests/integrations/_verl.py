"""Whether verl is installed here, and the mark that skips a test with the reason where it is not."""
from __future__ import annotations

import importlib.util

import pytest

HAVE_VERL = importlib.util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAVE_VERL, reason="verl is not installed (pip install -e '.[verl]'); CI installs it")
