"""A worker's whole life in the simulator, as a Hypothesis state machine.

Every rank of a random job (a dense ``dp x tp`` mesh and an expert ``eddp x ep`` mesh with another
factorisation and rank order) owns a ``local_dedup`` store holding dense weights (replicated over
``dp``, named by an override), expert weights (attached as DTensors replicated over ``eddp``: the
store infers their groups from the placements) and rank-local optimizer state, plus a
:class:`PGLifecycle` over the dense mesh's TP and DP groups. Hypothesis picks the story: train steps,
pauses with any policy (offloading the state as the trainer's memory), rollouts that take the freed
device memory, weight syncs, resume-and-reload, checkpoint reads (as DCP would read them, reloading
on the 1/N-slice path), and at most ``BUDGET.max_faults`` faults (raise, crash or delay) on any rank
at any named lifecycle or store point.

Invariants after every step:

* no rank fails a step in which no fault was injected;
* every running rank's lifecycle is in the same state; if any rank failed the last step, every
  running rank failed it (nobody carries on alone), and a raise or crash inside the lifecycle leaves
  every running rank FAILED; a failed canary turns preservation off on every rank;
* every byte is recoverable: resident state equals what the training steps wrote, bit for bit; a
  checkpoint reads exactly that; after a failure without a crash, a reload brings it all back;
* no rank's device memory ever exceeded its capacity;
* the port cooldown is respected: no role group is recreated on a rank sooner than ``cooldown_s``
  after that rank last destroyed or aborted a role group.
"""
from __future__ import annotations

import math

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from torch.distributed.tensor import Replicate, Shard

import sim
from refimpl.comm import LifecycleConfig, PGLifecycle, PGPolicy, PGState
from refimpl.runtime.base import GroupSpec, ReduceOp
from refimpl.store import OffloadStore, StoreConfig
from refimpl.store.checkpoint import SavePath, save_path, tensors_for_save
from refimpl.store.backends.dedup_config import DedupConfig
from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy, mesh_coordinate
from tests._hypothesis import BUDGET

MiB = 2**20
CAPACITY = 3 * 1024 * MiB  # per rank: communicators (~392 MiB per group) + state + a rollout
AGREE_S, CANARY_S, CREATE_S, COOLDOWN_S = 40.0, 8.0, 20.0, 2.0
SIZES = [n for n in (2, 4, 8, 16, 32, 64) if n <= BUDGET.max_ranks]
LIFECYCLE_POINTS = ["lifecycle.pause.decide", "lifecycle.release_memory", "lifecycle.canary",
                    "lifecycle.suspend.preflight", "lifecycle.suspend", "lifecycle.resume.preflight",
                    "lifecycle.resume", "lifecycle.destroy", "lifecycle.rebuild", "lifecycle.weight_sync"]
ALL = ("params", "optimizer")
STORE_POINTS = ["store.offload.wait", "store.offload.release", "dedup.reload.all_gather"]


