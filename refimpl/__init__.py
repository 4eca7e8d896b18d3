"""gpu-timeshare reference implementation: offload store, worker state control,
communicator suspend/resume and the process-group lifecycle, written once against
the runtime seam (:mod:`refimpl.runtime`)."""

__version__ = "0.1.0"
