"""``timeshare plan``: which offload settings fit a model on a cluster, and what one RL step costs under each.

:func:`make_plan` evaluates candidates of one colocated RL step (every role on
every GPU, taking turns: rollout, then the scoring roles, then the actor's
update) and ranks them. A candidate is

* what the trained roles (actor, critic) move to the host between their turns:
  nothing, any combination of ``params`` / ``grads`` / ``optimizer``, or
  ``fsdp_cpu`` (FSDP2's ``CPUOffloadPolicy``: the state lives on the host and
  every forward/backward copies the shards in, the optimizer steps on the CPU);
* the store backend, ``local`` or ``local_dedup`` (only offered when the layout
  has replicated state; otherwise it is the same as ``local``);
* whether the scoring roles (reference, reward) move their weights out;
* the process-group policy of the trained roles (``none`` and every
  :class:`refimpl.comm.PGPolicy`: ``destroy``, ``destroy_deferred``, ``paused_live``,
  ``suspend``, ``suspend_planned``);
* the order of the roles after the rollout (reference, reward, critic; the
  actor's update is last because it needs their outputs).

What is simulated and what is computed (docs/plan.md says it in full):

* Switch costs come from the simulator: one :func:`sim.scenarios.runner.run_scenario`
  per distinct (role state, offloaded categories, PG policy) on one node of
  the topology (offload traffic never leaves a node), meta payloads, two steps
  (the lifecycle's first pause only makes groups eligible), the second
  step's ``sleep`` / ``wake_up`` / ``update_weights`` and the ``train`` phase's
  group overhead read from the result. The state is coarsened to at most
  :data:`SIM_TENSORS` tensors per category of the same bytes: in steady state
  the store copies flat buffers per pinned segment, so the tensor count does
  not change the copies (within 0.05% of the full tensor list for Llama-2-7B
  and Qwen3-30B-A3B). Results are cached, so the search runs a few dozen
  short simulations.
* ``pg_groups="megatron"``: the trained roles' PG-policy costs come instead from the switch-window
  lifecycle driver (:func:`sim.calibrate.switch_window.simulate`) over the 14 Megatron group families per rank of the
  node's dp x tp mesh (:meth:`Planner.pg_window`); the copies still from the scenario runner.
* ``local_dedup``: the store's replica exchange is not in the scenario runner;
  its offload and reload copy 1/R of the replicated bytes over PCIe and the
  reload all-gathers the rest over NVLink (computed from the topology).
* Compute: training 8 x active params x tokens FLOPs for the actor (6 for
  forward/backward, 2 for the old log-probs), 8 for a critic, 2 for each
  scoring role, at ``mfu`` of the GPU's peak (:data:`sim.planner.plan_inputs.GPU_FLOPS`).
* Rollout: needs a KV cache for its batch; with less it runs in waves (time
  grows as need / available), or speed is proportional to KV memory when
  ``tokens_per_s_per_gib`` is given; with ``kv_gib`` given the need is strict.
  Its full-memory time is decode-bound by HBM reads unless given.
* Switch overlap (``overlap=True``): the outgoing role's D2H runs alongside the
  incoming role's H2D on the duplex link; only then does the order of roles
  change the switch time (serial switching sums the same copies in any order).
"""
from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from refimpl.comm import PGPolicy
from sim.planner.plan_inputs import (GiB, GpuSpec, Layout, Machine, ModelShape, PlanInputError, RoleState,
                            Workload, gpu_flops, model_preset, role_state)
from sim.planner.layout_cost import LayoutCost, layout_cost, micro_batches
from sim.planner.plan_sim import SIM_TENSORS, quiet_protocol_logs, simulate_node  # noqa: F401 (SIM_TENSORS re-exported)
from sim.planner.plan_rank import ROLE_ABBREV, Candidate, Outcome, pareto, rank, recommend, ties  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

#: the offload settings of trained roles, besides every non-empty subset of the store categories
OFFLOAD_SETS: tuple[tuple[str, ...], ...] = (
    (), ("params",), ("grads",), ("optimizer",), ("params", "grads"), ("params", "optimizer"),
    ("grads", "optimizer"), ("params", "grads", "optimizer"), ("fsdp_cpu",),
)
#: ``none`` (no lifecycle) and every policy of :class:`refimpl.comm.PGPolicy` (``suspend_planned`` included)
PG_POLICIES = ("none", *(p.value for p in PGPolicy))
#: what the PG-policy switch costs are simulated over: ``layout`` the groups of the plan's own layout (in the
#: scenario runner), ``megatron`` the 14 Megatron group families per rank of the dp x tp mesh (the lifecycle
#: driver of ``timeshare bench switch-window``, :mod:`sim.calibrate.switch_window`)
PG_GROUPS = ("layout", "megatron")
#: the lifecycle driver's steps per policy and the steps left out of its means (as the 2 x H200 measurement)
PG_STEPS, PG_WARMUP = 4, 2
#: assumption: CUDA context, allocator slack and workspace kept on every GPU
RESERVE_GIB = 2.0
#: assumption: fraction of HBM bandwidth a decode step reaches
DECODE_HBM_EFF = 0.6
#: what a role's turn holds on a GPU, in words (:meth:`Planner.memory_driver` names the largest)
MEMORY_TERMS = {
    "reserve": "the CUDA context and allocator reserve",
    "communicators": "the NCCL communicators",
    "other_roles_state": "the state of the other roles kept on the GPU",
    "state": "the role's own state (weights, gradients, optimizer)",
    "layer_activations": "one layer's activations of the micro-batch",
    "logits": "the fp32 logits over the vocabulary and their gradient",
    "checkpointed_inputs": "the checkpointed layer inputs of the micro-batch",
}
#: the terms that grow with the micro-batch (a smaller one shrinks them in proportion)
MICRO_BATCH_TERMS = ("layer_activations", "logits", "checkpointed_inputs")



