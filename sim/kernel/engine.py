"""The discrete-event kernel: a heap of timed callbacks and coroutine processes.

Theory of operation
-------------------
Events sit in a heap ordered by ``(time, priority, sequence)``; ``sequence``
is a counter, so events scheduled earlier run earlier among equals and no two
events ever compare equal. :meth:`Engine.step` pops the first event, moves
:attr:`Engine.now` to its time and calls its callback. There is no wall clock.

A *chooser* may pick a different event among those ready at the same
``(time, priority)``: the default runs them in sequence order (FIFO);
:class:`HypothesisChooser` draws the index so Hypothesis explores, and
shrinks toward index 0 = FIFO, the interleavings a real job could show.

A *process* is a Python coroutine (``async def``). The engine drives it with
``send()``; it suspends by awaiting a :class:`SimFuture`, and when the future
is resolved or failed the process is resumed by an event at the current
time, so the chooser can interleave it with other ready processes. Awaiting
anything else is an error (protocol code must only await runtime operations).

Determinism: given the same scheduling calls and chooser draws the engine
does the same thing. Nothing here orders by ``id()``, object hashes, set
iteration or time of day; :attr:`Engine.trace` records what happened and
:meth:`Engine.trace_bytes` serialises it for comparison.
"""
from __future__ import annotations

import enum
import heapq
import logging
import random
from typing import Any, Callable, Coroutine, Generator, Protocol

from refimpl.runtime.base import Completion
from sim.kernel.errors import SimUsageError

log = logging.getLogger(__name__)

#: priorities: lower runs first among events at the same time
PRIORITY_URGENT = -1
PRIORITY_NORMAL = 0
PRIORITY_LATE = 1  # timeouts: a completion due at the same instant wins


class Event:
    """A scheduled callback; :meth:`cancel` turns it into a no-op."""

    __slots__ = ("time", "priority", "seq", "callback", "args")

    def __init__(self, time: float, priority: int, seq: int, callback: Callable[..., Any] | None, args: tuple):
        self.time = time
        self.priority = priority
        self.seq = seq
        self.callback = callback
        self.args = args

    def cancel(self) -> None:
        """Drop the event; the engine skips it without moving the clock."""
        self.callback = None
        self.args = ()


class Chooser(Protocol):
    """Picks which of ``n`` events ready at the same instant runs next (0 = FIFO)."""

    def choose(self, n: int) -> int:
        """Return the index in ``[0, n)`` of the event to run next among ``n >= 2`` events due at the same time and
        priority, in scheduling order (0 = the earliest scheduled). The others stay queued; an index out of range is a
        :class:`SimUsageError`."""


class FifoChooser:
    """Runs simultaneous events in the order they were scheduled."""

    def choose(self, n: int) -> int:
        """Always 0: the earliest scheduled of the tied events."""
        return 0


class RandomChooser:
    """Picks among simultaneous events with a seeded ``random.Random``."""

    def __init__(self, seed: int = 0):
        self._rng = random.Random(seed)

    def choose(self, n: int) -> int:
        """A seeded uniform draw from ``[0, n)``."""
        return self._rng.randrange(n)


class HypothesisChooser:
    """Draws the choice from a Hypothesis ``data`` object (``st.data()``).

    Shrinking minimises the drawn integers, i.e. moves toward FIFO, so a failing
    schedule shrinks to the fewest departures from the default order.
    ``max_choices`` bounds how many draws one run makes (later ties run FIFO).
    """

    def __init__(self, data: Any, max_choices: int = 10_000):
        from hypothesis import strategies as st  # imported here: only tests need Hypothesis

        self._data = data
        self._st = st
        self._left = max_choices
        self.draws = 0

    def choose(self, n: int) -> int:
        """An integer in ``[0, n)`` drawn from the Hypothesis data; 0 (FIFO), with nothing drawn, once ``max_choices``
        draws were made. Counts draws in :attr:`draws`."""
        if self._left <= 0:
            return 0
        self._left -= 1
        self.draws += 1
        return self._data.draw(self._st.integers(0, n - 1))


