"""Traces of a simulated job: Chrome trace JSON (opens in Perfetto) and a PNG timeline.

A :class:`Timeline` collects, after ``world.run``, what each rank did: its
phases (``rt.span(...)`` records), its copies (from the flow transport's log),
the faults that fired and, when the simulated memory records it, device memory
over time. :func:`chrome_trace` turns it into the Trace Event Format that
https://ui.perfetto.dev and ``chrome://tracing`` open: one process per rank
with a "phases" track, a "copies" track, fault markers and a device-memory
counter. :func:`write_png` draws one row per rank with matplotlib, which is
imported only there (install it with ``pip install matplotlib``).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.scenarios.result import PHASE_ORDER

if TYPE_CHECKING:  # pragma: no cover
    from sim.world import SimWorld

log = logging.getLogger(__name__)


class TraceError(RuntimeError):
    """A trace could not be written (missing optional dependency, bad path)."""


@dataclass
class RankTimeline:
    """One rank's phases, copies, faults and device-memory samples (times in seconds)."""

    rank: int
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    copies: list[tuple[str, int, float, float]] = field(default_factory=list)
    faults: list[tuple[float, str, str]] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class Timeline:
    """Per-rank timelines of one simulated job plus job-wide events (link faults)."""

    ranks: list[RankTimeline]
    events: list[tuple[float, str, str]] = field(default_factory=list)
    end: float = 0.0

    @classmethod
    def from_world(cls, world: "SimWorld", *, faults: Any = None) -> "Timeline":
        """Collect the timeline of ``world`` after a run; ``faults`` is the FaultPlan, if any."""
        ranks = [RankTimeline(rt.rank, spans=list(rt.spans)) for rt in world.runtimes]
        log_ = getattr(world.transport, "log", None)
        if log_:
            for rank, kind, nbytes, start, end in log_:
                if rank < len(ranks):
                    ranks[rank].copies.append((kind.value, nbytes, start, end))
        timeline = getattr(world.memory, "timeline", None)
        if timeline is not None:
            for r in ranks:
                r.memory = timeline(r.rank)
        events = []
        for f in getattr(faults, "fired", ()) or ():
            if f.rank is None:
                events.append((f.time, f.kind, f.where))
            elif f.rank < len(ranks):
                ranks[f.rank].faults.append((f.time, f.kind, f.where))
        return cls(ranks, events, world.engine.now)


#: the RL phases' colours, the same in every picture (colour-blind-safe palette); other spans get a colour of their own
#: name (:func:`phase_colour`), so a phase has one colour in every run whatever else the run has
PHASE_COLOURS = {"train": "#0072B2", "sleep": "#E69F00", "update_weights": "#009E73", "rollout": "#56B4E9",
                 "wake_up": "#D55E00", "offload": "#CC79A7", "reload": "#F0E442"}
_OTHER_COLOURS = ("#8C564B", "#7F7F7F", "#BCBD22", "#17BECF", "#9467BD", "#AEC7E8", "#FFBB78", "#98DF8A", "#FF9896",
                  "#C5B0D5", "#C49C94", "#F7B6D2", "#DBDB8D", "#9EDAE5")


def phase_colour(name: str) -> str:
    """The colour of a span name in every picture: fixed for the RL phases, from the name itself for the others."""
    import zlib

    return PHASE_COLOURS.get(name) or _OTHER_COLOURS[zlib.crc32(name.encode()) % len(_OTHER_COLOURS)]


def memory_changes(samples: list[tuple[float, int]]) -> list[tuple[float, int]]:
    """The samples where the value changes (the last one at each instant): a counter track holds each value once."""
    out: list[tuple[float, int]] = []
    for t, used in samples:
        if out and out[-1][0] == t:
            out.pop()
        if not out or out[-1][1] != used:
            out.append((t, used))
    if samples and out and out[-1][0] != samples[-1][0]:
        out.append(samples[-1])  # the track ends where the run's samples end
    return out


