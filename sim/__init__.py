"""Deterministic discrete-event simulator that runs the protocol code of :mod:`refimpl`.

The same ``async def`` protocol code that runs on ``TorchRuntime`` runs here on
:class:`SimRuntime` ranks inside one :class:`SimWorld`:

    import sim
    world = sim.SimWorld(8, payload="real")
    results = world.run(lambda rt: protocol(rt))

The simulator stands in rooms, each importing only the rooms below it
(docs/design.md, The simulator; ``tests/import_graph.py`` checks it):

=====================  ==========================================================
room                   what
=====================  ==========================================================
:mod:`sim.commands`    ``timeshare sim`` and ``timeshare plan``
:mod:`sim.planner`     which offload settings fit a model on a cluster
:mod:`sim.scenarios`,  scenario files run and judged; measurement records and the
:mod:`sim.calibrate`   simulator fitted on and checked against them (side by side)
``sim`` (this folder)  the ranks: :class:`SimRuntime` (:mod:`sim.runtime`), :class:`SimWorld`
                       (:mod:`sim.world`), collective matching (:mod:`sim.rendezvous`),
                       deadlock detection (:mod:`sim.deadlock`)
:mod:`sim.machine`     the simulated machine: its protocols and their defaults, the
                       topology, flows, collectives, memory and faults
:mod:`sim.kernel`,     the discrete-event engine and the errors; the presets and
:mod:`sim.presets`     schemas (side by side)
=====================  ==========================================================

[Note: imports without the cyclic GC]
The package's face (:class:`SimWorld`, :class:`SimRuntime`, the engine, the errors, the machine's
protocols) loads on first use, so that a module of a room (a CLI's argument parser, ``--help``)
can be imported without torch. Loading the face imports torch, whose imports create tens of
thousands of objects that the cyclic garbage collector would walk again and again (docs/calibration.md,
"Run time at scale", says what it cost). Imports make almost no cyclic garbage, so the collector is
paused while the modules below load and switched back on after (if it was on): no object is kept or
freed differently, only later.
"""
import gc as _gc
import importlib as _importlib

#: the names of the package's face -> the module that defines each (loaded on first use, see the note below)
_FACE: dict[str, str] = {
    **dict.fromkeys(("Chooser", "Engine", "FifoChooser", "HypothesisChooser", "Process", "ProcessState",
                     "RandomChooser", "SimFuture"), "sim.kernel.engine"),
    **dict.fromkeys(("CollectiveMismatchError", "DeadlockError", "RankCrashedError", "RankFailedError", "RankHungError",
                     "SimError", "SimOutOfMemoryError", "SimUsageError"), "sim.kernel.errors"),
    **dict.fromkeys(("CollectiveCost", "CommCosts", "FaultAction", "FaultHooks", "FaultKind", "FixedBandwidthTransport",
                     "LedgerMemory", "Memory", "NcclCommCosts", "NoFaults", "RingCollectiveCost", "Transport"),
                    "sim.machine.protocols"),
    "SimRuntime": "sim.runtime",
    **dict.fromkeys(("RankReport", "SimWorld", "WorldReport", "run_ranks"), "sim.world"),
}


def __getattr__(name: str):
    """``sim.SimWorld`` and the rest of the face, loaded on first use (with the cyclic GC paused, see the note)."""
    if name in _FACE:
        was = _gc.isenabled()
        _gc.disable()
        try:
            value = getattr(_importlib.import_module(_FACE[name]), name)
        finally:
            if was:
                _gc.enable()
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


__all__ = [
    "Chooser", "CollectiveCost", "CollectiveMismatchError", "CommCosts", "DeadlockError", "Engine",
    "FaultAction", "FaultHooks", "FaultKind", "FifoChooser", "FixedBandwidthTransport", "HypothesisChooser",
    "LedgerMemory", "Memory", "NcclCommCosts", "NoFaults", "Process", "ProcessState", "RandomChooser",
    "RankCrashedError", "RankFailedError", "RankHungError", "RankReport", "RingCollectiveCost", "SimError",
    "SimFuture", "SimOutOfMemoryError", "SimRuntime", "SimUsageError", "SimWorld", "Transport", "WorldReport",
    "run_ranks",
]