class SimFuture(Completion):
    """A value that becomes available at some simulated time.

    ``resolve(value)`` or ``fail(exc)`` it once; ``await future`` in a process
    suspends the process until then and returns the value or raises the
    exception at the await. ``label`` and ``blocker`` describe what a process
    waiting on it is blocked in (used by deadlock reports).
    """

    __slots__ = ("_done", "_value", "_exc", "_callbacks", "label", "blocker")

    def __init__(self, label: str = "", blocker: Any = None):
        self._done = False
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[["SimFuture"], None]] | None = None
        self.label = label
        self.blocker = blocker

    def done(self) -> bool:
        """True once resolved or failed (never blocks)."""
        return self._done

    def resolve(self, value: Any = None) -> None:
        """Complete the future with ``value``; a second completion is ignored."""
        if self._done:
            return
        self._done = True
        self._value = value
        self._fire()

    def fail(self, exc: BaseException) -> None:
        """Complete the future with an exception; a second completion is ignored."""
        if self._done:
            return
        self._done = True
        self._exc = exc
        self._fire()

    def _fire(self) -> None:
        cbs = self._callbacks
        if cbs:
            self._callbacks = None
            for cb in cbs:
                cb(self)

    def add_callback(self, cb: Callable[["SimFuture"], None]) -> None:
        """Call ``cb(future)`` on completion (at once if already complete)."""
        if self._done:
            cb(self)
        elif self._callbacks is None:
            self._callbacks = [cb]
        else:
            self._callbacks.append(cb)

    def result(self) -> Any:
        """The value, or raise the exception; raises SimUsageError if not complete."""
        if not self._done:
            raise SimUsageError(f"future {self.label!r} is not complete yet; await it first")
        if self._exc is not None:
            raise self._exc
        return self._value

    def __await__(self) -> Generator[Any, None, Any]:
        if not self._done:
            yield self
        return self.result()

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("failed" if self._exc is not None else "done")
        return f"<SimFuture {self.label!r} {state}>"


class Timeout:
    """Awaited by a process to let ``delay`` simulated seconds pass (one event, no future)."""

    __slots__ = ("delay",)

    def __init__(self, delay: float):
        self.delay = delay

    def __await__(self) -> Generator[Any, None, None]:
        yield self


class Crash:
    """Awaited by a rank that an injected fault kills; its process stops for good."""

    __slots__ = ("where",)

    def __init__(self, where: str):
        self.where = where

    def __await__(self) -> Generator[Any, None, None]:
        yield self
        raise AssertionError("a crashed process was resumed")  # pragma: no cover


class ProcessState(enum.Enum):
    """Life of a process."""

    READY = "ready"  # scheduled to run
    WAITING = "waiting"  # suspended on a SimFuture
    FINISHED = "finished"
    FAILED = "failed"  # ended with an exception
    CRASHED = "crashed"  # killed by an injected crash


class Process:
    """A coroutine the engine drives; see the module docstring."""

    __slots__ = ("engine", "name", "state", "result", "exception", "waiting_on", "waiting_since", "ended_at",
                 "crash_where", "_coro")

    def __init__(self, engine: "Engine", coro: Coroutine[Any, Any, Any], name: str):
        if not hasattr(coro, "send"):
            raise SimUsageError(
                f"process {name!r}: expected a coroutine (call your async function), got {type(coro).__name__}"
            )
        self.engine = engine
        self.name = name
        self.state = ProcessState.READY
        self.result: Any = None
        self.exception: BaseException | None = None
        self.waiting_on: SimFuture | None = None
        #: simulated time at which the process last started waiting on a future (deadlock reports)
        self.waiting_since: float | None = None
        self.ended_at: float | None = None
        self.crash_where = ""
        self._coro = coro
        engine.schedule(0.0, self._step)

    @property
    def alive(self) -> bool:
        """True while the process is READY or WAITING (it has not finished, failed or crashed)."""
        return self.state in (ProcessState.READY, ProcessState.WAITING)

    def abandon(self) -> None:
        """Close the coroutine of a process the engine will not run again (the world stopped).

        Its ``finally`` blocks run now; whatever they raise or await is dropped.
        """
        if self._coro is None:
            return
        coro, self._coro = self._coro, None  # type: ignore[assignment]
        try:
            coro.close()
        except (RuntimeError, SimUsageError, Exception) as exc:  # noqa: BLE001 - the world is already broken
            log.debug("process %s: error while closing after the world stopped: %r", self.name, exc)

    def _wake(self, _fut: SimFuture) -> None:
        self.state = ProcessState.READY
        self.engine.schedule(0.0, self._step)

    def _step(self) -> None:
        if self._coro is None:  # abandoned
            return
        self.waiting_on = None
        try:
            yielded = self._coro.send(None)
        except StopIteration as stop:
            self._end(ProcessState.FINISHED, result=stop.value)
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - the process's failure is its result
            self._end(ProcessState.FAILED, exc=exc)
            return
        if type(yielded) is Timeout:
            self.state = ProcessState.READY
            self.engine.schedule(yielded.delay, self._step)
        elif type(yielded) is SimFuture or isinstance(yielded, SimFuture):
            if yielded._done:
                self.engine.schedule(0.0, self._step)
            else:
                self.state = ProcessState.WAITING
                self.waiting_on = yielded
                self.waiting_since = self.engine.now
                yielded.add_callback(self._wake)
        elif isinstance(yielded, Crash):
            self.crash_where = yielded.where
            self._end(ProcessState.CRASHED)
        else:
            err = SimUsageError(
                f"process {self.name!r} awaited {yielded!r}, which is not a simulator operation; protocol "
                "code may only await Runtime operations (no asyncio, no threads)"
            )
            self._coro.close()
            self._end(ProcessState.FAILED, exc=err)

    def _end(self, state: ProcessState, result: Any = None, exc: BaseException | None = None) -> None:
        self.state = state
        self.result = result
        self.exception = exc
        self.ended_at = self.engine.now
        self.engine.record(self.engine.now, self.name, state.value)
        if state is ProcessState.CRASHED:
            # A killed process runs no more code: keep the coroutine from being
            # closed (which would run its ``finally`` blocks) while the engine lives.
            self.engine._graveyard.append(self._coro)
        self._coro = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Process {self.name} {self.state.value}>"