def _values(seed: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(0, 200, (numel,), generator=g, dtype=torch.int64).to(dtype)


class _Placed:
    """A DTensor as the store sees one (duck-typed: a real DTensor needs live process groups)."""

    def __init__(self, local, mesh, placements):
        self._local_tensor, self.device_mesh, self.placements = local, mesh, placements


class ArmedFaults:
    """Fault hooks: one fault at a time, armed by the machine, fired the first time its rank reaches its point."""

    def __init__(self):
        self.armed: tuple[int, str, str] | None = None
        self.fired: list[tuple[int, str, str]] = []

    def on_point(self, rank, name):
        if self.armed is None or (rank, name) != self.armed[:2]:
            return None
        kind = self.armed[2]
        self.fired.append(self.armed)
        self.armed = None
        return {"raise": lambda: sim.FaultAction.fail(RuntimeError(f"injected at {name} on rank {rank}")),
                "crash": sim.FaultAction.crash,
                "delay": lambda: sim.FaultAction.delay(3 * CANARY_S)}[kind]()

    def on_collective(self, rank, group, op, seq):
        return None

    def on_group_create(self, rank, spec):
        return None

    def on_pin(self, rank, nbytes):
        return None


def _split(name: str) -> tuple[str, int]:
    """``"dense2"`` -> ``("dense", 2)``."""
    kind = name.rstrip("0123456789")
    return kind, int(name[len(kind):])


def _factor_pairs(n):
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


class WorkerLife(RuleBasedStateMachine):
    """See the module docstring."""

    def __init__(self):
        super().__init__()
        self.world = None

    # ------------------------------------------------------------------ setup

    @initialize(n=st.sampled_from(SIZES), data=st.data(), seed=st.integers(0, 2**16), two_phase=st.booleans())
    def build(self, n, data, seed, two_phase):
        dp, tp = data.draw(st.sampled_from(_factor_pairs(n)), label="dense dp x tp")
        eddp, ep = data.draw(st.sampled_from(_factor_pairs(n)), label="expert eddp x ep")
        order = data.draw(st.permutations(range(n)), label="expert rank order")
        self.dense = MeshTopology((dp, tp), ("dp", "tp"))
        self.expert = MeshTopology((eddp, ep), ("eddp", "ep"), tuple(order))
        self.sizes = data.draw(st.lists(st.integers(1, 300), min_size=1, max_size=3), label="tensor sizes")
        self.dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16, torch.int64]), label="dtype")
        self.n, self.step, self.phase = n, 0, "active"
        self.offloaded_once = False  # the store plans its layouts at the first offload; a checkpoint needs them
        self.faults = ArmedFaults()
        self.faults_left = BUDGET.max_faults
        self.failed_at: str | None = None  # the rule in which some rank failed (then only recovery and waits run)
        self.crashed = False
        self.recovered = False
        self.last: list = []
        self.world = sim.SimWorld(n, payload="real", seed=seed, chooser=sim.RandomChooser(seed), faults=self.faults,
                                  group_timeouts=True, memory=sim.LedgerMemory(device_capacity=CAPACITY))
        specs = ([GroupSpec(f"tp{i}", tuple(range(i * tp, (i + 1) * tp)), timeout_s=CREATE_S) for i in range(dp)]
                 + [GroupSpec(f"dp{j}", tuple(range(j, n, tp)), timeout_s=CREATE_S) for j in range(tp)])
        self.role_groups = {s.name for s in specs if s.size > 1}
        specs = [s for s in specs if s.size > 1]
        config = LifecycleConfig(agree_timeout_s=AGREE_S, canary_timeout_s=CANARY_S, cooldown_s=COOLDOWN_S,
                                 two_phase=two_phase)
        self.ranks: dict[int, dict] = {}

        async def setup(rt):
            tensors = {}
            for kind in ("dense", "expert", "opt"):
                for i, size in enumerate(self.sizes):
                    t = rt.alloc_device(size, self.dtype, tag=kind)
                    t.copy_(self._expected(rt.rank, kind, i, 0))
                    tensors[f"{kind}{i}"] = t
            policy = ReplicaPolicy(overrides={"params.dense*": MeshReplica(self.dense, ("dp",))})
            store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16),
                                 dedup=DedupConfig(policy=policy, verify_replicas=True))
            placements = (Replicate(), Shard(0))
            store.attach_tensors("params", {k: (_Placed(t, self.expert, placements) if k.startswith("expert") else t)
                                            for k, t in tensors.items() if not k.startswith("opt")}, name="params")
            store.attach_tensors("optimizer", {k: t for k, t in tensors.items() if k.startswith("opt")},
                                 name="optimizer")
            lc = PGLifecycle(rt, specs, config=config)
            await lc.start()
            self.ranks[rt.rank] = dict(rt=rt, store=store, lc=lc, tensors=tensors)

        self.world.run(setup)

    def _expected(self, rank: int, kind: str, i: int, step: int) -> torch.Tensor:
        """What tensor ``kind{i}`` holds on ``rank`` after ``step`` train steps (equal within its replica group)."""
        if kind == "dense":
            key = mesh_coordinate(self.dense, rank)[1:]  # replicated over dp: depends on the tp coordinate only
        elif kind == "expert":
            key = mesh_coordinate(self.expert, rank)[1:]  # replicated over eddp
        else:
            key = (rank,)
        seed = hash((kind, i, key, step)) % 2**31
        return _values(seed, self.sizes[i], self.dtype)

    # ------------------------------------------------------------------ running a step on every rank

    def _run(self, name, fn):
        """Run ``fn(rt, r)`` on every running rank; note who failed."""
        async def job(rt):
            return await fn(rt, self.ranks[rt.rank])

        fired_before = len(self.faults.fired)
        self.last = self.world.run(job, return_exceptions=True)
        raised = [i for i, x in enumerate(self.last) if isinstance(x, BaseException)]
        if raised and self.failed_at is None and len(self.faults.fired) == fired_before:
            # nothing was injected in this step, so a failure is a bug in the code under test
            errors = {i: repr(self.last[i]) for i in raised}
            raise AssertionError(f"{name}: ranks failed without an injected fault: {errors}")
        self.crashed = self.crashed or any(isinstance(x, (sim.RankCrashedError, sim.RankHungError)) for x in self.last)
        if raised and self.failed_at is None:
            self.failed_at = name
        return self.last

    def _alive(self):
        return [r for r in range(self.n) if not self.world.runtimes[r].crashed]

    def _healthy(self):
        return self.world is not None and self.failed_at is None

    # ------------------------------------------------------------------ rules

    @precondition(lambda self: self._healthy() and self.phase == "active")
    @rule()
    def train_step(self):
        self.step += 1
        step = self.step

        async def fn(rt, r):
            grad = torch.ones(1)
            for g in sorted(self.role_groups):
                if rt.is_member(g):
                    await rt.all_reduce(grad, ReduceOp.SUM, g)  # the groups are usable while training
            for name, t in r["tensors"].items():
                t.copy_(self._expected(rt.rank, *_split(name), step))
            return float(grad.item())

        self._run("train_step", fn)

    @precondition(lambda self: self._healthy() and self.phase == "active")
    @rule(policy=st.sampled_from(list(PGPolicy)))
    def pause_and_offload(self, policy):
        async def fn(rt, r):
            return await r["lc"].pause(lambda: r["store"].offload_async(), policy=policy)

        self._run("pause", fn)
        self.phase, self.offloaded_once = "paused", True

    @precondition(lambda self: self._healthy() and self.phase == "paused")
    @rule(seconds=st.floats(0.0, 60.0), mib=st.integers(0, 1024))
    def rollout(self, seconds, mib):
        async def fn(rt, r):
            buf = rt.alloc_device(mib * MiB, torch.uint8, tag="rollout") if mib else None  # the other role's memory
            await rt.sleep(seconds)
            if buf is not None:
                rt.release(buf)
            rt.empty_cache()

        self._run("rollout", fn)

    @precondition(lambda self: self._healthy() and self.phase == "paused")
    @rule()
    def weight_sync(self):
        async def fn(rt, r):
            async def sync():
                w = torch.full((4,), float(self.step)) if rt.rank == 0 else torch.zeros(4)
                await rt.broadcast(w, src=0, group="world")
                return w.tolist()
            return await r["lc"].weight_sync(sync)

        for got in self._run("weight_sync", fn):
            if not isinstance(got, BaseException):
                assert got == [float(self.step)] * 4

    @precondition(lambda self: self._healthy() and self.phase == "paused")
    @rule()
    def resume_and_reload(self):
        async def fn(rt, r):
            await r["lc"].resume()
            await r["store"].reload_async()

        self._run("resume_and_reload", fn)
        self.phase = "active"

    @precondition(lambda self: self._healthy() and self.offloaded_once)
    @rule()
    def checkpoint(self):
        """Read the state as a DCP save would: host views, live tensors, or (1/N slices) reload, read, offload."""
        async def fn(rt, r):
            store = r["store"]
            path = save_path(store, ALL)
            if path is SavePath.RELOAD:
                await store.reload_async(ALL)
            saved = {s.name: s.tensor.clone() for s in tensors_for_save(store, ALL)}
            if path is SavePath.RELOAD:
                await store.offload_async(ALL)
            return path, saved

        for rank, out in enumerate(self._run("checkpoint", fn)):
            if isinstance(out, BaseException):
                continue
            _path, saved = out
            for cat, prefix in (("params", "dense"), ("params", "expert"), ("optimizer", "opt")):
                for i in range(len(self.sizes)):
                    got = saved[f"{cat}.{prefix}{i}"]
                    want = self._expected(rank, prefix, i, self.step)
                    assert torch.equal(got.reshape(-1), want), f"rank {rank}: checkpoint of {prefix}{i} differs"

    @precondition(lambda self: self._healthy() and self.faults.armed is None and self.faults_left > 0)
    @rule(data=st.data(), point=st.sampled_from(LIFECYCLE_POINTS + STORE_POINTS),
          kind=st.sampled_from(["raise", "crash", "delay"]))
    def arm_fault(self, data, point, kind):
        rank = data.draw(st.integers(0, self.n - 1), label="fault rank")
        self.faults.armed = (rank, point, kind)
        self.faults_left -= 1

    @precondition(lambda self: self.world is not None)
    @rule(seconds=st.floats(0.0, 10.0))
    def wait(self, seconds):
        async def fn(rt, r):
            await rt.sleep(seconds)

        self._run("wait", fn) if self.failed_at is None else None

    @precondition(lambda self: self.world is not None and self.failed_at is not None and not self.crashed
                  and not self.recovered)
    @rule()
    def recover_after_failure(self):
        """Nothing is lost on a failure: every rank reloads what it offloaded and has every byte back."""
        self.recovered = True

        offloaded = [any(self.ranks[r]["store"].is_offloaded(c) for c in ALL) for r in range(self.n)]
        assert len(set(offloaded)) == 1, f"an offload or reload ended differently on the ranks: {offloaded}"

        async def fn(rt, r):
            store = r["store"]
            if any(store.is_offloaded(c) for c in ALL):
                await store.reload_async()
            return {k: t.clone() for k, t in r["tensors"].items()}

        results = self.world.run(lambda rt: fn(rt, self.ranks[rt.rank]))
        for rank, tensors in enumerate(results):
            for name, t in tensors.items():
                assert torch.equal(t, self._expected(rank, *_split(name), self.step)), f"rank {rank}: {name} lost"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def ranks_are_in_one_state_or_failed_together(self):
        if self.world is None:
            return
        alive = self._alive()
        states = {self.ranks[r]["lc"].state for r in alive if r in self.ranks}
        assert len(states) <= 1, f"running ranks in different states: {[self.ranks[r]['lc'].state for r in alive]}"
        raised = [i for i, x in enumerate(self.last) if isinstance(x, BaseException)]
        if raised:
            failed = [i for i in alive if isinstance(self.last[i], BaseException)]
            assert failed == alive, f"ranks {raised} failed but {sorted(set(alive) - set(failed))} carried on"
        fired = self.faults.fired[-1] if self.faults.fired else None
        if fired and fired[2] in ("raise", "crash") and fired[1].startswith("lifecycle.") and self.failed_at:
            assert states == {PGState.FAILED}, f"a {fired[2]} at {fired[1]} left the ranks {states}"

    @invariant()
    def a_failed_canary_turns_preservation_off_everywhere(self):
        if self.world is None:
            return
        lcs = [self.ranks[r]["lc"] for r in self._alive() if r in self.ranks]
        if any(lc.stats.canary_failures for lc in lcs):
            assert all(lc.preservation.disabled is not None and not lc.preservation.armed for lc in lcs), (
                "a canary failed but some rank would still keep its groups through the next pause")

    @invariant()
    def resident_bytes_are_what_training_wrote(self):
        if not self._healthy() or self.phase != "active":
            return
        for rank, r in self.ranks.items():
            for name, t in r["tensors"].items():
                assert torch.equal(t, self._expected(rank, *_split(name), self.step)), f"rank {rank}: {name} differs"

    @invariant()
    def device_memory_stayed_within_capacity(self):
        if self.world is None:
            return
        for rank in range(self.n):
            led = self.world.memory.ledger(rank)
            assert led.device_peak <= CAPACITY and 0 <= led.device_used <= CAPACITY

    @invariant()
    def cooldown_is_respected(self):
        if self.world is None:
            return
        last_release: dict[int, float] = {}
        for rec in self.world.engine.trace:
            if len(rec) != 3 or not isinstance(rec[2], str):
                continue
            t, rank, label = rec
            name = label.split("'")[1] if "'" in label else ""
            if name not in self.role_groups:
                continue
            if label.startswith("destroy_group"):
                last_release[rank] = t
            elif label.startswith("recreate_group") and rank in last_release:
                assert t >= last_release[rank] + COOLDOWN_S - 1e-9, (
                    f"rank {rank} recreated {name!r} at {t:.3f}s, {t - last_release[rank]:.3f}s after releasing "
                    f"ports (cooldown {COOLDOWN_S}s)")


WorkerLife.TestCase.settings = BUDGET.settings(15, stateful_step_count=BUDGET.stateful_steps)
TestWorkerLife = WorkerLife.TestCase
