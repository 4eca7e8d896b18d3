"""Errors the simulator raises about the simulated job itself.

Errors a *rank* sees through the runtime seam (``GroupError``,
``CollectiveTimeoutError``, ``PinningError`` ...) live in
:mod:`refimpl.runtime.base`. The ones here describe the whole simulated job:
a rank failed (:class:`RankFailedError`), the job deadlocked
(:class:`DeadlockError`), ranks issued collectives that do not match
(:class:`CollectiveMismatchError`), or a simulated GPU ran out of memory
(:class:`SimOutOfMemoryError`).
"""
from __future__ import annotations

import torch


class SimError(Exception):
    """Base class of simulator errors."""


_TorchOOM = getattr(torch, "OutOfMemoryError", RuntimeError)


class SimOutOfMemoryError(SimError, _TorchOOM):
    """A simulated device allocation did not fit into the GPU's capacity.

    It is also a ``torch.OutOfMemoryError``, so protocol code that handles a real
    CUDA OOM handles the simulated one the same way.
    """

    def __init__(self, rank: int, requested: int, free: int, total: int, tag: str = "", holders: str = ""):
        self.rank = rank
        self.requested = requested
        self.free = free
        self.total = total
        self.tag = tag
        msg = (
            f"rank {rank}: simulated GPU out of memory allocating {requested:,} bytes"
            f"{f' for {tag!r}' if tag else ''}; {free:,} of {total:,} bytes free"
        )
        if holders:
            msg += f"; largest holders: {holders}"
        msg += ". Offload or release state first, or give the simulated memory a larger capacity."
        super().__init__(msg)


class RankCrashedError(SimError):
    """Stands for a rank whose process was killed by an injected crash fault."""

    def __init__(self, rank: int, where: str):
        self.rank = rank
        self.where = where
        super().__init__(f"rank {rank} crashed (injected fault) {where}")


class RankHungError(SimError):
    """Stands for a rank that hangs forever because of an injected hang fault."""

    def __init__(self, rank: int, where: str):
        self.rank = rank
        self.where = where
        super().__init__(f"rank {rank} hung (injected fault) {where} and never returned")


class RankFailedError(SimError):
    """A simulated rank ended with an exception; ``__cause__`` is the original.

    Raised by :meth:`sim.SimWorld.run` for the first rank (in simulated time)
    that failed, unless ``return_exceptions=True``.
    """

    def __init__(self, rank: int, exc: BaseException):
        self.rank = rank
        self.exc = exc
        super().__init__(f"rank {rank} failed: {type(exc).__name__}: {exc}")


class DeadlockError(SimError):
    """No event is pending but ranks are still blocked.

    Attributes:
        blocked: global rank -> the operation it is blocked in (e.g.
            ``"all_reduce on group 'tp0' seq 3"``), or the injected hang.
        cycle: the waits-for cycle as a list of ranks (``[0, 1]`` means 0 waits
            for 1 and 1 waits for 0); empty when the waits end at ranks that
            finished, crashed or hung instead.
        absent: ranks that blocked ranks wait for but that will never arrive
            (finished, failed or crashed), with their last operation.
        time: the simulated time at which the ranks blocked (the last of them
            to start waiting; nothing moved after it).
        stopped_at: the simulated time at which the engine ran out of events
            (later than ``time`` when timers of ranks that were not blocked,
            or of an injected hang, ran on).
    """

    def __init__(
        self,
        message: str,
        *,
        blocked: dict[int, str],
        cycle: list[int],
        absent: dict[int, str],
        time: float,
        stopped_at: float | None = None,
    ):
        self.blocked = blocked
        self.cycle = cycle
        self.absent = absent
        self.time = time
        self.stopped_at = time if stopped_at is None else stopped_at
        super().__init__(message)


class CollectiveMismatchError(SimError):
    """Members of a group issued different collectives at the same sequence number.

    Attributes: ``group``, ``generation``, ``seq``, and ``ops`` (global rank ->
    description of the collective that rank issued there).
    """

    def __init__(self, group: str, generation: int, seq: int, ops: dict[int, str]):
        self.group = group
        self.generation = generation
        self.seq = seq
        self.ops = dict(ops)
        listing = "; ".join(f"rank {r}: {op}" for r, op in sorted(self.ops.items()))
        super().__init__(
            f"collective mismatch on group {group!r} (generation {generation}) at seq {seq}: {listing}. "
            "Every member must issue the same collective (op, dtype, size, src) in the same order."
        )


class SimUsageError(SimError):
    """The simulator was used wrongly (bad argument, awaiting a foreign awaitable ...)."""


__all__ = [
    "CollectiveMismatchError",
    "DeadlockError",
    "RankCrashedError",
    "RankFailedError",
    "RankHungError",
    "SimError",
    "SimOutOfMemoryError",
    "SimUsageError",
]
