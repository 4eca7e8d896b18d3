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
:mod:`refimpl.torch_runtime` (:mod:`refimpl.torch_runtime.nccl_validation`), and
importing :mod:`refimpl.comm` never loads them.
"""

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
