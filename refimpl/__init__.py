"""gpu-timeshare reference implementation: offload store, worker state control,
communicator suspend/resume and the process-group lifecycle, written once against
the runtime seam (:mod:`refimpl.runtime`) and run on torch by
:mod:`refimpl.torch_runtime` (and on the simulator by :mod:`sim`). Where each
package stands: docs/design.md, "Floors"."""

__version__ = "0.1.0"
