"""Debug mode (``TIMESHARE_DEBUG=1``): where each offload was called from, named in the guard's errors, and the
replica checks of ``local_dedup`` at every offload."""
from __future__ import annotations

import inspect
import os

DEBUG_ENV = "TIMESHARE_DEBUG"
"""Environment variable that turns on debug mode (where each offload was called from in the guard's
errors, replica checks at every offload)."""


def debug_mode() -> bool:
    """True when :data:`DEBUG_ENV` is set to a true value (1, true, yes, on)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # refimpl/


def caller_site() -> str:
    """``file:line in function`` of the innermost caller outside this package (debug mode's detail for
    the guard's errors: where the offload was called from)."""
    here = inspect.currentframe()
    f = here.f_back if here is not None else None
    while f is not None and f.f_code.co_filename.startswith(_PACKAGE):
        f = f.f_back
    if f is None:
        return "an offload inside the store"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno} in {f.f_code.co_name}()"


__all__ = ["DEBUG_ENV", "caller_site", "debug_mode"]
