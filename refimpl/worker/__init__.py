"""Worker-level offload/reload control; see :mod:`refimpl.worker.control`."""
from refimpl.worker.control import *  # noqa: F401,F403
from refimpl.worker.control import __all__  # noqa: F401
