"""Deterministic discrete-event simulator that runs the protocol code of :mod:`refimpl`.

The same ``async def`` protocol code that runs on ``TorchRuntime`` runs here on
:class:`SimRuntime` ranks inside one :class:`SimWorld`:

    import sim
    world = sim.SimWorld(8, payload="real")
    results = world.run(lambda rt: protocol(rt))

Kernel: :mod:`sim.engine`. Model protocols and defaults (time, memory, faults,
communicators): :mod:`sim.model_protocols`. Rendezvous and mismatch detection:
:mod:`sim.rendezvous`. Deadlock detection: :mod:`sim.deadlock`.
"""
from sim.engine import (
    Chooser, Engine, FifoChooser, HypothesisChooser, Process, ProcessState, RandomChooser, SimFuture,
)
from sim.errors import (
    CollectiveMismatchError, DeadlockError, RankCrashedError, RankFailedError, RankHungError, SimError,
    SimOutOfMemoryError, SimUsageError,
)
from sim.model_protocols import (
    CollectiveCost, CommModel, FaultAction, FaultHooks, FaultKind, FixedBandwidthTransport, LedgerMemory,
    MemoryModel, NcclCommModel, NoFaults, RingCollectiveCost, Transport,
)
from sim.runtime import SimRuntime
from sim.world import RankReport, SimWorld, WorldReport, run_ranks

__all__ = [
    "Chooser", "CollectiveCost", "CollectiveMismatchError", "CommModel", "DeadlockError", "Engine",
    "FaultAction", "FaultHooks", "FaultKind", "FifoChooser", "FixedBandwidthTransport", "HypothesisChooser",
    "LedgerMemory", "MemoryModel", "NcclCommModel", "NoFaults", "Process", "ProcessState", "RandomChooser",
    "RankCrashedError", "RankFailedError", "RankHungError", "RankReport", "RingCollectiveCost", "SimError",
    "SimFuture", "SimOutOfMemoryError", "SimRuntime", "SimUsageError", "SimWorld", "Transport", "WorldReport",
    "run_ranks",
]