def chrome_trace(tl: Timeline) -> dict[str, Any]:
    """The Trace Event Format dict of a timeline (microsecond timestamps)."""
    us = 1e6
    ev: list[dict[str, Any]] = []
    for r in tl.ranks:
        pid = r.rank
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {r.rank}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": r.rank}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "phases"}})
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "copies"}})
        for name, start, end in sorted(r.spans, key=lambda s: (s[1], -s[2])):
            ev.append({"ph": "X", "cat": "phase", "name": name, "pid": pid, "tid": 0,
                       "ts": start * us, "dur": max(end - start, 0.0) * us})
        for kind, nbytes, start, end in r.copies:
            ev.append({"ph": "X", "cat": "copy", "name": kind, "pid": pid, "tid": 1, "ts": start * us,
                       "dur": max(end - start, 0.0) * us, "args": {"bytes": nbytes}})
        for t, kind, where in r.faults:
            ev.append({"ph": "i", "s": "p", "cat": "fault", "name": kind, "pid": pid, "tid": 0, "ts": t * us,
                       "args": {"where": where}})
        for t, used in memory_changes(r.memory):
            ev.append({"ph": "C", "name": "device memory", "pid": pid, "ts": t * us, "args": {"GiB": used / 2**30}})
    for t, kind, where in tl.events:
        ev.append({"ph": "i", "s": "g", "cat": "fault", "name": kind, "pid": 0, "tid": 0, "ts": t * us,
                   "args": {"where": where}})
    return {"traceEvents": ev, "displayTimeUnit": "ms", "otherData": {"simulated_end_s": tl.end}}


def write_chrome_trace(tl: Timeline, path: str | Path) -> Path:
    """Write the Chrome trace JSON of ``tl`` to ``path``."""
    path = Path(path)
    try:
        path.write_text(json.dumps(chrome_trace(tl)))
    except OSError as exc:
        raise TraceError(f"cannot write trace to {path}: {exc}") from exc
    return path


def _nesting(spans: list[tuple[str, float, float]]) -> list[tuple[tuple[str, float, float], int]]:
    """Each span with its depth: how many other spans of the rank enclose it."""
    out, stack = [], []
    for sp in sorted(spans, key=lambda s: (s[1], -s[2], s[0] not in PHASE_ORDER)):  # on a tie the RL phase is outer
        while stack and not (stack[-1][1] <= sp[1] and sp[2] <= stack[-1][2]):
            stack.pop()
        out.append((sp, len(stack)))
        stack.append(sp)
    return out


def write_png(tl: Timeline, path: str | Path, *, max_ranks: int = 64, title: str = "") -> Path:
    """Draw one row per rank (phases as bars, copies as thin bars, faults as marks) into a PNG.

    Shows the first ``max_ranks`` ranks (a note says how many were left out).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise TraceError(
            f"writing a PNG timeline needs matplotlib ({exc}); install it with 'pip install matplotlib' "
            "or use the Chrome trace JSON (--trace) instead"
        ) from exc
    ranks = tl.ranks[:max_ranks]
    names = sorted({s[0] for r in ranks for s in r.spans}, key=lambda n: (n not in PHASE_ORDER, PHASE_ORDER.index(n)
                                                                         if n in PHASE_ORDER else 0, n))
    color = {n: phase_colour(n) for n in names}
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.55 * len(ranks)))
    for row, r in enumerate(ranks):
        y = len(ranks) - 1 - row
        for (name, start, end), depth in _nesting(r.spans):  # outer phases tall, nested ones thin below
            height = 0.6 if depth == 0 else 0.18
            base = y - 0.4 if depth == 0 else y - 0.4 - 0.2 * min(depth, 2) + 0.02
            ax.broken_barh([(start, max(end - start, 1e-9))], (base, height), facecolors=color[name])
        if r.copies:
            ax.broken_barh([(s, max(e - s, 1e-9)) for _, _, s, e in r.copies], (y + 0.22, 0.15), facecolors="black")
        for t, _kind, _where in r.faults:
            ax.plot([t], [y], marker="x", color="red", markersize=9)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r.rank}" for r in reversed(ranks)])
    ax.set_xlabel("simulated time (s)")
    extra = f" (first {len(ranks)} of {len(tl.ranks)} ranks)" if len(tl.ranks) > len(ranks) else ""
    ax.set_title((title or "simulated timeline") + extra)
    from matplotlib.lines import Line2D

    handles = [plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in names]
    labels = list(names)
    if any(r.copies for r in ranks):  # every mark drawn is in the legend
        handles.append(plt.Rectangle((0, 0), 1, 1, color="black"))
        labels.append("host/device copy")
    if any(r.faults for r in ranks):
        handles.append(Line2D([], [], marker="x", color="red", linestyle="", markersize=9))
        labels.append("fault injected")
    if handles:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise TraceError(f"cannot write PNG to {path}: {exc}") from exc
    finally:
        plt.close(fig)
    return path


__all__ = ["PHASE_COLOURS", "RankTimeline", "Timeline", "TraceError", "chrome_trace", "memory_changes", "phase_colour",
           "write_chrome_trace", "write_png"]
