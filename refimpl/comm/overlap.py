"""The switch with the lifecycle beside the copies: walks, cooldowns and the weight sync overlap the state's moves.

Theory of operation
-------------------
A :class:`~refimpl.comm.PGLifecycle` done in sequence makes a step wait for its
pause walk (destroy or suspend) *and then* for the offload copies, for the
cooldown and rebuild *and then* for the reload copies. They use different
resources (NCCL's proxy thread and the host for the walk, a timer for the
cooldown, the copy engines for the copies), so :class:`OverlappedSwitch` runs
the memory moves on a worker thread while the lifecycle walks on the caller's:

* :meth:`OverlappedSwitch.pause`: the caller's ``release_memory`` (the store's
  offload) starts on a thread, then the lifecycle's pause runs as before; its
  ``release_memory`` step *joins* that thread, so the offload's outcome is
  agreed by every rank at the same point of the same sequence of agreements as
  in the sequential pause (a failed offload on any rank is the agreed fallback).
* :meth:`OverlappedSwitch.start`: begin any other move in the background (the
  reload of the optimizer state, started inside the weight sync once the
  parameters are back) so that the gather, the post-sync walk and the resume's
  cooldown and rebuild run while its copies do.
* :meth:`OverlappedSwitch.resume`: the lifecycle's resume, then every
  background move is joined and its success agreed (``PGLifecycle.agree``):
  one rank's failed reload raises :class:`BackgroundMoveError` on every rank.
  :meth:`OverlappedSwitch.resume` with ``join=False`` leaves them running into
  the next training step (the *streamed* mode): :meth:`join` (or the hook
  :meth:`guard_optimizer` installs) waits for them where the state is first
  needed, and agrees there; with ``background=True`` the resume itself (its
  cooldown and rebuild) runs beside the next step too, joined before anything
  else is agreed.

What keeps it correct: the background moves never run a collective on the
control group (they are the store's local copies), so the order of agreements
is the same on every rank whatever the threads do; the lifecycle's state is
checked before anything starts (a pause that would be refused starts no
offload); a failure on the caller's thread joins the background first, so the
state is in one valid place (the store's own rule) when the error propagates.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from refimpl.comm.errors import LifecycleError, LifecycleStateError
from refimpl.comm.states import PGPolicy, PGState
from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S, SWITCH_INTERVAL, check_switch_interval

log = logging.getLogger(__name__)


#: the name of a resume running in the background (:meth:`OverlappedSwitch.resume` with ``background=True``)
RESUME = "lifecycle.resume"


class BackgroundMoveError(LifecycleError):
    """A background move (an offload or reload on the worker thread) failed on this rank or on a peer."""


class Background:
    """A callable running on its own thread; :meth:`join` returns its result or raises its exception.

    ``started_at`` / ``ended_at``: ``time.perf_counter()`` when the callable began and returned or raised
    (None until then): what a record needs to place the move beside the caller's phases.
    ``switch_interval_s``: the interpreter's switch interval at most this while the thread lives (None: as it is),
    so that each of its returns from a call made without the GIL does not wait up to 5 ms for a caller running
    Python ([Note: the GIL's switch interval] in :mod:`refimpl.runtime.switch_interval`)."""

    def __init__(self, name: str, fn: Callable[[], Any], *, switch_interval_s: float | None = None) -> None:
        self.name = name
        self._fn = fn
        self._result: Any = None
        self.error: BaseException | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self._switch_interval_s = check_switch_interval("switch_interval_s", switch_interval_s)
        if self._switch_interval_s:  # before the thread starts: its first return already finds it lowered
            SWITCH_INTERVAL.lower(self._switch_interval_s)
        self._thread = threading.Thread(target=self._run, name=f"timeshare-{name}", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            if self._switch_interval_s:
                SWITCH_INTERVAL.restore()
            raise

    def _run(self) -> None:
        self.started_at = time.perf_counter()
        try:
            self._result = self._fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join on the caller's thread
            self.error = exc
            log.error("background %s failed: %r", self.name, exc)
        finally:
            self.ended_at = time.perf_counter()
            if self._switch_interval_s:
                SWITCH_INTERVAL.restore()

    def done(self) -> bool:
        """True once the callable has returned or raised."""
        return not self._thread.is_alive()

    def join(self) -> Any:
        """Wait for the callable; its result, or its exception re-raised."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self._result


class OverlappedSwitch:
    """Pause / weight sync / resume with the memory moves on a worker thread; see the module docstring.

    ``lifecycle``: a :class:`~refimpl.comm.PGLifecycle` on a runtime whose awaitables complete at once
    (TorchRuntime), driven here through its blocking facade. ``switch_interval_s``: the interpreter's switch
    interval at most this while a background move runs (default
    :data:`~refimpl.runtime.switch_interval.RESPONSIVE_SWITCH_INTERVAL_S`; None: as it is): a resume beside a
    training step returns from a call made without the GIL at each group, communicator and agreement, and each
    return waited up to 5 ms for the step's Python ([Note: the GIL's switch interval]).
    """

    def __init__(self, lifecycle: Any, *, switch_interval_s: float | None = RESPONSIVE_SWITCH_INTERVAL_S) -> None:
        self.lifecycle = lifecycle
        #: the switch interval while a background move runs (None: the interpreter's own)
        self.switch_interval_s = check_switch_interval("switch_interval_s", switch_interval_s)
        self._life = lifecycle.sync
        self._pending: list[Background] = []
        self._lock = threading.Lock()

    @property
    def state(self) -> PGState:
        """The lifecycle's state on this rank."""
        return self.lifecycle.state

    @property
    def pending(self) -> list[str]:
        """Names of the background moves not joined yet."""
        return [b.name for b in self._pending]

    def running(self, name: str) -> Background | None:
        """The background move ``name`` not joined yet (its thread, its times), or None."""
        return next((b for b in self._pending if b.name == name), None)

    def start(self, name: str, fn: Callable[[], Any]) -> Background:
        """Run ``fn`` (a local memory move: no collective on the control group) on a worker thread now."""
        bind = getattr(self.lifecycle.rt, "bind_thread", None)  # TorchRuntime: the rank's CUDA device

        def on_device() -> Any:
            if bind is not None:  # a new thread starts on device 0; the rank's may be another
                bind()
            return fn()

        with self._lock:
            bg = Background(name, on_device, switch_interval_s=self.switch_interval_s)
            self._pending.append(bg)
            return bg

    def pause(self, release_memory: Callable[[], Any], *, policy: PGPolicy | None = None,
              issued_point: str | None = None) -> PGState:
        """The lifecycle's pause with ``release_memory`` running beside its walk; its outcome agreed as before.

        ``issued_point``: a runtime point ``release_memory`` reaches once its copies are issued (the store's
        ``"store.offload.wait"``); the walk starts only then (or when it ended), so the copies are in flight
        whatever the walk holds. Needs a runtime with ``on_point`` (TorchRuntime).
        """
        if self.state not in (PGState.ACTIVE, PGState.ACTIVE_LAZY):
            raise LifecycleStateError(
                f"rank {self.lifecycle.rt.rank}: pause() needs state ACTIVE or ACTIVE_LAZY, lifecycle is "
                f"{self.state.name}; nothing was released")
        if self._pending:
            raise LifecycleStateError(f"pause() while background moves {self.pending} still run; resume() or join() "
                                      "them first")
        issued = threading.Event()
        hook = getattr(self.lifecycle.rt, "on_point", None)
        remove = hook(issued_point, issued.set) if (issued_point and hook is not None) else None
        bg = self.start("release_memory", release_memory)
        while remove is not None and not issued.wait(0.0005) and not bg.done():
            pass
        if remove is not None:
            remove()
        try:
            return self._life.pause(release_memory=lambda: self._take(bg).join(), policy=policy)
        finally:
            self._settle(bg)

    def weight_sync(self, fn: Callable[[], Any]) -> Any:
        """The lifecycle's weight sync (``fn`` may :meth:`start` a background move once what it needs is back)."""
        return self._life.weight_sync(fn)

    def resume(self, *, join: bool = True, background: bool = False) -> PGState:
        """The lifecycle's resume beside the background moves; then (``join``) wait for them and agree on them.

        ``background``: the resume itself (cooldown, rebuild or resume walk) runs on a worker thread too and is
        joined with the moves, first, before any agreement of :meth:`join` (so the control group never sees two
        threads' collectives). Use it only where the resume's own collectives cannot interleave with the
        caller's in a way that deadlocks: one rank, groups that come back by a rebuild (no canary runs), or a
        caller that runs no collective on the role's groups or the control group before it joins (the RL step
        joins in a forward pre-hook, before the first collective of the training step);
        ``join=False`` is then required (the resume is waited for where :meth:`join` is called).
        """
        if background:
            if join:
                raise ValueError("resume(background=True) needs join=False: the background resume is joined by join()")
            self.start(RESUME, self._life.resume)
            return self.state
        try:
            state = self._life.resume()
        except BaseException:
            for bg in list(self._pending):
                self._settle(bg)
            raise
        if join:
            self.join()
        return state

    def join(self, names: Any = None) -> None:
        """Wait for every background move (or those ``names`` names) and agree on their success;
        :class:`BackgroundMoveError` everywhere if any failed on any rank (the failed rank names its error; the
        state stays where the move left it). Every rank must join the same names at the same point."""
        with self._lock:  # a background resume is always joined too, first: its agreements must end before ours
            todo = [b for b in self._pending if names is None or b.name in names or b.name == RESUME]
            todo.sort(key=lambda b: b.name != RESUME)
            self._pending = [b for b in self._pending if b not in todo]
        errors = []
        for bg in todo:
            try:
                bg.join()
            except BaseException as exc:  # noqa: BLE001 - agreed below
                errors.append(f"{bg.name}: {exc!r}")
        if not self._life.agree(not errors):
            mine = "; ".join(errors) or "failed on another rank"
            raise BackgroundMoveError(
                f"rank {self.lifecycle.rt.rank}: a background move {mine}; the state stays where the move left it "
                "(a failed reload leaves it offloaded: reload again on every rank)")

    def guard_optimizer(self, optimizer: Any, names: Any = None) -> Any:
        """Make ``optimizer.step`` :meth:`join` the background moves (``names``: those only) first: a streamed
        reload of its state is waited for where the step first reads it.

        Returns the hook handle (``.remove()``). The join agrees on the control group, so every rank must
        step (they do: a training step is collective).
        """
        def pre_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
            if any(names is None or b.name in names for b in self._pending):
                self.join(names)

        return optimizer.register_step_pre_hook(pre_step)

    def guard_module(self, module: Any, names: Any = None) -> Any:
        """Make a forward of ``module`` :meth:`join` the background moves (``names``: those only) first: a
        streamed parameter reload is waited for by the forward that touches the parameters, however early.
        Returns the hook handle."""
        def pre_forward(_mod: Any, _args: Any) -> None:
            if any(names is None or b.name in names for b in self._pending):
                self.join(names)

        return module.register_forward_pre_hook(pre_forward, prepend=True)

    # ------------------------------------------------------------------ internals

    def _take(self, bg: Background) -> Background:
        with self._lock:
            if bg in self._pending:
                self._pending.remove(bg)
        return bg

    def _settle(self, bg: Background) -> None:
        """Wait for ``bg`` if it is still pending (a failure elsewhere): its error is logged, the caller raises."""
        if bg not in self._pending:
            return
        self._take(bg)
        try:
            bg.join()
        except BaseException as exc:  # noqa: BLE001 - the caller's own error propagates
            log.error("rank %d: %s failed while the switch was failing too: %r", self.lifecycle.rt.rank, bg.name, exc)


__all__ = ["Background", "BackgroundMoveError", "OverlappedSwitch", "RESUME"]
