"""Large scenario runs: a size limit, a cost estimate and budget, progress, and symmetry folding.

    from sim.scenarios.scale import run_auto
    result, world, plan, how = run_auto(scn)              # folds when it can, else simulates every rank
    est = estimate(scn); est.check(max_seconds=600, max_gb=8)  # raises BudgetError past the budget

:func:`estimate` predicts a run's CPU time and peak memory from what it will
simulate (:class:`RunSize`): the ranks that really run (all of them, or a socket's or a few
nodes' worth when :func:`sim.scenarios.fold.plan_fold` folds the job), the tensors each holds
and the groups its lifecycle manages, the members of those groups, the ranks of the whole job
(its result) and whether the result is written as JSON. The constants are fitted on whole CLI
runs on the shared 2-core development machine and checked on others (``bench/sim_scale_bench.py
--fit``; see ``docs/sim.md``, "Cluster scale"): the peak memory within 30 % (11 % at most on the
check runs). ``timeshare sim run`` prints the estimate before a large run and refuses one past
``--max-est-seconds`` / ``--max-est-gb`` unless given ``--force``.
"""
from __future__ import annotations

import atexit
import gc
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator

from sim.kernel.errors import SimError

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.faults import FaultPlan
    from sim.scenarios.result import ScenarioResult
    from sim.scenarios.scenario import Scenario
    from sim.world import SimWorld

log = logging.getLogger(__name__)

#: the largest world the simulator accepts: 8x a 16,384-rank job (larger ones are refused
#: before the topology, which grows with the nodes, is built)
MAX_RANKS = 131_072

# Run-cost estimate (see the module docstring and [Note: what a run's cost grows with]). Each constant is the cost of
# one unit of one term of RunSize.terms(), fitted (non-negative least squares on relative error) by
# `python bench/sim_scale_bench.py --fit ... --check ...` on whole `timeshare sim run` processes (CPU seconds and peak
# RSS from os.wait4): the runs of bench/results/2026-12-04-cpu-sim-scale-lifecycle/estimate-fit-*.json, checked on
# those of estimate-check-*.json (other sizes; the fit and both sets' errors in estimate-fit.json, the README there
# lists them). Wall time on a loaded machine is higher; on an idle one it is about the CPU time.
SECONDS: dict[str, float] = {
    "base": 1.37,  # interpreter and imports (torch about 1 s of it), parsing, planning the fold
    "simulated_rank": 0.00136,  # a simulated rank's fixed work (its groups, phases, flows)
    "tensor": 4.64e-05,  # protocol code per simulated rank and tensor (store collect/pack/copy, allocator)
    "known_group_step": 2.54e-05,  # per simulated rank, lifecycle group and step (the lifecycle's walks, votes)
    "world_rank": 3.22e-06,  # per rank of the job: its result entry, the world's and control group's tables
    "group_member": 3.01e-06,  # per member of a lifecycle group (its rank tuple and position table, made once)
    "json_rank": 3.3e-05,  # per rank of the result written as JSON (--out)
}
GB: dict[str, float] = {
    "base": 0.248,
    "simulated_rank": 5.45e-05,
    "tensor": 3.51e-06,
    "known_group": 2.58e-07,  # per simulated rank and lifecycle group: its record on the rank, the lifecycle's names
    "world_rank": 6.7e-07,
    "group_member": 2.64e-07,
    "json_rank": 7.59e-09,  # the result is streamed to the file: next to nothing
}

DEFAULT_MAX_SECONDS = 900.0
DEFAULT_MAX_GB = 8.0
#: runs estimated to take at least this long (or ANNOUNCE_GB of memory) have the CLI print the estimate
#: first; smaller ones keep stderr for errors only (refusals name the estimate in their one line anyway)
ANNOUNCE_SECONDS = 10.0
ANNOUNCE_GB = 1.0


class SizeError(SimError, ValueError):
    """A world larger than :data:`MAX_RANKS`."""


class BudgetError(SimError):
    """The estimated cost of a run is past the budget it was given."""


