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
:mod:`sim.models`      the model protocols and their defaults, the topology, flows,
                       collectives, memory and fault models
:mod:`sim.kernel`,     the discrete-event engine and the errors; the presets and
:mod:`sim.presets`     schemas (side by side)
=====================  ==========================================================

[Note: the old module paths]
Before the rooms every module lay in ``sim/`` itself. :data:`MOVED` maps each old
name to its room; an import of an old name (``import sim.flows``, ``from
sim.engine import Engine``, ``python -m sim.colocated``) gets the very module of
the new name (``sim.flows is sim.models.flows``), through :class:`_MovedFinder`
on ``sys.meta_path``, and ``sim.flows`` as an attribute works the same way. No
file stands at an old path; new code imports the new names.

[Note: imports without the cyclic GC]
Importing the simulator imports torch: about 1 s of a ``timeshare sim run``,
of which the cyclic garbage collector, walking the tens of thousands of
objects the imports create again and again, took about a tenth (issue 18).
Imports make almost no cyclic garbage, so the collector is paused while the
modules below load and switched back on after (if it was on): no object is
kept or freed differently, only later.
"""
import gc as _gc
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys

#: old module name -> the module it is now (the one table of moved paths; see the note above)
MOVED: dict[str, str] = {
    "sim.engine": "sim.kernel.engine",
    "sim.errors": "sim.kernel.errors",
    "sim.schemas": "sim.presets.schemas",
    "sim.model_protocols": "sim.models.model_protocols",
    "sim.allocator": "sim.models.allocator",
    "sim.topology": "sim.models.topology",
    "sim.flows": "sim.models.flows",
    "sim.collectives": "sim.models.collectives",
    "sim.memory": "sim.models.memory",
    "sim.faults": "sim.models.faults",
    "sim.scenario": "sim.scenarios.scenario",
    "sim.scenario_files": "sim.scenarios.scenario_files",
    "sim.scenario_io": "sim.scenarios.scenario_io",
    "sim.runner": "sim.scenarios.runner",
    "sim.result": "sim.scenarios.result",
    "sim.trace": "sim.scenarios.trace",
    "sim.compare": "sim.scenarios.compare",
    "sim.fold": "sim.scenarios.fold",
    "sim.scale": "sim.scenarios.scale",
    "sim.records": "sim.calibrate.records",
    "sim.fit": "sim.calibrate.fit",
    "sim.fit_window": "sim.calibrate.fit_window",
    "sim.calibration": "sim.calibrate.calibration",
    "sim.destroy_walks": "sim.calibrate.destroy_walks",
    "sim.switch_window": "sim.calibrate.switch_window",
    "sim.colocated": "sim.calibrate.colocated",
    "sim.plan": "sim.planner.plan",
    "sim.plan_model": "sim.planner.plan_model",
    "sim.plan_rank": "sim.planner.plan_rank",
    "sim.plan_claims": "sim.planner.plan_claims",
    "sim.cli": "sim.commands.simulate",
    "sim.plan_cli": "sim.commands.plan",
}


class _MovedFinder(_abc.MetaPathFinder, _abc.Loader):
    """Finds an old module name of :data:`MOVED` and loads it as the module of its new name."""

    def find_spec(self, fullname, path=None, target=None):
        """A spec for an old name (None for any other name, which the other finders look up)."""
        if fullname not in MOVED:
            return None
        return _util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        """The module of the new name itself (imported now if it was not), so both names are one object."""
        module = _importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        """Nothing to run (the new module ran already); give it back the spec of its own name."""
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname):
        """The new module's code, for ``python -m`` with an old name."""
        new = MOVED[fullname]
        return _util.find_spec(new).loader.get_code(new)


if not any(isinstance(f, _MovedFinder) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedFinder())


def __getattr__(name: str):
    """``sim.flows`` and the like: an old module name as an attribute of the package."""
    if f"sim.{name}" in MOVED:
        return _importlib.import_module(f"sim.{name}")
    raise AttributeError(f"module 'sim' has no attribute {name!r}")


_gc_was_enabled = _gc.isenabled()
_gc.disable()
try:
    from sim.kernel.engine import (
        Chooser, Engine, FifoChooser, HypothesisChooser, Process, ProcessState, RandomChooser, SimFuture,
    )
    from sim.kernel.errors import (
        CollectiveMismatchError, DeadlockError, RankCrashedError, RankFailedError, RankHungError, SimError,
        SimOutOfMemoryError, SimUsageError,
    )
    from sim.models.model_protocols import (
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
