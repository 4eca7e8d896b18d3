"""Worker-level offload/reload control; see :mod:`refimpl.worker.control`."""
from refimpl.worker.control import (
    WorkerStateControl,
    auto_offload,
    log_gpu_memory_usage,
    memory_metrics,
    state_offload_manager,
    wants_offload,
)

__all__ = [
    "WorkerStateControl",
    "auto_offload",
    "log_gpu_memory_usage",
    "memory_metrics",
    "state_offload_manager",
    "wants_offload",
]
