"""The runtime seam. See :mod:`refimpl.runtime.base` for the theory of operation."""
from refimpl.runtime.base import *  # noqa: F401,F403
from refimpl.runtime.base import __all__ as _base_all


def __getattr__(name):
    # TorchRuntime imports torch.distributed; load it only when asked for.
    if name in ("TorchRuntime",):
        from refimpl.runtime import torch_runtime

        return getattr(torch_runtime, name)
    raise AttributeError(name)


__all__ = list(_base_all) + ["TorchRuntime"]
