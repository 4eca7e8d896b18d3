"""Large scenario runs: a size limit, a cost estimate and budget, progress, and symmetry folding.

    from sim.scenarios.scale import run_auto
    result, world, plan, how = run_auto(scn)              # folds when it can, else simulates every rank
    est = estimate(scn); est.check(max_seconds=600, max_gb=8)  # raises BudgetError past the budget

:func:`estimate` predicts a run's wall time and peak memory from what it will
simulate: the ranks that really run (all of them, or a socket's or a few nodes' worth when
:func:`sim.scenarios.fold.plan_fold` folds the job) times the tensors each holds, plus a
cost per rank of the whole world (topology, groups, ledgers, the expanded
result). The constants come from measurements on the shared 2-core
development machine (``bench/sim_scale_bench.py``; see ``docs/sim.md``,
"Cluster scale"); they are meant to be right within a factor of two, which
is what a budget needs. ``timeshare sim run`` prints the estimate before a large run
and refuses one past ``--max-est-seconds`` / ``--max-est-gb`` unless given
``--force``.
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

# Run-cost estimate (see the module docstring). CPU seconds and peak RSS of whole `timeshare sim run`
# processes, bench/results/2026-11-30-cpu-sim-scale-growth.json: full runs at 256 and 1,024 ranks
# (17.1 s / 1.70 GB, 55.9 s / 5.65 GB) give the per-tensor figures; folded runs (8 simulated ranks)
# at 1k-16k ranks, bench/results/2026-11-30-cpu-sim-scale-growth-sockets.json (2.25 s / 0.36 GB to
# 6.0 s / 0.65 GB on the shared machine), the base and per-world-rank ones. Wall time on a loaded
# machine is higher; on an idle one it is about the CPU time (the simulator is single-threaded).
BASE_S = 1.5  # interpreter and imports (torch about 1 s of it), parsing, planning the fold, the result JSON
BASE_GB = 0.30
PER_TENSOR_S = 36e-6  # protocol code per simulated rank and tensor (store collect/pack/copy, allocator)
PER_TENSOR_GB = 3.6e3 / 1e9  # meta tensors, store and ledger entries per simulated rank and tensor
PER_SIM_RANK_S = 2e-3  # a simulated rank's fixed work (groups, phases, flows)
PER_SIM_RANK_GB = 50e3 / 1e9
PER_WORLD_RANK_S = 0.25e-3  # topology, runtimes, ledgers, judging and writing one rank of the result
PER_WORLD_RANK_GB = 19e3 / 1e9

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


def estimate(scn: "Scenario", fold: Any = None, reason: str | None = None) -> Estimate:
    """The estimated wall time and peak memory of running ``scn`` (folded when ``fold`` is given).

    Without ``fold`` and ``reason`` this asks :func:`sim.scenarios.fold.plan_fold`.
    """
    from sim.scenarios.fold import plan_fold
    from sim.presets.models import build_state

    if fold is None and reason is None:
        fold, reason = plan_fold(scn)
    tensors = len(build_state(scn.model))
    sim_ranks = fold.active if fold is not None else scn.world_size
    n = scn.world_size
    seconds = (BASE_S + sim_ranks * (PER_SIM_RANK_S + tensors * PER_TENSOR_S) + n * PER_WORLD_RANK_S)
    gb = BASE_GB + sim_ranks * (PER_SIM_RANK_GB + tensors * PER_TENSOR_GB) + n * PER_WORLD_RANK_GB
    return Estimate(n, sim_ranks, tensors, seconds, gb, fold is not None, reason or "")


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
             ) -> tuple["ScenarioResult", "SimWorld", "FaultPlan | None", HowRun]:
    """Run ``scn``, folded by symmetry when :func:`sim.scenarios.fold.plan_fold` allows it and ``fold`` is True.

    ``planned``: ``plan_fold(scn)``'s answer if the caller already has it.
    ``check_full(estimate)``: called before falling back from a folded run to
    the full one (which may cost far more); it may raise :class:`BudgetError`.

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
                check_full(estimate(scn, None, reason))
    result, world, faults = run_scenario(scn, on_world=on_world)
    return result, world, faults, HowRun(False, scn.world_size, reason)


__all__ = ["ANNOUNCE_GB", "ANNOUNCE_SECONDS", "BudgetError", "DEFAULT_MAX_GB", "DEFAULT_MAX_SECONDS", "Estimate",
           "HowRun", "MAX_RANKS", "Progress", "SizeError", "check_size", "command_gc", "estimate", "run_auto"]
