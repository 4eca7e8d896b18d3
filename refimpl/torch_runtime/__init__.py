"""The seam on real hardware: :class:`TorchRuntime` and the torch-side code behind it.

One of the two implementations of :class:`refimpl.runtime.Runtime` (the other is
:mod:`sim`). Everything under ``refimpl/`` that touches ``torch.distributed``,
``torch.cuda`` or the NCCL library lives in this package:

* :mod:`refimpl.torch_runtime.runtime`: :class:`TorchRuntime`.
* :mod:`refimpl.torch_runtime.copy_stream`: the dedicated CUDA copy stream.
* :mod:`refimpl.torch_runtime.pinning`: host buffers page-locked at their exact size.
* :mod:`refimpl.torch_runtime.dcp`: DCP checkpoints of an offload store.
* :mod:`refimpl.torch_runtime.nccl_loader`, :mod:`refimpl.torch_runtime.nccl`: the
  libnccl mapped in this process and a ctypes binding to its suspend/resume.
* :mod:`refimpl.torch_runtime.nccl_validation`: refuse ``offload_nccl`` unless that
  library can suspend communicators.
* :mod:`refimpl.torch_runtime.device_check`: the command line's ``--device`` checked
  before a run (one-line error, exit 2).

It may import the seam and the protocol code (:mod:`refimpl.store`,
:mod:`refimpl.comm`, :mod:`refimpl.worker`); nothing below it imports it (see
``tests/test_import_graph.py`` and docs/design.md, "Floors").
"""
from refimpl.torch_runtime.runtime import TorchRuntime

__all__ = ["TorchRuntime"]
