"""Deterministic discrete-event simulator that runs the protocol code of :mod:`refimpl`.

The same ``async def`` protocol code that runs on ``TorchRuntime`` runs here on
:class:`SimRuntime` ranks inside one :class:`SimWorld`:

    import sim
    world = sim.SimWorld(8, payload="real")
    results = world.run(lambda rt: protocol(rt))

Kernel: :mod:`sim.engine`. Model protocols and defaults (time, memory, faults,
communicators): :mod:`sim.model_protocols`. Rendezvous and mismatch detection:
:mod:`sim.rendezvous`. Deadlock detection: :mod:`sim.deadlock`.

[Note: imports without the cyclic GC]
Importing the simulator imports torch: about 1 s of a ``timeshare sim run``,
of which the cyclic garbage collector, walking the tens of thousands of
objects the imports create again and again, took about a tenth (issue 18).
Imports make almost no cyclic garbage, so the collector is paused while the
modules below load and switched back on after (if it was on): no object is
kept or freed differently, only later.
"""
import gc as _gc

_gc_was_enabled = _gc.isenabled()
_gc.disable()
try:
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
finally:
    if _gc_was_enabled:
        _gc.enable()

__all__ = [
    "Chooser", "CollectiveCost", "CollectiveMismatchError", "CommModel", "DeadlockError", "Engine",
    "FaultAction", "FaultHooks", "FaultKind", "FifoChooser", "FixedBandwidthTransport", "HypothesisChooser",
    "LedgerMemory", "MemoryModel", "NcclCommModel", "NoFaults", "Process", "ProcessState", "RandomChooser",
    "RankCrashedError", "RankFailedError", "RankHungError", "RankReport", "RingCollectiveCost", "SimError",
    "SimFuture", "SimOutOfMemoryError", "SimRuntime", "SimUsageError", "SimWorld", "Transport", "WorldReport",
    "run_ranks",
]
