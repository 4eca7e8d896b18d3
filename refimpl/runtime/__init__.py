"""The runtime seam. See :mod:`refimpl.runtime.base` for the theory of operation.

This package is the ground floor: the :class:`Runtime` interface, its data types
and errors; nothing here imports ``torch.distributed`` or CUDA. The torch
implementation lives in :mod:`refimpl.torch_runtime` (``from refimpl.torch_runtime
import TorchRuntime``), the simulated one in :mod:`sim`.
"""
from refimpl.runtime.base import *  # noqa: F401,F403
from refimpl.runtime.base import __all__ as _base_all

__all__ = list(_base_all)
