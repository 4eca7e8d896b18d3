"""A ``local_dedup`` store and a lifecycle on several simulated ranks, with faults, as a Hypothesis state machine.

Every rank of a small job (2-4 ranks) keeps in one ``local_dedup`` store params replicated over every
rank (``m.all*``), params replicated over rank pairs (``m.pair*``; with 3 ranks rank 2 keeps its own,
so one category mixes replicated and rank-local layouts across ranks) and rank-local optimizer state
(``o.own*``), beside a :class:`PGLifecycle` over the job's TP pairs and its DP group. Hypothesis picks
the story: train steps, offloads and reloads of any categories, pauses that offload inside the
lifecycle's ``release_memory`` and resumes that reload after it, waits, and before any step at most
``BUDGET.max_faults`` faults on one rank: a raise, a crash or a delay past every timeout at a point of
the store (``store.offload.*``, ``store.reload.*``, ``dedup.reload.all_gather``) or of the lifecycle,
or host memory that cannot be pinned. The deployment's watchdog is on (``group_timeouts``).

After every step, on the ranks still running:

* a step failed on one of them iff it failed on all of them, and none failed without a fault;
* they agree on where the state is: each category offloaded on all of them or on none;
* every byte is recoverable: a resident tensor holds what the training steps wrote; an offloaded one
  is in the host copies (a rank-local layout whole on its rank, a replicated one as slices that, put
  together over the group's members, give every tensor back bit for bit);
* once a rank crashed or hung, the others still bring their own state back alone
  (``reload(local_only=True)``, no collective), bit for bit.
"""
from __future__ import annotations

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy
from refimpl.comm.states import allowed_states
from refimpl.runtime.base import GroupSpec, PinningError
from refimpl.store import OffloadStore, StoreConfig, is_parked
from refimpl.store.backends.dedup_config import DedupConfig
from refimpl.store.state.layout import LayoutState
from refimpl.store.backends.replica import LOCAL, ReplicaGroup, ReplicaPolicy
from tests._hypothesis import BUDGET

DEDUP_S, AGREE_S, CANARY_S, CREATE_S = 10.0, 40.0, 8.0, 20.0
DELAY_S = 50.0  # past the votes' and the lifecycle agreements' timeouts
SIZES = [n for n in (2, 3, 4) if n <= BUDGET.max_ranks]
CATS = ("params", "optimizer")
OFFLOAD_POINTS = ["store.offload.begin", "store.offload.wait", "store.offload.release", "pin"]
RELOAD_POINTS = ["store.reload.begin", "store.reload.wait", "dedup.reload.all_gather"]
PAUSE_POINTS = ["lifecycle.pause.decide", "lifecycle.release_memory", "lifecycle.suspend", "lifecycle.destroy"]
RESUME_POINTS = ["lifecycle.resume", "lifecycle.rebuild", "lifecycle.canary"]


def fault(*points: str):
    """A fault on one rank at one of ``points`` of the coming step, or none (twice as likely)."""
    return st.one_of(st.none(), st.none(), st.tuples(st.integers(0, 3), st.sampled_from(points),
                                                     st.sampled_from(["raise", "crash", "delay"])))


INCLUDES = st.sampled_from([None, "params", "optimizer"])


class StoryFaults:
    """One armed fault: ``(rank, point, kind)``, fired the first time that rank reaches the point ("pin": pins)."""

    def __init__(self):
        self.armed: tuple[int, str, str] | None = None
        self.fired: list[tuple[int, str, str]] = []

    def _fire(self):
        (rank, point, kind), self.armed = self.armed, None
        self.fired.append((rank, point, kind))
        return {"raise": lambda: sim.FaultAction.fail(RuntimeError(f"injected at {point} on rank {rank}")),
                "crash": sim.FaultAction.crash, "delay": lambda: sim.FaultAction.delay(DELAY_S)}[kind]()

    def on_point(self, rank, name):
        return self._fire() if self.armed is not None and self.armed[:2] == (rank, name) else None

    def on_pin(self, rank, nbytes):
        if self.armed is not None and self.armed[:2] == (rank, "pin"):
            self.armed, fired = None, self.armed
            self.fired.append(fired)
            return sim.FaultAction.fail(PinningError(f"injected: rank {rank} cannot pin {nbytes} bytes"))
        return None

    def on_collective(self, rank, group, op, seq):
        return None

    def on_group_create(self, rank, spec):
        return None