@dataclass
class PlanInputs:
    """Everything a plan is made from (see :func:`make_plan`)."""

    model: ModelShape
    cluster: str = "hgx-h200-8x"
    nodes: int = 1
    layout: Layout = field(default_factory=Layout)
    workload: Workload = field(default_factory=Workload)
    gpu: GpuSpec | None = None
    overlap: bool = False
    exhaustive: bool = False
    top: int = 3  # offload settings carried from the first stage to the PG-policy stage
    reserve_gib: float = RESERVE_GIB
    pg_groups: str = "layout"  # see PG_GROUPS
    cooldown_s: float = 2.0  # port-release cooldown of the destroying policies (pg_groups "megatron")
    wake_proxies: bool = True  # the runtime wakes NCCL's proxy in a destroy (TorchRuntime's default; pg_groups "megatron")
    gpus_per_node: int | None = None  # use only the first N GPUs of each node of the preset (None: all)
    # (offload, backend, score_offload, pg_policy) -> whether the user's framework can express it (None: all can)
    allow: Callable[[tuple[str, ...], str, bool, str], bool] | None = None
    layouts: list[Layout] | None = None  # other layouts to compare (sim.planner.layout_stage); None: only ``layout``
    # whether the rollout shares these GPUs (colocated); False: the training pool of a split, the rollout on GPUs of
    # its own (sim.planner.split): no engine here, no KV cache to leave it, no rollout time in the step
    rollout_here: bool = True
    split: bool = True  # also say whether splitting the GPUs into a rollout and a training pool is faster
    crossover: bool = False  # and where that answer turns (response length, model size, GPUs): a sweep of plans


