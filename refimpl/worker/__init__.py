"""Worker-level offload/reload control (:mod:`refimpl.worker.control`) and roles as Ray actors sharing GPUs
(:mod:`refimpl.worker.role`, the worker side; :mod:`refimpl.worker.cluster`, the driver side; Ray is imported
only when a cluster starts)."""
from refimpl.worker import cluster as _cluster
from refimpl.worker import control as _control
from refimpl.worker import role as _role
from refimpl.worker.cluster import *  # noqa: F401,F403
from refimpl.worker.control import *  # noqa: F401,F403
from refimpl.worker.role import *  # noqa: F401,F403

__all__ = [*_control.__all__, *_role.__all__, *_cluster.__all__]
