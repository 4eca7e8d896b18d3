"""How the colocated RL step switches between its roles: the three modes, the sync first, and the driver.

Modes (``--mode``, :data:`MODES`):

``sequential``  the lifecycle's pause walk, then the store's offload; the
                weight sync (params reload, gather); the resume's cooldown and
                rebuild, then the reload of the rest. One after the other.
``overlapped``  the offload on a worker thread beside the pause's walk
                (:class:`refimpl.comm.overlap.OverlappedSwitch`); in the weight
                sync both reloads streamed (``reload(stream=True)``) and issued
                at once, the params' copies first: each parameter's gather
                waits on the device for its own bytes, and the rest's copies
                run under the gather and then beside the resume's cooldown,
                rebuild and the warm-up of the rebuilt groups
                (``LifecycleConfig.warm_rebuilt``); waited for at the end of the
                reload phase. The bitwise weight check runs at a quiet point
                after the next training step, when no copy is in flight for it
                to hide under.
``streamed``    as ``overlapped``, but the reload of the rest (the optimizer
                state) is not waited for in the switch: it streams under the
                next training step's forward and backward (the forward's use of
                each parameter waits on the device for its bytes). With
                ``--overlap-reload`` (off by default) it is issued in the order
                the step uses the state and runs on into the backward ([Note:
                the reload overlapped with the step]); without, a step
                pre-hook finishes it before the optimizer step.
                The resume (cooldown, rebuild, warm-up) runs in the reload
                phase, beside the copies.

With ``--sync-first`` (any mode) the weight sync comes before the offload, reading the trainer's params where
training left them (:meth:`SwitchDriver.sync_resident`), and the reload phase brings the whole state back. Early
copies (``--offload-in-backward``) are the trainer's: :class:`bench.rl.early_copies.StepInBackward`. What a
switch costs the step is counted in the record ([Note: switch cost] in :mod:`bench.rl.record`).

[Note: rebuild ahead] With ``rebuild_ahead`` (``--rebuild-ahead``, the default) off the
sequential mode, the reload phase starts the lifecycle's resume on a worker
thread first (``OverlappedSwitch.resume(join=False, background=True)``: the
cooldown's rest, the rebuild of the trainer's groups and the warm-up that
creates their communicators) and then issues the reload's copies, so the
rebuild runs beside the copies and the phase ends once they are issued. A
forward pre-hook on the trainer's model, ahead of FSDP2's own, joins it
(the thread, then one agreement on the control group) before the training
step's first collective: the first FSDP all-gather waits for the rebuilt
groups, not the reload phase. Nothing between the two runs a collective on the
trainer's groups or the control group, so the thread's agreements never
interleave with the caller's. The step's record holds where the thread ran,
the wait at the join and the agreement (``resume_ahead``); docs/comm.md, "The
switch on N GPUs", says what it hides and what it costs.

[Note: the reload overlapped with the step]
With early copies the training step after a switch steps each unit's
optimizer in its backward, last layer first, and hands the unit's state to
the store's early copies right after. A reload issued in the store's default
order (params, then the optimizer state, each in the layouts' order, first
layer first) holds the last layer's moments at the end of the queue, and a
step pre-hook that finished the reload before the first optimizer step made
the host wait for every piece there (run 6 of
``bench/results/2026-12-05-h200-pending/``: 0.129 s of a 0.208-s switch on
one H100 at batch 16); the early copies, on the same copy stream, then
started only once the whole reload had landed. With ``use_order`` the reload
is issued in the step's order (:meth:`bench.rl.trainer.Trainer.use_order`),
no pre-hook finishes it, and each optimizer step waits on the device for its
unit's pieces only (the store's arrival guards); ``copy_early`` leaves the
reload streaming (the store orders each early copy after its own range's
pieces), and the copies to the host run on their own stream, beside the
reload's on the other copy engine. The reload is finished after the step.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S

#: the switch modes of the RL step
MODES = ("sequential", "overlapped", "streamed")


class SwitchDriver:
    """One rank's switch in the chosen mode; the step's phases call :meth:`pause`, :meth:`weight_sync`, :meth:`resume`.

    ``clock``: the step's clock (``sync``: every stream; ``stream_sync``: the current stream). The attributes
    ``sync_end``, ``reload_end`` and ``train_start`` say what the step's phases wait for at their ends (see
    ``PhaseClock.phase`` in :mod:`bench.rl.clock`): off the sequential mode the reloads are streamed
    (``OffloadStore.reload(stream=True)``: each tensor's first use waits on the device for its own bytes), so
    the weight sync's gather runs beside the params' copies and the rest's copies run on past the weight sync
    (and, streamed, into the next training step); those phases end on the compute stream, and the time the
    copies still take lands in the phase that waits for them.
    """

    def __init__(self, mode: str, lifecycle: Any, store: Any, optimizer: Any, clock: Any, *,
                 sync_first: bool = False, rebuild_ahead: bool = False, model: Any = None,
                 sync_needs_groups: bool = False, forward_from_rollout: Callable[[], Any] | None = None,
                 use_order: Callable[[], list[Any]] | None = None,
                 switch_interval_s: float | None = RESPONSIVE_SWITCH_INTERVAL_S) -> None:
        """``optimizer``: the step's optimizer, or a list of them (one per unit stepped in the backward): a
        streamed reload is finished before the first of them steps. ``sync_first``: the weight sync runs before
        the offload (:meth:`sync_resident`), so the reload phase brings everything back. ``rebuild_ahead`` (off
        the sequential mode; needs ``model``, the trainer's root module): [Note: rebuild ahead].
        ``sync_needs_groups``: the weight sync after the rollout gathers over the lifecycle's groups, which then
        come back before it (:meth:`weight_sync`). ``forward_from_rollout``: builds the
        :class:`bench.rl.rollout_gather.ForwardFromRollout` of the trainer (called once, at the first reload), armed
        at every reload for the training step after it (module docstring). ``use_order`` (streamed): the
        trainer's state in the order the next step first uses it; the reload of the rest is issued in that order
        (``OffloadStore.reload(use_order=...)``) and not finished on the host before the optimizer steps ([Note:
        the reload overlapped with the step]); None: the store's default order, finished before the first
        optimizer step. ``switch_interval_s``: the interpreter's switch interval while the switch's background
        moves run (:class:`~refimpl.comm.overlap.OverlappedSwitch`; None: the interpreter's own)."""
        from refimpl.comm.overlap import OverlappedSwitch

        if mode not in MODES:
            raise ValueError(f"switch mode {mode!r} is not one of {MODES}")
        if rebuild_ahead and mode != "sequential" and model is None:
            raise ValueError("rebuild_ahead joins the resume in a forward pre-hook of the trainer's model: pass model")
        self.mode, self.lc, self.store = mode, lifecycle, store
        self.sync_first = sync_first
        self.rebuild_ahead = rebuild_ahead and mode != "sequential"
        self.wake_for_sync = sync_needs_groups and not sync_first
        #: the groups came back for this switch's weight sync (the reload phase has no resume to run)
        self.woken = False
        self.t0 = clock.t0
        self._ahead: tuple[dict[str, Any], Any] | None = None
        self._make_served, self._served = forward_from_rollout, None
        self.sync, self.stream_sync = clock.sync, clock.stream_sync
        self.life = lifecycle.sync
        self.switch = (OverlappedSwitch(lifecycle, switch_interval_s=switch_interval_s) if mode != "sequential"
                       else None)
        self.current: dict[str, Any] = {}
        self.sync_end = "device" if mode == "sequential" else "stream"
        self.reload_end = "stream" if mode == "streamed" else "device"
        #: what the next training step waits for when it starts (a streamed reload is waited for tensor by tensor)
        self.train_start = "device"
        optims = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        self._use_order = use_order if mode == "streamed" else None
        finish_first = mode == "streamed" and self._use_order is None
        self._hooks = [o.register_step_pre_hook(self._before_step) for o in optims] if finish_first else []
        if self.rebuild_ahead:  # prepended: ahead of FSDP2's root pre-forward and its first all-gather
            self._hooks.append(model.register_forward_pre_hook(self._before_forward, prepend=True))

    @property
    def ahead_pending(self) -> bool:
        """A resume started ahead (:meth:`resume`) is not joined yet."""
        return self._ahead is not None

    @property
    def forward_served(self) -> bool:
        """The next forward's all-gathers are filled from the rollout's copy (armed at the reload)."""
        return self._served is not None and self._served.armed

    def _before_forward(self, _module: Any, _args: Any) -> None:
        """Rebuild ahead: the first forward after a switch joins the resume before its first collective (with the
        forward served from the rollout's copy it has none: :meth:`before_backward` joins)."""
        if not self.forward_served:
            self.join_ahead()

    def before_backward(self) -> None:
        """Between a training step's forward and its backward: a resume still running is joined here, before the
        backward's first collective (the forward served from the rollout's copy left it running)."""
        self.join_ahead(at="backward")

    def forward_served_done(self) -> dict[str, Any] | None:
        """After a training step's backward: FSDP2's own all-gathers again; what the rollout's copy served (None
        when it was not armed)."""
        if not self.forward_served:
            return None
        return self._served.disarm()

    def join_ahead(self, at: str = "forward") -> None:
        """Wait for a resume started ahead (its thread, then the agreement on its outcome) and write where it ran
        into its step's ``resume_ahead``: seconds on the phases' clock, ``at`` the point of the training step that
        joined it (``forward``, ``backward``, or ``after`` the step); nothing when none is pending."""
        from refimpl.comm.overlap import RESUME

        if self._ahead is None:
            return
        s, bg = self._ahead
        self._ahead = None
        t = time.perf_counter()
        try:
            bg.join()
        except BaseException:  # noqa: BLE001 - raised on every rank by the agreement below
            pass
        waited = time.perf_counter()
        self.switch.join([RESUME])
        agreed = time.perf_counter()
        s["resume_ahead"] = {"start_s": bg.started_at - self.t0, "end_s": bg.ended_at - self.t0,
                             "thread_s": bg.ended_at - bg.started_at, "join_at_s": t - self.t0,
                             "join_at": at,
                             "join_wait_s": waited - t, "join_agree_s": agreed - waited}
        s["lifecycle_state"] = self.lc.state.name

    def _order(self) -> list[Any] | None:
        """The use order a streamed reload is issued in (None: the store's default)."""
        return None if self._use_order is None else self._use_order()

    def _before_step(self, _opt: Any, _args: Any, _kwargs: Any) -> None:
        """Streamed: the reload still streaming under the forward and backward is finished before the optimizer
        step (the host waits for its last copies; the step then finds its state resident and unguarded)."""
        t = time.perf_counter()
        self.store.finish_reload()
        self.current["stream_wait_s"] = self.current.get("stream_wait_s", 0.0) + time.perf_counter() - t

    def pause(self, s: dict[str, Any]) -> str:
        """The offload phase: the lifecycle's pause and the store's offload (beside it unless sequential)."""
        def release() -> None:
            t = time.perf_counter()
            self.store.offload()
            self.sync()
            s["offload_store_s"] = time.perf_counter() - t

        if self.switch is None:
            return self.life.pause(release_memory=release).name
        return self.switch.pause(release, issued_point="store.offload.wait").name

    def weight_sync(self, s: dict[str, Any], sync_weights: Callable[[], None]) -> None:
        """The weight-sync phase: params back, then the gather into the rollout copy. Off the sequential mode both
        reloads are streamed and issued first (the params' copies, the rest's behind them), so each parameter's
        gather waits on the device for its own bytes while later ones are still copying.

        With ``wake_for_sync`` (the gather runs over the lifecycle's groups: a managed mesh of several ranks) the
        groups come back first, for the sync and the training step after it: the lifecycle's resume (ahead on a
        thread with ``rebuild_ahead``, joined before the gather's first collective), then the sync under
        ``PGLifecycle.weight_sync`` from ACTIVE (agreed; it arms preservation as a sync after a pause does), and
        the reload phase finds them up. Otherwise the sync would rebuild them and take them down again, and the
        resume rebuild them once more after the cooldown their second destroy started."""
        def issue() -> None:
            t = time.perf_counter()
            if self.switch is None:
                self.store.reload("params")
                self.stream_sync()
            else:
                self.store.reload("params", stream=True)
                self.store.reload(stream=True, use_order=self._order())
            s["reload_params_store_s"] = time.perf_counter() - t  # streamed: the time to issue both

        def gather() -> None:
            t = time.perf_counter()
            sync_weights()
            self.stream_sync()
            s["gather_copy_s"] = time.perf_counter() - t

        if not self.wake_for_sync:
            self.life.weight_sync(lambda: (issue(), gather()))
            return
        self._wake(s)
        issue()
        self.join_ahead()
        self.life.weight_sync(gather)
        self.woken = True

    def _wake(self, s: dict[str, Any]) -> None:
        """The lifecycle's resume: on a thread with ``rebuild_ahead`` (joined by :meth:`join_ahead`), else here."""
        from refimpl.comm.overlap import RESUME

        if self.rebuild_ahead:
            self.switch.resume(join=False, background=True)
            self._ahead = (s, self.switch.running(RESUME))
        elif self.switch is None:
            self.life.resume()
        else:
            self.switch.resume()

    def sync_resident(self, s: dict[str, Any], sync_weights: Callable[[], None]) -> None:
        """``sync_first``: the weight-sync phase before the offload, the gather reading the params where training
        left them (nothing reloaded; the lifecycle's groups still up and unused)."""
        s["reload_params_store_s"] = 0.0
        t = time.perf_counter()
        sync_weights()
        self.stream_sync()
        s["gather_copy_s"] = time.perf_counter() - t

    def resume(self, s: dict[str, Any]) -> None:
        """The reload phase: the groups come back (unless they came back for the weight sync); the rest of the
        state too (streamed: still on its way); with ``sync_first`` all of it, params first (off the sequential
        mode issued before the resume, streamed). With ``rebuild_ahead`` the resume starts first, on a thread, and
        is joined by the next forward."""
        woken, self.woken = self.woken, False
        t = time.perf_counter()
        if self.rebuild_ahead and not woken:  # the rebuild's host work starts at the rollout's end, beside the issue
            self._wake(s)
        if self._make_served is not None:  # the next forward's all-gathers from the rollout's copy
            if self._served is None:
                self._served = self._make_served()
            self._served.arm()
        if self.switch is not None and self.sync_first:
            self.store.reload(stream=True, use_order=self._order())
        if self.switch is None:
            if not woken:
                self.life.resume()
            t = time.perf_counter()
            self.store.reload()
            self.sync()
        elif self.mode == "overlapped":
            if not (self.rebuild_ahead or woken):
                self.switch.resume()
            self.store.finish_reload()
        else:  # the resume (and the warm-up of rebuilt groups) beside the copies; the rest streams on into training
            if not (self.rebuild_ahead or woken):
                self.switch.resume()
            self.train_start = "stream"
        s["reload_rest_store_s"] = time.perf_counter() - t

    def after_train(self) -> None:
        """After a training step (untimed): a resume still beside it joined, a streamed reload's tensors that
        the step did not touch handed over and its layouts made resident."""
        self.join_ahead(at="after")
        if self.switch is not None and self.switch.pending:
            self.switch.join()
        if self.switch is not None:
            self.store.finish_reload()

    def finish(self) -> None:
        """After the last step: as :meth:`after_train`; the step hook removed."""
        self.after_train()
        for h in self._hooks:
            h.remove()
        self._hooks = []


__all__ = ["MODES", "SwitchDriver"]