class Planner:
    """Evaluates candidates for one set of inputs; simulations are cached across candidates."""

    def __init__(self, inputs: PlanInputs, progress: Callable[[str], None] | None = None):
        self.inp = inputs
        from sim.presets import preferred_preset

        # the preset name (its calibrated variant where one is shipped), or its data cut to gpus_per_node
        self.cluster_ref: Any = preferred_preset(inputs.cluster)
        if inputs.gpus_per_node is not None:
            from sim.presets import PresetError, first_gpus, load_preset_data

            try:
                self.cluster_ref = first_gpus(load_preset_data(self.cluster_ref), inputs.gpus_per_node)
            except PresetError as exc:
                raise PlanInputError(f"--gpus-per-node / --cluster: {exc}") from None
        self.m = Machine(self.cluster_ref, inputs.nodes)
        self.lay = inputs.layout.resolved(inputs.model, self.m.gpus, self.m.gpu_bytes)
        if inputs.gpu is None:
            flops, src = gpu_flops(inputs.cluster)
            inputs.gpu = GpuSpec(flops, src)
        self.gpu = inputs.gpu
        self.w = inputs.workload
        self.progress = progress or log.info
        self.tick: Callable[[str], None] | None = None  # called once per candidate evaluated (a progress bar)
        if inputs.pg_groups not in PG_GROUPS:
            raise PlanInputError(f"--pg-groups: expected one of {', '.join(PG_GROUPS)}, got {inputs.pg_groups!r}")
        if not inputs.cooldown_s >= 0:
            raise PlanInputError(f"--cooldown-s: expected a number >= 0, got {inputs.cooldown_s}")
        self.pg_windows: dict[str, dict[str, float]] = {}
        self.sims: dict[tuple, dict[str, float]] = {}
        self.sim_wall_s = 0.0
        model = inputs.model
        self.states: dict[str, RoleState] = {"actor_train": role_state(model, self.lay, trained=True)}
        if self.w.critic:
            self.states["critic"] = role_state(model, self.lay, trained=True)
        if self.w.reference:
            self.states["reference"] = role_state(model, self.lay, trained=False)
        if self.w.reward_model is not None:
            self.states["reward"] = role_state(self.w.reward_model, self.lay, trained=False)
        self.rollout_here = inputs.rollout_here
        self.engine_bytes = model.params * 2 / self.lay.rollout_tp if inputs.rollout_here else 0.0
        seq = self.w.prompt_len + self.w.response_len
        self.kv_need = (self.w.kv_gib * GiB if self.w.kv_gib is not None
                        else self.w.sequences * seq * model.kv_bytes_per_token / self.m.gpus)
        self.kv_min = seq * model.kv_bytes_per_token / self.lay.rollout_tp  # one sequence per engine
        self.rollout_full = self.w.rollout_s if self.w.rollout_s is not None else self.decode_s(self.kv_need)

    @property
    def kv_need_gib(self) -> float | None:
        """The KV cache the rollout needs per GPU (GiB), or None when the rollout is not on these GPUs."""
        return self.kv_need / GiB if self.rollout_here else None

    # ------------------------------------------------------------------ simulation

    def _mesh(self) -> tuple[int, int]:
        """(dp, tp) of the simulated node: the layout's tp where it divides the node's GPUs."""
        n = min(self.m.per_node, self.m.gpus)
        tp = math.gcd(self.lay.tp, n)
        return n // tp, tp

    def megatron_mesh(self) -> dict[str, int]:
        """The Megatron sizes of the simulated node (:func:`sim.calibrate.switch_window.megatron_groups`): the layout's tp, pp,
        cp and ep where they divide the node's GPUs (each cut to the part that does), dp the rest."""
        n = min(self.m.per_node, self.m.gpus)
        tp = math.gcd(self.lay.tp, n)
        pp = math.gcd(self.lay.pp, n // tp)
        cp = math.gcd(getattr(self.lay, "cp", 1), n // (tp * pp))
        ep = math.gcd(self.lay.ep, n // pp)
        return {"tp": tp, "pp": pp, "cp": cp, "dp": n // (tp * pp * cp), "ep": ep}

    def pg_window(self, pg_policy: str) -> dict[str, float]:
        """The switch cost of ``pg_policy`` over the Megatron group families of the node's mesh (:meth:`megatron_mesh`:
        the layout's tp, pp, cp and ep; cached).

        The lifecycle driver of ``timeshare bench switch-window`` on a simulated world of the plan's cluster:
        :data:`PG_STEPS` steps with no training time and the plan's full-memory rollout time, means of the steps
        after :data:`PG_WARMUP`, slowest rank. ``first_use``: what the training step's first collectives after the wake
        cost beyond the same collectives on live groups (lazy NCCL init of rebuilt groups), charged to the training
        turn; ``switch_cost``: the window plus that ([Note: the switch cost] in :mod:`sim.machine.switch_cost`), what the
        plan's step pays for the policy. ``held``: NCCL bytes kept in the rollout.
        ``none`` (no lifecycle) costs nothing and holds what ``paused_live`` holds.
        """
        if pg_policy in self.pg_windows:
            return self.pg_windows[pg_policy]
        from sim.calibrate.switch_window import simulate, summarize

        pol = PGPolicy.parse("paused_live" if pg_policy == "none" else pg_policy)
        t0 = time.perf_counter()
        with quiet_protocol_logs():
            per_rank = simulate(pol, **self.megatron_mesh(), steps=PG_STEPS, train_s=0.0, rollout_s=self.rollout_full,
                                cooldown_s=self.inp.cooldown_s, topology=self.cluster_ref,
                                wake_proxies=self.inp.wake_proxies)
        self.sim_wall_s += time.perf_counter() - t0
        r = summarize(pol, per_rank, PG_WARMUP)
        held = (r.held_in_rollout_gib or 0.0) * GiB
        if pg_policy == "none":
            out = {"sleep": 0.0, "update_weights": 0.0, "wake_up": 0.0, "total": 0.0, "first_use": 0.0,
                   "switch_cost": 0.0, "held": held}
        else:
            out = {"sleep": r.sleep, "update_weights": r.update_weights, "wake_up": r.wake_up, "total": r.total,
                   "first_use": r.first_use_extra, "switch_cost": r.switch_cost, "held": held}
        self.pg_windows[pg_policy] = out
        return out

    def _simulate(self, role: str, include: tuple[str, ...], pg_policy: str) -> dict[str, float]:
        """Offload/reload and lifecycle costs of ``role`` from one simulated node (cached)."""
        if self.inp.pg_groups == "megatron" and role in ("actor_train", "critic"):
            # the copies from the scenario runner without a lifecycle, the lifecycle from the switch-window driver
            out = dict(self._simulate_node(role, include, "none"))
            win, live = self.pg_window(pg_policy), self.pg_window("none")
            st = self.states[role]
            out["offload_s"] += win["sleep"]
            out["sync_s"] += win["update_weights"]
            out["reload_s"] += win["wake_up"]
            out["train_overhead_s"] += win["first_use"]
            out["comm_train"] = max(out["comm_train"], live["held"])  # every family is up while training
            out["rollout_resident"] = st.total - sum(st.bytes[x] for x in include) + win["held"]
            return out
        return self._simulate_node(role, include, pg_policy)

    def _simulate_node(self, role: str, include: tuple[str, ...], pg_policy: str) -> dict[str, float]:
        """Offload/reload and lifecycle (of the layout's groups) costs of ``role`` from one simulated node (cached)."""
        return simulate_node(self, role, include, pg_policy)

    # ------------------------------------------------------------------ one candidate

    def _ideal_compute_s(self, role: str) -> float:
        """A role's FLOPs per step divided over every GPU at the GPU's MFU (no layout costs)."""
        flops_per_token = {"actor_train": 8, "critic": 8, "reference": 2, "reward": 2}[role]
        model = self.w.reward_model if role == "reward" else self.inp.model
        return flops_per_token * model.active_params * self.w.tokens / (self.m.gpus * self.gpu.flops * self.gpu.mfu)

    def layout_cost(self, role: str) -> LayoutCost:
        """What the layout adds to ``role``'s turn: TP all-reduces, FSDP gathers, PP bubble, CP and EP all-to-alls."""
        model = self.w.reward_model if role == "reward" else self.inp.model
        return layout_cost(model, self.lay, self.w, self.m, self._ideal_compute_s(role),
                           trained=role in ("actor_train", "critic"))

    def _compute_s(self, role: str) -> float:
        return self._ideal_compute_s(role) + self.layout_cost(role).total

    def _activation_terms(self, role: str) -> dict[str, float]:
        """Bytes of ``role``'s activations in its turn, per :data:`MEMORY_TERMS` name: one layer's activations
        (recomputed under checkpointing), the fp32 logits over the vocabulary and their gradient, and (trained
        roles) the checkpointed layer inputs of the micro-batches in flight."""
        model = self.w.reward_model if role == "reward" else self.inp.model
        t, tp = self.w.micro_batch_tokens / self.lay.cp, self.lay.tp
        out = {"layer_activations": t * model.hidden * 34 / tp, "logits": t * model.vocab * 8 / tp}
        if role in ("actor_train", "critic"):
            # 1F1B: the first stage holds the checkpointed inputs of up to pp micro-batches in flight
            in_flight = min(self.lay.pp, micro_batches(self.w, self.lay))
            out["checkpointed_inputs"] = in_flight * t * model.hidden * 2 * model.layers / self.lay.pp / tp
        return out

    def _activations(self, role: str) -> float:
        return sum(self._activation_terms(role).values())

    def _fsdp_cpu_train(self, role: str, compute: float) -> tuple[float, float]:
        """(train time, added time) of a trained role under CPUOffloadPolicy: shards copied in per pass, CPU Adam."""
        st = self.states[role]
        params_shard = st.bytes["params"] / 2  # parameters on this rank
        micro = math.ceil(self.w.tokens / (self.lay.dp * self.w.micro_batch_tokens))
        h2d = micro * 2 * params_shard * 4  # fp32 shards in, forward and backward
        d2h = micro * params_shard * 4  # fp32 reduce-scattered grads out
        copy = max(h2d / self.m.pcie, d2h / self.m.pcie, (h2d + d2h) / self.m.duplex)
        adam = params_shard / self.gpu.cpu_adam_params_per_s
        total = max(compute, copy) + adam
        return total, total - compute

    def _switch(self, off_s: float, on_s: float) -> float:
        if not self.inp.overlap or not off_s or not on_s:
            return off_s + on_s
        each = min(self.m.pcie, self.m.duplex / 2)  # both directions at once
        a, b = max(off_s, on_s) * self.m.pcie, min(off_s, on_s) * self.m.pcie  # bytes-equivalent
        return b / each + (a - b) / self.m.pcie

    def evaluate(self, c: Candidate) -> Outcome:
        """Cost of one candidate (see the module docstring for what is simulated): the roles' switch costs, the
        memory of each turn and the KV cache left to the rollout, why it does not fit, and the step's timeline."""
        roles = list(c.order) or self.w.roles()
        trained = [r for r in roles if r in ("actor_train", "critic")]
        scoring = [r for r in roles if r in ("reference", "reward")]
        cpu_policy = c.offload == ("fsdp_cpu",)
        include = () if cpu_policy else tuple(x for x in ("params", "grads", "optimizer") if x in c.offload)
        costs, resident, pinned = self._role_costs(c, trained, scoring, include)
        turns, fixed, kv = self._memory(costs, resident, trained + scoring, include, cpu_policy)
        reasons = self._reasons(costs, turns, kv, pinned)
        rollout_s = self._rollout_s(kv)
        compute = {}
        for r in trained + scoring:
            base = self._compute_s(r)
            if cpu_policy and r in trained:
                base, _added = self._fsdp_cpu_train(r, base)
            compute[r] = base
        timeline, switch = self._timeline(roles, trained, costs, compute, rollout_s, include)
        step = rollout_s + sum(compute.values()) + switch
        in_rollout = fixed + min(max(kv, 0.0), self.kv_need)
        peak = max([*turns.values(), in_rollout])
        memory = {r: v / GiB for r, v in turns.items()}
        memory["rollout"] = in_rollout / GiB
        offloaded = {r: list(c.offload if cpu_policy else include) for r in trained if cpu_policy or include}
        offloaded.update({r: ["params"] for r in scoring if c.score_offload})
        return Outcome(c, not reasons, "; ".join(reasons), step, switch, compute, rollout_s, peak / GiB,
                       max(kv, 0.0) / GiB, pinned / GiB, pinned * self.m.per_node / GiB, timeline,
                       {r: self.layout_cost(r).as_dict() for r in trained + scoring}, memory, offloaded)

    def _role_costs(self, c: Candidate, trained: list[str], scoring: list[str], include: tuple[str, ...]
                    ) -> tuple[dict[str, dict[str, float]], dict[str, float], float]:
        """(switch costs per role, bytes each role keeps on the GPU between its turns, pinned host bytes per rank)
        of candidate ``c``: the trained roles' simulated copies (``local_dedup`` moving 1/R of the replicated bytes
        over PCIe and all-gathering the rest), the scoring roles' weights, the engine's sleeping weights."""
        cpu_policy = c.offload == ("fsdp_cpu",)
        costs: dict[str, dict[str, float]] = {}
        resident: dict[str, float] = {}
        pinned = 0.0
        for r in trained:
            s = dict(self._simulate(r, include, c.pg_policy))
            st = self.states[r]
            off_b = sum(st.bytes[x] for x in include)
            if c.backend == "local_dedup" and include:
                rep = sum(st.replicated[x] for x in include)
                if rep:
                    f, R = rep / off_b, st.replicas
                    keep = 1 - f + f / R
                    s["offload_s"] *= keep
                    s["reload_s"] = s["reload_s"] * keep + rep * (R - 1) / R / self.m.nvlink_eff
                    s["pinned"] -= rep * (1 - 1 / R)
            costs[r] = s
            resident[r] = 0.0 if cpu_policy else st.total - off_b
            pinned += st.total if cpu_policy else s["pinned"]
        for r in scoring:
            s = self._simulate(r, ("params",) if c.score_offload else (), "none")
            costs[r] = s
            resident[r] = 0.0 if c.score_offload else self.states[r].total
            pinned += s["pinned"]
        pinned += self.engine_bytes  # the engine's weights sleep in host memory (vLLM sleep level 1)
        return costs, resident, pinned

    def _memory(self, costs: dict[str, dict[str, float]], resident: dict[str, float], roles: list[str],
                include: tuple[str, ...], cpu_policy: bool) -> tuple[dict[str, float], float, float]:
        """(GPU bytes in use in each role's turn, bytes held through the rollout besides its KV cache, the KV
        cache bytes left to the rollout)."""
        reserve = self.inp.reserve_gib * GiB
        turns = {r: sum(self._turn_terms(r, costs, resident, cpu_policy).values()) for r in roles}
        actor_rollout = costs["actor_train"]["rollout_resident"]  # resident actor state + communicators kept
        st_a = self.states["actor_train"]
        comm_rollout = max(0.0, actor_rollout - (st_a.total - sum(st_a.bytes[x] for x in include)))
        fixed = reserve + comm_rollout + sum(resident.values()) + self.engine_bytes
        return turns, fixed, self.m.gpu_bytes - fixed

    def _turn_terms(self, role: str, costs: dict[str, dict[str, float]], resident: dict[str, float],
                    cpu_policy: bool) -> dict[str, float]:
        """Bytes in use on a GPU in ``role``'s turn, per :data:`MEMORY_TERMS` name."""
        trained_on_cpu = cpu_policy and role in ("actor_train", "critic")
        own = 0.0 if trained_on_cpu else self.states[role].total
        if trained_on_cpu:
            own += 2 * self.inp.model.params * 2 / max(1, self.inp.model.layers) / self.lay.tp  # two unsharded layers
        return {"reserve": self.inp.reserve_gib * GiB, "communicators": costs["actor_train"]["comm_train"],
                "other_roles_state": sum(v for k, v in resident.items() if k != role), "state": own,
                **self._activation_terms(role)}

    def memory_driver(self, outcome: Outcome) -> dict[str, Any] | None:
        """What fills the GPU in the largest turn of an ``outcome`` that does not fit it, or None when its turns fit:
        the role, its need, the terms in GiB, the biggest, and the micro-batch (tokens) that would fit, 0 if none."""
        turns = {r: v for r, v in outcome.memory_gib.items() if r != "rollout"}
        role = max(turns, key=turns.get)
        gpu = self.m.gpu_bytes
        if turns[role] * GiB <= gpu:
            return None
        c = outcome.candidate
        cpu_policy = c.offload == ("fsdp_cpu",)
        include = () if cpu_policy else tuple(x for x in ("params", "grads", "optimizer") if x in c.offload)
        roles = [r for r in (list(c.order) or self.w.roles()) if r != "rollout"]
        costs, resident, _pinned = self._role_costs(c, [r for r in roles if r in ("actor_train", "critic")],
                                                    [r for r in roles if r in ("reference", "reward")], include)
        terms = self._turn_terms(role, costs, resident, cpu_policy)
        need = sum(terms.values())
        micro = sum(terms.get(t, 0.0) for t in MICRO_BATCH_TERMS)
        tokens = self.w.micro_batch_tokens
        fit = int(tokens * (gpu - (need - micro)) / micro) if micro > 0 and gpu > need - micro else 0
        biggest = max(terms, key=terms.get)
        model = self.w.reward_model if role == "reward" else self.inp.model
        return {"role": role, "need_gib": need / GiB, "gpu_gib": gpu / GiB, "biggest": biggest,
                "terms_gib": {k: v / GiB for k, v in terms.items()}, "micro_batch_tokens": tokens,
                "micro_batch_tokens_that_fit": min(fit, tokens - 1), "sequence_tokens": self.w.prompt_len + self.w.response_len,
                "vocab": model.vocab, "layers": model.layers, "hidden": model.hidden, "candidate": c.label()}

    def _reasons(self, costs: dict[str, dict[str, float]], turns: dict[str, float], kv: float,
                 pinned: float) -> list[str]:
        """Why a candidate does not fit (empty when it does): a simulation that failed, a turn larger than the GPU,
        a rollout without the KV cache it needs, pinned host memory beyond the node's."""
        reasons = [costs[r]["failed"] for r in costs if costs[r].get("failed")]
        worst = max(turns, key=turns.get)
        if turns[worst] > self.m.gpu_bytes:
            reasons.append(f"{worst} needs {turns[worst] / GiB:.1f} GiB of a {self.m.gpu_bytes / GiB:.1f} GiB GPU")
        need = self.w.kv_gib * GiB if self.w.kv_gib is not None else self.kv_min
        if kv < need and self.rollout_here:
            what = ("needs the {:.1f} asked for" if self.w.kv_gib is not None else
                    "needs at least {:.1f} for one sequence").format(need / GiB)
            reasons.append(f"rollout gets {max(kv, 0) / GiB:.1f} GiB of KV cache, {what}")
        if pinned * self.m.per_node > self.m.host_per_node:
            reasons.append(f"pinned host {pinned * self.m.per_node / GiB:.0f} GiB exceeds the node's {self.m.host_per_node / GiB:.0f} GiB")
        return reasons

    def _rollout_s(self, kv: float) -> float:
        """The rollout's time with ``kv`` bytes of KV cache per GPU (:meth:`rollout_time` on these GPUs)."""
        if not self.rollout_here:
            return 0.0
        return self.rollout_time(self.kv_need, min(max(kv, 1.0), self.kv_need), self.m.gpus)

    def decode_s(self, kv: float) -> float:
        """Decode-bound seconds of ``response_len`` decode steps, each reading the engine's weights and the average of
        ``kv`` bytes of KV cache per GPU (the batch's, as it grows from the prompts to the full responses)."""
        seq = self.w.prompt_len + self.w.response_len
        engine = self.inp.model.params * 2 / self.lay.rollout_tp
        avg_kv = kv * (self.w.prompt_len + self.w.response_len / 2) / seq
        return self.w.response_len * (engine + avg_kv) / (self.m.hbm_bw * DECODE_HBM_EFF)

    def rollout_time(self, kv_need: float, kv_used: float, gpus: int) -> float:
        """The rollout's seconds on ``gpus`` GPUs that need ``kv_need`` bytes of KV cache each and get ``kv_used``:
        in waves of ``kv_used`` when that is less (each wave decodes the full response, reading the weights and its
        own KV), or, with a speed per GiB given, in proportion to the memory. With ``rollout_s`` given (the time on
        this plan's GPUs with all the KV they need) the decode estimate is scaled to it."""
        if self.w.tokens_per_s_per_gib:
            gen = self.w.sequences * self.w.response_len
            return gen / (gpus * self.w.tokens_per_s_per_gib * kv_used / GiB)
        seconds = self.decode_s(kv_used) * max(1.0, kv_need / kv_used)
        if self.w.rollout_s is not None:
            seconds *= self.w.rollout_s / self.decode_s(self.kv_need)
        return seconds

    def _timeline(self, roles: list[str], trained: list[str], costs: dict[str, dict[str, float]],
                  compute: dict[str, float], rollout_s: float, include: tuple[str, ...]
                  ) -> tuple[list[tuple[str, str, float]], float]:
        """(the step's segments in order, the seconds spent switching): the roles' turns and the switches between
        them along ``roles``, the weight sync before the rollout, the first collectives after a wake."""
        # the trained roles' first collectives after the wake (lazy NCCL init of rebuilt groups) are switch cost
        # ([Note: the switch cost] in sim.machine.switch_cost), paid at the start of their compute turn
        first_use = {r: costs[r]["train_overhead_s"] for r in trained}
        switch = sum(first_use.values())
        timeline: list[tuple[str, str, float]] = []
        for i, r in enumerate(roles):
            nxt = roles[(i + 1) % len(roles)]
            if r == "rollout":
                timeline.append((r, "compute", rollout_s))
                continue
            if first_use.get(r):
                timeline.append((r, "first use after wake", first_use[r]))
            timeline.append((r, "compute", compute[r]))
            off = costs[r]["offload_s"]
            if nxt == "rollout":
                # the engine's share of the weights gathered from the training shards over NVLink
                shards = min(self.m.gpus, self.lay.fsdp * self.lay.tp * self.lay.pp)
                sync = costs["actor_train"]["sync_s"] + self.engine_bytes * (1 - 1 / shards) / self.m.nvlink_eff
                if r != "actor_train" and "params" in include:  # the actor's params must come back for the export
                    sync += self.states["actor_train"].bytes["params"] / self.m.pcie
                timeline.append((r, "switch out", off))
                timeline.append(("rollout", "weight sync", sync))
                switch += off + sync
                continue
            on = costs[nxt]["reload_s"]
            t = self._switch(off, on)
            timeline.append((f"{r}->{nxt}", "switch", t))
            switch += t
        first = roles[1] if len(roles) > 1 else None
        if first is not None:
            timeline.insert(1, (f"rollout->{first}", "switch", costs[first]["reload_s"]))
            switch += costs[first]["reload_s"]
        return timeline, switch

    # ------------------------------------------------------------------ search

    def orders(self) -> list[tuple[str, ...]]:
        """Valid role orders: rollout first, the actor's update last (it needs every other role's output)."""
        middle = [r for r in self.w.roles() if r not in ("rollout", "actor_train")]
        return [("rollout", *p, "actor_train") for p in itertools.permutations(middle)]

    def offload_candidates(self) -> list[Candidate]:
        """Stage 1: every offload setting (and backend, and scoring-role offload) under pg ``none``."""
        out = []
        score_opts = (True, False) if (self.w.reference or self.w.reward_model is not None) else (False,)
        st = self.states["actor_train"]
        for off in OFFLOAD_SETS:
            backends = ["local"]
            if off and off != ("fsdp_cpu",) and any(st.replicated[x] for x in off):
                backends.append("local_dedup")
            for b in backends:
                for so in score_opts:
                    out.append(Candidate(off, b, so, "none", self.orders()[0]))
        if self.inp.allow is not None:
            out = [c for c in out if self.inp.allow(c.offload, c.backend, c.score_offload, c.pg_policy)]
        return out

    def pg_candidates(self, c: Candidate) -> list[Candidate]:
        """Stage 2: ``c`` under every PG policy other than ``none`` that the user's framework can express."""
        out = [Candidate(c.offload, c.backend, c.score_offload, p, c.order) for p in PG_POLICIES if p != "none"]
        if self.inp.allow is not None:
            out = [x for x in out if self.inp.allow(x.offload, x.backend, x.score_offload, x.pg_policy)]
        return out

    def staged_size(self) -> int:
        """How many candidates the staged search evaluates (at most; for a progress bar)."""
        n_pg = len(self.pg_candidates(Candidate(("params",), "local", True, "none", self.orders()[0])))
        return len(self.offload_candidates()) + self.inp.top * n_pg + len(self.orders()) - 1

    def search(self) -> list[Outcome]:
        """Evaluate the candidates (staged unless ``exhaustive``) and return them ranked."""
        n_off, n_ord = len(self.offload_candidates()), len(self.orders())
        if self.inp.exhaustive:
            cands = [Candidate(c.offload, c.backend, c.score_offload, p, o)
                     for c in self.offload_candidates() for p in PG_POLICIES for o in self.orders()]
            self.progress(f"plan: exhaustive search of {len(cands)} candidates, at most "
                          f"{len(OFFLOAD_SETS) * len(PG_POLICIES) * len(self.states)} simulations of about 0.1 s each")
            return rank(self._run(cands, "every combination"))
        self.progress(f"plan: staged search of about {n_off + self.inp.top * (len(PG_POLICIES) - 1) + n_ord - 1} candidates "
                      f"(--exhaustive: {n_off * len(PG_POLICIES) * n_ord})")
        stage1 = rank(self._run(self.offload_candidates(), "offload settings"))
        rec1, _why = recommend(stage1, self.kv_need_gib)  # the tie-aware pick goes on whatever the faster ones get
        best = [o.candidate for o in stage1 if o.feasible and (rec1 is None or o.candidate != rec1.candidate)]
        best = ([rec1.candidate] if rec1 else []) + best[: self.inp.top - (1 if rec1 else 0)]
        best = best or [o.candidate for o in stage1[: self.inp.top]]
        stage2 = self._run([x for c in best for x in self.pg_candidates(c)], "process-group policies")
        ranked = rank(stage1 + stage2)
        pick, _why = recommend(ranked, self.kv_need_gib)
        lead = (pick or ranked[0]).candidate
        stage3 = self._run([Candidate(lead.offload, lead.backend, lead.score_offload, lead.pg_policy, o)
                            for o in self.orders()[1:]], "role orders")
        return rank(ranked + stage3)

    def _run(self, cands: list[Candidate], what: str) -> list[Outcome]:
        out = []
        step = max(1, len(cands) // 4)
        for i, c in enumerate(cands):
            if i % step == 0 and cands and self.tick is None:
                self.progress(f"plan: {what}: {i}/{len(cands)} evaluated, {len(self.sims)} simulations so far")
            out.append(self.evaluate(c))
            if self.tick is not None:
                self.tick(what)
        return out


def memory_words(d: dict[str, Any]) -> str:
    """One clause saying what drives the memory of a turn that does not fit (:meth:`Planner.memory_driver`): the
    biggest term with its GiB and what it is made of, and the micro-batch that would fit."""
    tokens, seq = d["micro_batch_tokens"], d["sequence_tokens"]
    made = f"{tokens:,} tokens a micro-batch"
    if tokens % seq == 0:
        made += f" ({tokens // seq} sequences of {seq:,} tokens)"
    detail = {"logits": f": {made} x {d['vocab']:,} vocabulary x 8 bytes",
              "checkpointed_inputs": f": {made} x {d['layers']} layers x {d['hidden']:,} hidden x 2 bytes",
              "layer_activations": f": {made}"}.get(d["biggest"], "")
    text = (f"the largest part of the {d['role']}'s {d['need_gib']:.1f} GiB is {MEMORY_TERMS[d['biggest']]}, "
            f"{d['terms_gib'][d['biggest']]:.1f} GiB{detail}")
    fit = d["micro_batch_tokens_that_fit"]
    if fit >= 1:
        text += f"; a micro-batch of at most {fit:,} tokens fits"
        if fit >= seq:
            text += f" ({fit // seq} sequences)"
    elif d["biggest"] in MICRO_BATCH_TERMS:
        text += "; even a micro-batch of one token does not fit beside the rest"
    return text


def _does_not_fit(planner: Planner, ranked: list[Outcome], why: str) -> tuple[dict[str, Any] | None, str]:
    """(what drives the memory of the candidate closest to fitting a GPU, the reason with it) when nothing fits."""
    over = [o for o in ranked if o.memory_gib and max(v for r, v in o.memory_gib.items() if r != "rollout")
            > planner.m.gpu_bytes / GiB]
    if not over:
        return None, why
    closest = min(over, key=lambda o: max(v for r, v in o.memory_gib.items() if r != "rollout"))
    driver = planner.memory_driver(closest)
    if driver is None:
        return None, why
    return driver, f"does not fit: {closest.reason}; {memory_words(driver)}"


def make_plan(inputs: PlanInputs, progress: Callable[[str], None] | None = None,
              tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the search; returns a JSON-ready plan: inputs, the layouts compared, ranked outcomes, the ties and the
    recommendation. ``tick`` is called once per candidate evaluated (a progress bar over :func:`plan_size`)."""
    from dataclasses import replace

    t0 = time.perf_counter()
    layouts: list[dict[str, Any]] = []
    layout_stats: dict[str, Any] = {}
    if inputs.layouts:
        from sim.planner.layout_stage import compare_layouts

        chosen, layouts = compare_layouts(inputs, Planner, progress, tick)
        layout_stats = layouts.pop()["stats"]
        inputs = replace(inputs, layout=chosen, layouts=None)
    planner = Planner(inputs, progress)
    planner.tick = tick
    ranked = planner.search()
    best, why = recommend(ranked, planner.kv_need_gib)
    driver = None
    if best is None:
        driver, why = _does_not_fit(planner, ranked, why)
    split = cross = None
    if inputs.split and inputs.rollout_here:
        from sim.planner.split import colocate_or_split, crossover

        split = colocate_or_split(inputs, planner, best)
        if tick is not None:
            tick("colocate or split")
        if inputs.crossover:
            cross = crossover(inputs, planner, tick=tick)
    return {
        "inputs": {
            "model": asdict(inputs.model),
            "cluster": inputs.cluster,
            "nodes": inputs.nodes,
            "gpus_per_node": inputs.gpus_per_node,
            "gpus": planner.m.gpus,
            "gpu_gib": planner.m.gpu_bytes / GiB,
            "layout": asdict(planner.lay),
            "workload": {**{k: v for k, v in asdict(inputs.workload).items() if k != "reward_model"},
                         "reward_model": inputs.workload.reward_model.name if inputs.workload.reward_model else None,
                         "tokens": inputs.workload.tokens},
            "gpu": asdict(planner.gpu),
            "overlap": inputs.overlap,
            "pg_groups": inputs.pg_groups,
            "cooldown_s": inputs.cooldown_s,
            "wake_proxies": inputs.wake_proxies,
            "kv_need_gib": planner.kv_need / GiB,
            "rollout_full_s": planner.rollout_full,
            "engine_gib": planner.engine_bytes / GiB,
        },
        "layouts": layouts,
        "layout_search": layout_stats,  # simulations of the layout stage, layouts ranked without one, why the layout
        "outcomes": [o.to_dict() for o in ranked],
        "ties": [o.candidate.label() for o in ties(ranked)],
        "recommendation": best.to_dict() if best else None,
        "reason": why,
        "memory_driver": driver,  # when nothing fits: what fills the GPU in the turn closest to fitting
        "split": split,  # colocated or split into a rollout and a training pool (sim.planner.split)
        "crossover": cross,  # with inputs.crossover: where the faster of the two changes
        # pg_groups "megatron": each policy's switch window (sleep, update_weights, wake_up, total; s) over the
        # Megatron families of the node's mesh, as `timeshare bench switch-window` reports it
        "pg_switch_windows": {p: {k: v for k, v in w.items() if k != "held"} for p, w in planner.pg_windows.items()},
        "simulations": (len(planner.sims) + len(planner.pg_windows) + layout_stats.get("simulations", 0)
                        + (split or {}).get("simulations", 0)),
        "simulation_wall_s": planner.sim_wall_s + layout_stats.get("simulation_wall_s", 0.0),
        "wall_s": time.perf_counter() - t0,
    }


def plan_size(inputs: PlanInputs) -> int:
    """About how many candidates :func:`make_plan` evaluates (the total of a progress bar); 0 if unknown."""
    from dataclasses import replace

    try:
        planner = Planner(replace(inputs, layouts=None))
    except PlanInputError:
        return 0
    from sim.planner.layout_stage import SHORTLIST

    from sim.planner.split import SWEEPS

    n = len(planner.offload_candidates())
    size = planner.staged_size() + n * (1 + min(SHORTLIST, len(inputs.layouts))) if inputs.layouts else planner.staged_size()
    if inputs.split and inputs.rollout_here:
        size += 1 + (sum(len(f) for f in SWEEPS.values()) if inputs.crossover else 0)
    return size


def default_inputs() -> PlanInputs:
    """The built-in default: GRPO on Qwen2.5-7B with a reference model, FSDP over one 8xH200 node."""
    return PlanInputs(model=model_preset("Qwen2.5-7B"), cluster="hgx-h200-8x", layout=Layout(dp=8))


__all__ = ["Candidate", "MEMORY_TERMS", "MICRO_BATCH_TERMS", "OFFLOAD_SETS", "memory_words", "Outcome", "PG_GROUPS", "PG_POLICIES", "PlanInputs", "Planner", "default_inputs",
           "make_plan", "pareto", "plan_size", "rank", "recommend", "ties"]

