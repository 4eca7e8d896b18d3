"""Communicator control: NCCL suspend/resume and the process-group lifecycle.

* :mod:`refimpl.comm.states`: :class:`PGState`, :class:`PGPolicy` and the
  transition table as data; :mod:`refimpl.comm.decisions` decides,
  :class:`PGLifecycle` performs, :mod:`refimpl.comm.role_groups` walks the
  groups with agreed steps.
* :mod:`refimpl.comm.agreement`, :mod:`refimpl.comm.cooldown`,
  :mod:`refimpl.comm.gates`: the agreement over the control group, the deferred
  port cooldown and the static eligibility gates.

The NCCL binding (``nccl``, ``nccl_loader``) and the ``offload_nccl`` check
(``NcclFacts``, ``require_offload_nccl``, ...) are implementation: they live in
:mod:`refimpl.torch_runtime`. For code written before they moved, this package
still offers them through a lazy module ``__getattr__`` (loaded on first use, so
importing :mod:`refimpl.comm` never loads torch's side); it is a declared
exception of the import-graph rule (``tests/test_import_graph.py``).
"""
import importlib


from refimpl.comm.agreement import AgreementError, AgreementMismatchError, AgreementTimeoutError, ControlGroup
from refimpl.comm.cooldown import PortCooldown
from refimpl.comm.gates import RELAX_GATES, Gate, GateContext, fact_gate, failing_gates
from refimpl.comm.lifecycle import (
    BlockingPGLifecycle,
    LifecycleConfig,
    LifecycleError,
    LifecycleFailedError,
    LifecycleStateError,
    LifecycleStats,
    PeerFailedError,
    PGLifecycle,
    PolicyMismatchError,
    ResumeMemoryError,
    preservation_disabled_reason,
)
from refimpl.comm.states import (
    TRANSITIONS,
    InvalidTransitionError,
    PGEvent,
    PGPolicy,
    PGState,
    Transition,
    format_table,
    mermaid,
    next_state,
)

#: name -> (module above this floor, attribute or None for the module itself); loaded on first use
MOVED_UP: dict[str, tuple[str, str | None]] = {
    "nccl": ("refimpl.torch_runtime.nccl", None),
    "nccl_loader": ("refimpl.torch_runtime.nccl_loader", None),
    "validation": ("refimpl.torch_runtime.nccl_validation", None),
    "NcclFacts": ("refimpl.torch_runtime.nccl_validation", "NcclFacts"),
    "NcclOffloadUnavailableError": ("refimpl.torch_runtime.nccl_validation", "NcclOffloadUnavailableError"),
    "require_offload_nccl": ("refimpl.torch_runtime.nccl_validation", "require_offload_nccl"),
    "validate_offload_nccl": ("refimpl.torch_runtime.nccl_validation", "validate_offload_nccl"),
}


def __getattr__(name):
    # The NCCL binding and its check moved up to refimpl.torch_runtime; load them only when asked.
    target = MOVED_UP.get(name)
    if target is None:
        raise AttributeError(f"module 'refimpl.comm' has no attribute {name!r}")
    module = importlib.import_module(target[0])
    return module if target[1] is None else getattr(module, target[1])


__all__ = [
    "AgreementError",
    "AgreementMismatchError",
    "AgreementTimeoutError",
    "BlockingPGLifecycle",
    "ControlGroup",
    "Gate",
    "GateContext",
    "InvalidTransitionError",
    "LifecycleConfig",
    "LifecycleError",
    "LifecycleFailedError",
    "LifecycleStateError",
    "LifecycleStats",
    "PGEvent",
    "PGLifecycle",
    "PGPolicy",
    "PGState",
    "PeerFailedError",
    "PolicyMismatchError",
    "PortCooldown",
    "ResumeMemoryError",
    "RELAX_GATES",
    "TRANSITIONS",
    "Transition",
    "fact_gate",
    "failing_gates",
    "format_table",
    "mermaid",
    "next_state",
    "preservation_disabled_reason",
]
