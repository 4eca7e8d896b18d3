"""Communicator control: NCCL suspend/resume and the process-group lifecycle.

* :mod:`refimpl.comm.nccl_loader`: which libnccl is mapped in this process.
* :mod:`refimpl.comm.nccl`: ctypes binding to it (the only module here that
  touches ``torch.distributed`` / CUDA, and only inside its functions).
* :mod:`refimpl.comm.validation`: refuse ``offload_nccl`` unless that library
  can suspend communicators.
* :mod:`refimpl.comm.states`: :class:`PGState`, :class:`PGPolicy` and the
  transition table as data; :mod:`refimpl.comm.decisions` decides,
  :class:`PGLifecycle` performs, :mod:`refimpl.comm.role_groups` walks the
  groups with agreed steps.
* :mod:`refimpl.comm.agreement`, :mod:`refimpl.comm.cooldown`,
  :mod:`refimpl.comm.gates`: the agreement over the control group, the deferred
  port cooldown and the static eligibility gates.

``refimpl.comm.nccl`` is not imported here; see docs/comm.md.
"""
from refimpl.comm.agreement import AgreementError, AgreementTimeoutError, ControlGroup
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
from refimpl.comm.validation import (
    NcclFacts,
    NcclOffloadUnavailableError,
    require_offload_nccl,
    validate_offload_nccl,
)

__all__ = [
    "AgreementError",
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
    "NcclFacts",
    "NcclOffloadUnavailableError",
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
    "require_offload_nccl",
    "validate_offload_nccl",
]