def check_size(world_size: Any) -> None:
    """Raise :class:`SizeError` when ``world_size`` is past :data:`MAX_RANKS` (other checks are the parser's)."""
    if isinstance(world_size, int) and not isinstance(world_size, bool) and world_size > MAX_RANKS:
        raise SizeError(
            f"world_size {world_size:,} is past the simulator's limit of {MAX_RANKS:,} ranks "
            f"(sim.scenarios.scale.MAX_RANKS); simulate a smaller job, e.g. one with the same per-node layout"
        )


@dataclass(frozen=True)
class RunSize:
    """What a run's cost grows with, known before it starts (see [Note: what a run's cost grows with])."""

    world_ranks: int
    simulated_ranks: int
    tensors_per_rank: int
    lifecycle_groups: int  # groups the lifecycle manages: every simulated rank knows, walks and votes on each
    lifecycle_members: int  # their members together, the lifecycle's control group (every rank) included
    steps: int
    writes_json: bool  # the result is written as JSON (--out, --json)

    def terms(self, kind: str) -> dict[str, float]:
        """The amount of each term of :data:`SECONDS` (``kind="seconds"``) or :data:`GB` (``"gb"``)."""
        a, n = self.simulated_ranks, self.world_ranks
        groups = a * self.lifecycle_groups * (self.steps if kind == "seconds" else 1)
        return {"base": 1.0, "simulated_rank": a, "tensor": a * self.tensors_per_rank,
                ("known_group_step" if kind == "seconds" else "known_group"): groups, "world_rank": n,
                "group_member": self.lifecycle_members, "json_rank": n if self.writes_json else 0}


def run_size(scn: "Scenario", fold: Any, *, writes_json: bool = False) -> RunSize:
    """The :class:`RunSize` of running ``scn`` (folded by ``fold``, or every rank when it is None)."""
    from sim.presets.models import build_state
    from sim.scenarios.runner import mesh_groups

    groups = mesh_groups(scn)
    managed = [f for f in groups.families if scn.pg_policy != "none" and groups.size(f) >= scn.lifecycle.min_ranks]
    members = sum(groups.count(f) * groups.size(f) for f in managed) + (scn.world_size if managed else 0)
    return RunSize(scn.world_size, fold.active if fold is not None else scn.world_size, len(build_state(scn.model)),
                   sum(groups.count(f) for f in managed), members, scn.steps, writes_json)