class Engine:
    """The event heap, the clock and the processes. See the module docstring."""

    def __init__(self, chooser: Chooser | None = None, *, trace: bool = True):
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self._chooser = None if isinstance(chooser, FifoChooser) else chooser
        self._stop_exc: BaseException | None = None
        self._stopped = False
        self._graveyard: list[Any] = []
        self.tracing = trace
        self.trace: list[tuple] = []
        self.events_run = 0

    # ---- scheduling -----------------------------------------------------------

    def schedule(self, delay: float, callback: Callable[..., Any], *args: Any, priority: int = PRIORITY_NORMAL) -> Event:
        """Run ``callback(*args)`` ``delay`` simulated seconds from now."""
        if not delay >= 0.0:  # also rejects NaN
            raise SimUsageError(f"cannot schedule {delay} s into the past (or NaN); delays must be >= 0")
        seq = self._seq
        self._seq = seq + 1
        t = self.now + delay
        ev = Event(t, priority, seq, callback, args)
        heapq.heappush(self._heap, (t, priority, seq, ev))
        return ev

    def process(self, coro: Coroutine[Any, Any, Any], name: str) -> Process:
        """Start driving ``coro`` as a process (its first step runs at the current time)."""
        return Process(self, coro, name)

    def sleep(self, seconds: float) -> Timeout:
        """Awaitable (inside a process) that lets ``seconds`` pass."""
        if not seconds >= 0.0:
            raise SimUsageError(f"cannot sleep {seconds} s; sleeps must be >= 0")
        return Timeout(seconds)

    def timer(self, seconds: float, label: str = "") -> SimFuture:
        """A future resolved ``seconds`` from now (for code outside processes)."""
        fut = SimFuture(label or f"timer {seconds}")
        self.schedule(seconds, fut.resolve, None)
        return fut

    def stop(self, exc: BaseException | None = None) -> None:
        """Stop :meth:`run` after the current event; ``exc`` is raised from it."""
        self._stopped = True
        if exc is not None and self._stop_exc is None:
            self._stop_exc = exc

    # ---- tracing --------------------------------------------------------------

    def record(self, *entry: Any) -> None:
        """Append ``entry`` to the trace (if tracing); entries must be plain values."""
        if self.tracing:
            self.trace.append(entry)

    def trace_bytes(self) -> bytes:
        """The trace serialised one entry per line (floats by ``repr``, exact)."""
        return "\n".join(map(repr, self.trace)).encode()

    # ---- running --------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events in the heap, cancelled ones included."""
        return len(self._heap)

    def _pop(self) -> Event | None:
        heap = self._heap
        while heap:
            ev = heapq.heappop(heap)[3]
            if ev.callback is None:
                continue
            if self._chooser is None or not heap:
                return ev
            # gather the other live events at the same (time, priority)
            ties = [ev]
            while heap and heap[0][0] == ev.time and heap[0][1] == ev.priority:
                other = heapq.heappop(heap)[3]
                if other.callback is not None:
                    ties.append(other)
            if len(ties) == 1:
                return ev
            i = self._chooser.choose(len(ties))
            if not 0 <= i < len(ties):
                raise SimUsageError(f"chooser returned {i} for {len(ties)} ready events")
            chosen = ties.pop(i)
            for other in ties:
                heapq.heappush(heap, (other.time, other.priority, other.seq, other))
            return chosen
        return None

    def step(self) -> bool:
        """Run one event; False when none is left."""
        ev = self._pop()
        if ev is None:
            return False
        self.now = ev.time
        self.events_run += 1
        ev.callback(*ev.args)
        return True

    def run(self, until: float | None = None) -> None:
        """Run events until none is left, :meth:`stop` is called, or the clock would pass ``until``."""
        self._stopped = False
        heap = self._heap
        while not self._stopped:
            if until is not None:
                while heap and heap[0][3].callback is None:
                    heapq.heappop(heap)
                if not heap or heap[0][0] > until:
                    self.now = max(self.now, until)
                    break
            ev = self._pop()
            if ev is None:
                break
            self.now = ev.time
            self.events_run += 1
            ev.callback(*ev.args)
        if self._stop_exc is not None:
            exc, self._stop_exc = self._stop_exc, None
            raise exc


__all__ = [
    "PRIORITY_LATE",
    "PRIORITY_NORMAL",
    "PRIORITY_URGENT",
    "Chooser",
    "Crash",
    "Engine",
    "Event",
    "FifoChooser",
    "HypothesisChooser",
    "Process",
    "ProcessState",
    "RandomChooser",
    "SimFuture",
    "Timeout",
]
