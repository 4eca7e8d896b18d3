"""Python's cyclic collector in the RL step: its survivors of the setup frozen, and every long collection timed.

[Note: the collector in the switch]
A full (generation 2) collection walks every object the collector tracks and
holds the GIL from its start to its end: no other thread of the process runs
Python meanwhile (the copy pacer's feeder, the resume ahead), and the thread
that triggered it launches nothing. With ``transformers`` and a 1 B model
loaded the process tracks about 350,000 objects, and one full collection took
147-167 ms on the 2-core development machine (``python -m bench.gc_pause``:
166.5 ms for 348,222 objects). The store pauses the collector inside its offload and
reload (``gc_paused``), which only defers it: the counts go on growing, and a
collection due then runs at the first allocation after, in the training step
that follows the switch. In a profiled switch on one H200 (2026-12-06) the
reload's copies and both host threads stood still for 270 ms with no CUDA call
traced: what such a pause looks like (not confirmed: the trace does not
record the collector; :class:`GcWatch` now does).

So the RL step freezes what its setup left (``gc.freeze()`` after one
collection, ``StepConfig.gc_freeze``, on by default): the frozen objects are never walked again, and a
full collection walks only what the steps made (0.00 ms on the same machine
right after the freeze). :class:`GcWatch` times every collection of the steps
(``gc.callbacks``), so a record says whether one landed in a switch.
"""
from __future__ import annotations

import gc
import time
from typing import Any

#: collections at least this long are listed one by one in the record (seconds); shorter ones only counted
LISTED_S = 0.001


def freeze_setup() -> int:
    """Collect once, then freeze every object tracked now (``gc.freeze``); returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcWatch:
    """Times every collection of the cyclic collector from :meth:`start` to :meth:`stop` (``gc.callbacks``), on the
    clock whose zero is ``t0`` (``time.perf_counter()``)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._began: float | None = None
        self._listed: list[dict[str, Any]] = []
        self._counts = [0, 0, 0]
        self._seconds = [0.0, 0.0, 0.0]
        self._on = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._began = now
            return
        if self._began is None:
            return
        began, self._began = self._began, None
        gen, took = int(info.get("generation", 0)), now - began
        self._counts[gen] += 1
        self._seconds[gen] += took
        if took >= LISTED_S or gen == 2:
            self._listed.append({"generation": gen, "at_s": began - self.t0, "s": took,
                                 "collected": int(info.get("collected", 0))})

    def start(self) -> "GcWatch":
        """Begin timing (idempotent)."""
        if not self._on:
            gc.callbacks.append(self._callback)
            self._on = True
        return self

    def stop(self) -> None:
        """Stop timing (idempotent)."""
        if self._on:
            gc.callbacks.remove(self._callback)
            self._on = False

    def collections(self) -> list[dict[str, Any]]:
        """Every full collection and every one of at least :data:`LISTED_S`: ``generation``, ``at_s`` (its start on
        the clock of ``t0``), ``s``, ``collected``."""
        return list(self._listed)

    def summary(self) -> dict[str, Any]:
        """Counts and seconds per generation, the longest collection."""
        return {"count": list(self._counts), "s": [round(x, 6) for x in self._seconds],
                "max_s": max((c["s"] for c in self._listed), default=0.0)}


__all__ = ["GcWatch", "LISTED_S", "freeze_setup"]