# [Note: what a run's cost grows with]
# A run's peak memory is the interpreter and torch; per simulated rank its fixed objects (runtime, ledgers,
# lifecycle, store) and its state's tensors (meta tensors, store and allocator entries); per simulated rank and
# group its lifecycle manages, the rank's record of the group and the lifecycle's bookkeeping (the lifecycle
# walks every group on every rank: what a job with the lifecycle over every tensor-parallel group cannot fold
# away, so a run simulating every rank holds ranks x groups of them); per member of a lifecycle group (and of the
# control group, every rank) one entry of a position table and a rank tuple, one per group (sim.groups); per rank
# of the job its result entry; and, when the result is written as JSON, the encoder's share. Its time grows the
# same way, the lifecycle's groups once per step (its walks). The constants are measured, not derived.


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of a run."""

    world_size: int
    simulated_ranks: int
    tensors_per_rank: int
    seconds: float
    gb: float
    folded: bool
    reason: str  # why it folds, or why not

    def line(self) -> str:
        """One line for the user."""
        how = (f"folded: {self.simulated_ranks:,} simulated ranks stand for all" if self.folded
               else f"every rank simulated ({self.reason})")
        return (f"estimate: {self.world_size:,} ranks, {self.tensors_per_rank:,} tensors per rank, {how}: "
                f"about {self.seconds:,.0f} s and {self.gb:.1f} GB")

    @property
    def large(self) -> bool:
        """True when the CLI should print the estimate before running."""
        return self.seconds >= ANNOUNCE_SECONDS or self.gb >= ANNOUNCE_GB

    def check(self, max_seconds: float = DEFAULT_MAX_SECONDS, max_gb: float = DEFAULT_MAX_GB) -> None:
        """Raise :class:`BudgetError` (one line) when the estimate is past either limit."""
        over = []
        if self.seconds > max_seconds:
            over.append(f"{self.seconds:,.0f} s > --max-est-seconds {max_seconds:g}")
        if self.gb > max_gb:
            over.append(f"{self.gb:.1f} GB > --max-est-gb {max_gb:g}")
        if over:
            how = "folded" if self.folded else f"every rank simulated: {self.reason}"
            raise BudgetError(
                f"refusing to run: estimated {' and '.join(over)} for {self.world_size:,} ranks, "
                f"{self.tensors_per_rank:,} tensors per rank ({how}); "
                "raise the limits or pass --force to run anyway"
            )


def estimate(scn: "Scenario", fold: Any = None, reason: str | None = None, *, writes_json: bool = False) -> Estimate:
    """The estimated wall time and peak memory of running ``scn`` (folded when ``fold`` is given); ``writes_json``:
    the result is written as JSON too (``--out``, ``--json``).

    Without ``fold`` and ``reason`` this asks :func:`sim.scenarios.fold.plan_fold`.
    """
    from sim.scenarios.fold import plan_fold

    if fold is None and reason is None:
        fold, reason = plan_fold(scn)
    size = run_size(scn, fold, writes_json=writes_json)
    seconds = sum(SECONDS[k] * v for k, v in size.terms("seconds").items())
    gb = sum(GB[k] * v for k, v in size.terms("gb").items())
    return Estimate(size.world_ranks, size.simulated_ranks, size.tensors_per_rank, seconds, gb, fold is not None,
                    reason or "")


class Progress:
    """Reports a running world's progress: a line every ``every_s`` seconds of wall time, or a bar.

    ``report(line)`` gets each line (the CLI prints it to stderr). With ``bar``, lines are not made;
    instead ``bar(done, total, label)`` is called every ``bar_every_s`` seconds with the RL phases the
    ranks have finished (:data:`sim.scenarios.result.PHASE_ORDER`, one per rank per step) against
    all of them (``steps`` per rank), the CLI's bar with the time left. Use as a context manager;
    pass :meth:`watch` as ``on_world`` to the run.
    """

    def __init__(self, report: Callable[[str], None], every_s: float = 5.0, label: str = "", *,
                 bar: Callable[[int, int, str], None] | None = None, steps: int = 1, bar_every_s: float = 0.2):
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0 seconds, got {every_s}")
        self.report, self.every_s, self.label = report, every_s, label
        self.bar, self.steps, self.bar_every_s = bar, max(int(steps), 1), bar_every_s
        self._world: "SimWorld | None" = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sim-progress", daemon=True)
        self._t0 = time.perf_counter()
        self._seen: list[int] = []  # per rank: spans already looked at
        self._phases_done = 0
        self._counting = threading.Lock()  # watch() (the run's thread) against phases() (this one's)
        self.lines = 0

    def watch(self, world: "SimWorld") -> None:
        """Follow ``world``'s engine from now on."""
        with self._counting:
            self._seen, self._phases_done = [], 0
            self._world = world

    def phases(self) -> tuple[int, int]:
        """(RL phases the ranks have finished, all of them): the bar's count and total."""
        from sim.scenarios.result import PHASE_ORDER

        with self._counting:
            w = self._world
            if w is None:
                return 0, 0
            runtimes = list(w.runtimes)
            self._seen += [0] * (len(runtimes) - len(self._seen))
            for i, rt in enumerate(runtimes):  # only the spans recorded since the last look (the list only grows)
                new = rt.spans[self._seen[i]:]
                self._seen[i] += len(new)
                self._phases_done += sum(1 for name, _s, _e in new if name in PHASE_ORDER)
            return self._phases_done, len(runtimes) * self.steps * len(PHASE_ORDER)

    def _loop(self) -> None:
        every = self.every_s if self.bar is None else min(self.every_s, self.bar_every_s)
        while not self._stop.wait(every):
            w = self._world
            if self.bar is not None:
                try:
                    done, total = self.phases()
                    self.bar(done, total, "building the world" if w is None else f"{w.engine.now:.2f} s simulated")
                except Exception:  # noqa: BLE001 - a progress bar must never stop a run or print a traceback
                    log.debug("progress bar stopped", exc_info=True)
                    return
                continue
            wall = time.perf_counter() - self._t0
            if w is None:
                line = f"{self.label}building the simulated world ({wall:.0f} s)"
            else:  # plain attribute reads of the engine thread's state: safe under the GIL
                line = (f"{self.label}simulated {w.engine.now:.3f} s, {w.engine.events_run:,} events run, "
                        f"{len(w.runtimes):,} ranks running ({wall:.0f} s wall)")
            self.lines += 1
            self.report(line)

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


