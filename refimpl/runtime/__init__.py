"""The runtime seam. See :mod:`refimpl.runtime.base` for the theory of operation.

This package is the ground floor: the :class:`Runtime` interface, its data types
and errors; nothing here imports ``torch.distributed`` or CUDA. The torch
implementation lives in :mod:`refimpl.torch_runtime`, the simulated one in
:mod:`sim`.

Compatibility: ``from refimpl.runtime import TorchRuntime`` (and ``dcp``) keep
working through a lazy module ``__getattr__`` that loads the names from
:mod:`refimpl.torch_runtime` on first use. It is the declared exception of the
import-graph rule (``tests/test_import_graph.py``); new code imports from
:mod:`refimpl.torch_runtime`.
"""
import importlib

from refimpl.runtime.base import *  # noqa: F401,F403
from refimpl.runtime.base import __all__ as _base_all

#: name -> (module above this floor, attribute or None for the module itself); loaded on first use
MOVED_UP: dict[str, tuple[str, str | None]] = {
    "TorchRuntime": ("refimpl.torch_runtime", "TorchRuntime"),
    "dcp": ("refimpl.torch_runtime.dcp", None),
    "torch_runtime": ("refimpl.torch_runtime.runtime", None),
}


def __getattr__(name):
    # Names that moved up to refimpl.torch_runtime: import it only when asked (it imports torch.distributed).
    target = MOVED_UP.get(name)
    if target is None:
        raise AttributeError(f"module 'refimpl.runtime' has no attribute {name!r}")
    module = importlib.import_module(target[0])
    return module if target[1] is None else getattr(module, target[1])


__all__ = list(_base_all) + ["TorchRuntime"]