class StoreStory(RuleBasedStateMachine):
    """See the module docstring."""

    @initialize(n=st.sampled_from(SIZES), sizes=st.lists(st.integers(1, 48), min_size=1, max_size=2),
                policy_seed=st.integers(0, 2**16))
    def build(self, n, sizes, policy_seed):
        self.n, self.sizes, self.step = n, sizes, 0
        self.faults = StoryFaults()
        self.faults_left = BUDGET.max_faults
        self.world = sim.SimWorld(n, payload="real", seed=policy_seed, chooser=sim.RandomChooser(policy_seed),
                                  faults=self.faults, group_timeouts=True)
        specs = [GroupSpec(f"tp{i}", (2 * i, 2 * i + 1), timeout_s=CREATE_S) for i in range(n // 2)]
        specs.append(GroupSpec("dp", tuple(range(n)), timeout_s=CREATE_S))
        config = LifecycleConfig(agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S, cooldown_s=2.0, two_phase=False)
        self.ranks: dict[int, dict] = {}
        self.gone: set[int] = set()
        self.last: list = []

        async def setup(rt):
            r = rt.rank
            pair = ReplicaGroup((r - r % 2, r - r % 2 + 1)) if r - r % 2 + 1 < n else LOCAL
            policy = ReplicaPolicy(overrides={"m.all*": ReplicaGroup(tuple(range(n))), "m.pair*": pair})
            store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                                 dedup=DedupConfig(policy=policy, timeout_s=DEDUP_S))
            tensors = {}
            for kind in ("all", "pair", "own"):
                for i, size in enumerate(self.sizes):
                    t = rt.alloc_device(size, torch.float32, tag=kind)
                    t.copy_(self._expected(r, kind, i, 0))
                    tensors[f"{kind}{i}"] = t
            store.attach_tensors("params", {k: t for k, t in tensors.items() if not k.startswith("own")}, name="m")
            store.attach_tensors("optimizer", {k: t for k, t in tensors.items() if k.startswith("own")}, name="o")
            lc = PGLifecycle(rt, specs, config=config)
            await lc.start()
            self.ranks[r] = dict(store=store, lc=lc, tensors=tensors)

        self.world.run(setup)

    def _expected(self, rank: int, kind: str, i: int, step: int) -> torch.Tensor:
        """What ``kind{i}`` holds on ``rank`` after ``step`` train steps (equal over its replica group)."""
        key = {"all": (), "pair": (rank // 2,) if rank - rank % 2 + 1 < self.n else (rank,), "own": (rank,)}[kind]
        g = torch.Generator().manual_seed(hash((kind, i, key, step)) % 2**31)
        return torch.randn(self.sizes[i], generator=g)

    def _now(self, rank: int, key: str) -> torch.Tensor:
        """What tensor ``key`` (``"pair0"``) holds on ``rank`` now."""
        kind = key.rstrip("0123456789")
        return self._expected(rank, kind, int(key[len(kind):]), self.step)

    # ------------------------------------------------------------------ running a step

    def _alive(self) -> list[int]:
        return [r for r in range(self.n) if r not in self.gone]

    def _run(self, name, fn):
        """``fn(rt, parts)`` on every rank; record who failed; no rank fails a step without a fault."""
        fired = len(self.faults.fired)

        async def job(rt):
            try:
                return None, await fn(rt, self.ranks[rt.rank])
            except Exception as exc:  # noqa: BLE001 - how ranks end is the property
                return exc, None

        results = self.world.run(job, return_exceptions=True)
        self.gone |= {r for r, res in enumerate(results) if isinstance(res, (sim.RankCrashedError, sim.RankHungError))}
        self.last = [(r, results[r][0]) for r in self._alive()]
        self.faults.armed = None  # a fault not reached in its step is dropped
        injected = len(self.faults.fired) > fired
        event(f"{name}: {'fault ' + self.faults.fired[-1][2] + ' at ' + self.faults.fired[-1][1] if injected else 'no fault'}")
        if not injected:
            assert all(err is None for _, err in self.last), f"{name} failed without a fault: {self.last}"
        return [results[r][1] for r in self._alive()]

    def _state(self):
        return self.ranks[self._alive()[0]]["lc"].state

    def _healthy(self) -> bool:
        return not self.gone

    def _offloaded(self, cat: str) -> bool:
        return self.ranks[self._alive()[0]]["store"].is_offloaded(cat)

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self._healthy() and not any(self._offloaded(c) for c in CATS))
    @rule()
    def train(self):
        self.step += 1

        async def fn(rt, p):
            for key, t in p["tensors"].items():
                t.copy_(self._now(rt.rank, key))

        self._run("train", fn)

    def _arm(self, drawn) -> None:
        """Arm the drawn fault for the coming step (while the budget lasts)."""
        if drawn is not None and self.faults_left > 0:
            rank, point, kind = drawn
            self.faults.armed = (rank % self.n, point, "raise" if point == "pin" else kind)
            self.faults_left -= 1

    @precondition(lambda self: self._healthy())
    @rule(include=INCLUDES, drawn=fault(*OFFLOAD_POINTS))
    def offload(self, include, drawn):
        self._arm(drawn)
        self._run("offload", lambda rt, p: p["store"].offload_async(include))

    @precondition(lambda self: self._healthy())
    @rule(include=INCLUDES, drawn=fault(*RELOAD_POINTS))
    def reload(self, include, drawn):
        self._arm(drawn)
        self._run("reload", lambda rt, p: p["store"].reload_async(include))

    @precondition(lambda self: self._healthy() and self._state() in allowed_states("pause"))
    @rule(policy=st.sampled_from([PGPolicy.PAUSED_LIVE, PGPolicy.DESTROY, PGPolicy.SUSPEND]),
          drawn=fault(*PAUSE_POINTS, *OFFLOAD_POINTS))
    def pause_and_offload(self, policy, drawn):
        self._arm(drawn)
        self._run("pause", lambda rt, p: p["lc"].pause(lambda: p["store"].offload_async(), policy=policy))

    @precondition(lambda self: self._healthy() and self._state() in allowed_states("resume"))
    @rule(drawn=fault(*RESUME_POINTS, *RELOAD_POINTS))
    def resume_and_reload(self, drawn):
        self._arm(drawn)

        async def fn(rt, p):
            await p["lc"].resume()
            await p["store"].reload_async()

        self._run("resume", fn)

    @precondition(lambda self: not self._healthy() and self._alive())
    @rule()
    def survivors_reload_their_own_state(self):
        """With a peer gone, each survivor's rank-local state comes back on its own (no fault armed here)."""
        self.faults.armed = None
        self._run("reload(local_only=True)", lambda rt, p: p["store"].reload_async(local_only=True))
        for rank in self._alive():
            store = self.ranks[rank]["store"]
            left = [lay for lay in store.layouts.values() if lay.state is LayoutState.OFFLOADED]
            assert all(store.backend.needs_peers(lay) for lay in left), f"rank {rank}: {left} stayed offloaded"

    @rule(seconds=st.sampled_from([0.5, 30.0]))
    def wait(self, seconds):
        self._run("wait", lambda rt, p: rt.sleep(seconds))

    # ------------------------------------------------------------------ after every step

    @invariant()
    def a_step_fails_on_every_running_rank_or_on_none(self):
        failed = [err is not None for _, err in getattr(self, "last", [])]
        assert all(failed) or not any(failed), f"a step failed on some ranks only: {self.last}"

    @invariant()
    def running_ranks_agree_on_where_the_state_is(self):
        if not getattr(self, "ranks", None) or not self._alive():
            return
        where = {r: tuple(self.ranks[r]["store"].is_offloaded(c) for c in CATS) for r in self._alive()}
        assert len(set(where.values())) == 1, f"ranks disagree on what is offloaded ({CATS}): {where}"

    @invariant()
    def every_byte_is_recoverable(self):
        if not getattr(self, "ranks", None):
            return
        for rank in self._alive():
            p = self.ranks[rank]
            for key, t in p["tensors"].items():
                if not is_parked(t):
                    assert torch.equal(t, self._now(rank, key)), f"rank {rank}: resident {key} differs from training's"
            for layout in p["store"].layouts.values():
                if layout.state is LayoutState.OFFLOADED:
                    self._check_host_copy(rank, layout)

    def _check_host_copy(self, rank, layout):
        """The layout's bytes, from this rank's host copy (local) or its group's slices, hold every tensor."""
        backend = self.ranks[rank]["store"].backend
        group = layout.key.placement
        if group is None:
            data = torch.cat([backend.host_view(layout, e.offset, e.offset + e.numel) for e in layout.entries])
            starts = [e.offset for e in layout.entries]
        else:
            if any(m in self.gone for m in group.ranks):
                return  # a member's slice went with it: only the rank-local state is this rank's to recover
            pieces = []
            for m in group.ranks:
                lay = self.ranks[m]["store"].layouts[layout.key]
                part, got = self.ranks[m]["store"].backend.host_slice(lay)
                pieces.append((part.start, got))
            data = torch.cat([got for _, got in sorted(pieces, key=lambda x: x[0])])
            starts = None
        pos = 0
        for i, e in enumerate(layout.entries):
            base = data[pos:pos + e.numel] if starts is not None else data[e.offset:e.offset + e.numel]
            pos += e.numel
            for ref in e.refs:
                got = base.as_strided(ref.size, ref.stride, base.storage_offset() + ref.offset)
                assert torch.equal(got.reshape(-1), self._now(rank, ref.name.split(".", 1)[1]).reshape(-1)), (
                    f"rank {rank}: {ref.name} is not recoverable from the host copies of {layout.key.label()}")


StoreStory.TestCase.settings = BUDGET.settings(40, stateful_step_count=BUDGET.stateful_steps)
TestStoreStory = StoreStory.TestCase