_exit_hook_registered = False


@contextmanager
def command_gc() -> Iterator[None]:
    """The cyclic garbage collector as a command-line run wants it (see [Note: the cyclic GC of a command]).

    Paused while the block runs (switched back on after, if it was on); and, from the first use on,
    the objects alive when the interpreter exits are frozen (``gc.freeze``) instead of walked.
    """
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(gc.freeze)
        _exit_hook_registered = True
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# [Note: the cyclic GC of a command]
# A 1,024-rank `timeshare sim run` spends about 2.5 s of CPU, and the cyclic collector took a
# noticeable share of it outside the run itself (which already pauses it, [Note: no cyclic GC during
# a run] in sim/scenarios/runner.py): walking torch's and the world's objects again and again while the
# topology, the expanded result and its JSON are built, and once more at interpreter exit, where
# Python collects before freeing the modules (about 0.3 s of CPU for torch's objects alone; measured
# with `python -c "import torch"` against `python -c "import gc, torch; gc.freeze()"`). A command
# makes almost no cyclic garbage, so pausing the collector changes no result, only when memory of a
# rare cycle is returned. Freezing at exit (an `atexit` hook: it runs before the interpreter tears
# down its modules) leaves the objects still alive then to the operating system, which takes the
# whole process back anyway; output files are closed by then (the CLI writes them with
# Path.write_text) and the standard streams are flushed by the interpreter whatever the collector does.


@dataclass(frozen=True)
class HowRun:
    """How :func:`run_auto` ran a scenario."""

    folded: bool
    simulated_ranks: int
    reason: str


def run_auto(scn: "Scenario", *, fold: bool = True, on_world: Callable[[Any], None] | None = None,
             planned: tuple[Any, str] | None = None, check_full: Callable[[Estimate], None] | None = None,
             writes_json: bool = False) -> tuple["ScenarioResult", "SimWorld", "FaultPlan | None", HowRun]:
    """Run ``scn``, folded by symmetry when :func:`sim.scenarios.fold.plan_fold` allows it and ``fold`` is True.

    ``planned``: ``plan_fold(scn)``'s answer if the caller already has it.
    ``check_full(estimate)``: called before falling back from a folded run to
    the full one (which may cost far more); it may raise :class:`BudgetError`
    (``writes_json``: that estimate counts the result written as JSON).

    The result is the same either way (``tests/sim/scenarios/test_fold.py``); the
    returned world holds only the simulated ranks when folded. A folded run
    that meets something the fold does not cover falls back to the full run.
    """
    from sim.scenarios.fold import FoldBroken, plan_fold
    from sim.scenarios.fold_run import run_folded
    from sim.scenarios.runner import run_scenario

    check_size(scn.world_size)
    if not fold:
        plan, reason = None, "folding turned off"
    else:
        plan, reason = planned if planned is not None else plan_fold(scn)
    if plan is not None:
        try:
            result, world, faults = run_folded(scn, plan, on_world=on_world)
            return result, world, faults, HowRun(True, plan.active, reason)
        except FoldBroken as exc:
            log.warning("%s: folded run abandoned (%s); simulating every rank", scn.name, exc)
            reason = f"fold abandoned: {exc}"
            if check_full is not None:
                check_full(estimate(scn, None, reason, writes_json=writes_json))
    result, world, faults = run_scenario(scn, on_world=on_world)
    return result, world, faults, HowRun(False, scn.world_size, reason)


__all__ = ["ANNOUNCE_GB", "ANNOUNCE_SECONDS", "BudgetError", "DEFAULT_MAX_GB", "DEFAULT_MAX_SECONDS", "Estimate", "GB",
           "HowRun", "MAX_RANKS", "Progress", "RunSize", "SECONDS", "SizeError", "check_size", "command_gc", "estimate",
           "run_auto", "run_size"]
