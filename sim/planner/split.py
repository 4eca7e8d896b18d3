"""Colocated or split: which gives the faster RL step, and where the answer turns.

Colocated (what the rest of the plan evaluates): every role on every GPU, taking turns; the step is the
rollout, the scoring and training turns and the switches between them, one after the other.

Split (one step off policy, as verl's ``one_step_off_policy`` and AReaL's asynchronous trainers run it): the
GPUs are cut into a rollout pool and a training pool; the rollout generates batch k+1 on its pool while the
training pool trains on batch k, one step behind; after each training step the actor's weights go to the
rollout pool (NCCL across the pools). In steady state a step is the slower of the two plus that weight sync:

    split step = max(rollout on R GPUs, training on T = N - R GPUs) + weight sync between the pools

* The rollout pool holds only the engine: its KV cache is the whole GPU but the engine's weights and the
  reserve; its time is the plan's rollout estimate on R GPUs (:meth:`sim.planner.plan.Planner.rollout_time`:
  response-length decode steps reading the weights and the average KV cache, in waves where the KV cache is
  short): fewer GPUs each hold more sequences, so each decode step reads more KV or more waves run. With
  ``--rollout-s`` (the rollout's time on all N GPUs) the estimate is scaled to it; with
  ``--tokens-per-s-per-gib`` its speed follows the KV cache of R GPUs.
* The training pool is planned as the plan plans a colocated step with the rollout elsewhere
  (``PlanInputs.rollout_here=False``): every offload setting the framework can express (the offload stage,
  pg ``none``), the layout's tp, pp and cp with dp over T, the roles' switches simulated, no engine.
* The weight sync moves the actor's bf16 weights to the rollout pool at the NVLink rate inside a node, at the
  node's NICs across nodes (verl's one-step-off trainer reports it under 300 ms for a 7B model).

What it leaves out, and which way it errs: every response is as long as the longest (no long tail), so the
colocated step never waits for stragglers that a split hides; the one-step staleness is an algorithmic choice
the step time does not see. The published speed-ups (:data:`PUBLISHED`) come largely from the long tail: the
model's split gains are lower bounds where the tail is long.

:func:`colocate_or_split` gives the answer for the plan's inputs; :func:`crossover` sweeps the response
length, the model size (layers) and the GPU count and says where the faster one changes;
:mod:`sim.planner.split_check` runs the published setups. The functions take the plan's
:class:`sim.planner.plan.Planner` (``planner``) and build the pools' planners of its class (that module imports
this one).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from sim.planner.plan_inputs import GiB, Layout, ModelShape, PlanInputError

#: a split within this fraction of the colocated step is a tie (assumption: the estimate's error on a step, the
#: switch, layout and rollout terms of docs/plan.md's ties taken together, is about this size)
SPLIT_TIE = 0.05
#: rollout pool sizes simulated: the one whose estimated rollout and training times are closest, and its neighbours
SPLIT_NEIGHBOURS = 1
#: the multi-node preset that a sweep of GPUs past one node uses, and the single-node preset of one node of it
MULTI_NODE = {"hgx-h200-8x": "hgx-h200-8x-ib", "calibrated/hgx-h200-8x": "hgx-h200-8x-ib"}
SINGLE_NODE = {"hgx-h200-8x-ib": "hgx-h200-8x"}
#: the published speed-ups of splitting over colocating, the check the answer states (docs/plan.md has the setups)
PUBLISHED = {
    "verl one_step_off_policy": {
        "range": (1.23, 1.40), "source": "verl docs, advance/one_step_off.md: Qwen2.5-Math-7B, DAPO, 16 H20 "
        "(4 rollout : 12 training), +23% (FSDP2, 20k-token responses) and +40% (Megatron, 8k)"},
    "verl fully_async_policy": {
        "range": (1.72, 2.67), "source": "verl docs, advance/fully_async.md: Qwen2.5-Math-7B, DAPO, 28k-token "
        "responses, 32 to 128 H20, 1.72x to 2.67x (streaming, partial rollout, staleness 0.5)"},
    "AReaL": {
        "range": (1.0, 2.77), "source": "AReaL, arXiv 2505.24298: up to 2.57x (v1) / 2.77x (v2 and later) over "
        "synchronous systems on the same GPUs (math and code reasoning, 1.5B to 32B models)"},
}


@dataclass
class SplitOption:
    """One cut of the GPUs: R for the rollout, T for the training, and what a step costs on it."""

    rollout_gpus: int
    train_gpus: int
    rollout_s: float | None  # None: the rollout pool cannot hold the engine and one sequence
    train_s: float | None  # None: nothing fits the training pool
    sync_s: float
    step_s: float | None
    rollout_kv_gib: float  # KV cache per rollout GPU
    rollout_kv_need_gib: float  # what the rollout needs per rollout GPU for its whole batch at once
    train_candidate: str = ""
    reason: str = ""
    train_offload: dict[str, Any] | None = None  # the training pool's candidate (``Candidate`` fields), for the keys


def rollout_pool(planner: Any, gpus: int) -> tuple[float | None, float, float, str]:
    """(rollout seconds on ``gpus`` GPUs of their own or None, KV GiB per GPU, KV GiB needed per GPU, why not): the
    plan's rollout estimate (:meth:`sim.planner.plan.Planner.rollout_time`) with the whole GPU but the engine and the
    reserve for the KV cache."""
    w, model, m = planner.w, planner.inp.model, planner.m
    rtp = planner.lay.rollout_tp
    engine = model.params * 2 / rtp
    seq = w.prompt_len + w.response_len
    need = (w.kv_gib * GiB * m.gpus / gpus if w.kv_gib is not None
            else w.sequences * seq * model.kv_bytes_per_token / gpus)
    avail = m.gpu_bytes - planner.inp.reserve_gib * GiB - engine
    if avail < seq * model.kv_bytes_per_token / rtp:
        return None, max(avail, 0.0) / GiB, need / GiB, (f"a rollout GPU holds the engine's {engine / GiB:.1f} GiB "
                                                          "and not one sequence's KV cache beside it")
    used = min(avail, need)
    return planner.rollout_time(need, used, gpus), used / GiB, need / GiB, ""


def _train_inputs(inputs: Any, planner: Any, gpus: int) -> Any:
    """The plan's inputs cut to a training pool of ``gpus`` GPUs (the layout's tp, pp, cp; dp over the rest)."""
    lay, m = planner.lay, planner.m
    cp = lay.cp if lay.shard != "all" else math.gcd(lay.cp, gpus)  # FSDP's Ulysses size: the largest that divides
    per = lay.tp * lay.pp * cp
    if gpus % per:
        raise PlanInputError(f"{gpus} GPUs do not take tp x pp x cp = {per}")
    dp = gpus // per
    fsdp = dp if lay.fsdp == lay.dp or dp % lay.fsdp else lay.fsdp
    layout = replace(lay, dp=dp, cp=cp, fsdp=fsdp, eddp=0, rollout_tp=1)
    if inputs.nodes == 1:
        return replace(inputs, gpus_per_node=gpus, layout=layout, layouts=None, rollout_here=False)
    if gpus % m.per_node:
        raise PlanInputError(f"{gpus} GPUs are not whole nodes of {m.per_node}")
    nodes = gpus // m.per_node
    cluster = inputs.cluster if nodes > 1 else SINGLE_NODE.get(inputs.cluster)
    if cluster is None:
        raise PlanInputError(f"one node of {inputs.cluster}: no single-node preset of it")
    return replace(inputs, cluster=cluster, nodes=nodes, layout=layout, layouts=None, rollout_here=False)


def train_pool(inputs: Any, planner: Any, gpus: int) -> tuple[Any | None, str, int]:
    """(the recommended outcome of the training roles on ``gpus`` GPUs with the rollout elsewhere, or None; why; how
    many simulations it took)."""
    from sim.planner.plan_rank import rank, recommend

    try:
        pool = type(planner)(_train_inputs(inputs, planner, gpus))  # a Planner (sim.planner.plan imports this module)
    except PlanInputError as exc:
        return None, str(exc), 0
    best, why = recommend(rank(pool._run(pool.offload_candidates(), f"split: training on {gpus} GPUs")))
    return best, why, len(pool.sims)


def sync_s(planner: Any) -> float:
    """The actor's bf16 weights from the training pool to the rollout pool: NVLink inside a node, NICs across."""
    m = planner.m
    bw = m.nvlink_eff if planner.inp.nodes == 1 else m.net_per_gpu * m.per_node
    return planner.inp.model.params * 2 / bw


def rollout_sizes(planner: Any) -> list[int]:
    """The rollout pool sizes a cut can take: multiples of the rollout's tensor parallel inside one node, whole nodes
    across several; the training pool keeps at least tp x pp x cp GPUs."""
    m, lay = planner.m, planner.lay
    per = lay.tp * lay.pp * (lay.cp if lay.shard != "all" else 1)  # FSDP's Ulysses size shrinks to fit (_train_inputs)
    step = lay.rollout_tp if planner.inp.nodes == 1 else m.per_node
    return [r for r in range(step, m.gpus, step) if (m.gpus - r) >= per and (m.gpus - r) % per == 0]


def _estimate(planner: Any, r: int) -> float:
    """max(rollout, training) of a cut from the colocated figures alone (no simulation): picks the cuts to simulate."""
    rollout, _kv, _need, _why = rollout_pool(planner, r)
    train = sum(planner._compute_s(role) for role in planner.states) * planner.m.gpus / (planner.m.gpus - r)
    return max(rollout if rollout is not None else math.inf, train)


def split_options(inputs: Any, planner: Any) -> tuple[list[SplitOption], int]:
    """(the cuts worth simulating, :data:`SPLIT_NEIGHBOURS` around the best estimate, each evaluated; simulations)."""
    sizes = rollout_sizes(planner)
    if not sizes:
        return [], 0
    best = min(range(len(sizes)), key=lambda i: _estimate(planner, sizes[i]))
    chosen = sizes[max(0, best - SPLIT_NEIGHBOURS): best + SPLIT_NEIGHBOURS + 1]
    out, sims = [], 0
    sync = sync_s(planner)
    for r in chosen:
        t = planner.m.gpus - r
        rollout, kv, need, why = rollout_pool(planner, r)
        train, train_why, n = train_pool(inputs, planner, t) if rollout is not None else (None, "", 0)
        sims += n
        train_s = train.step_s if train is not None else None
        step = max(rollout, train_s) + sync if rollout is not None and train_s is not None else None
        reason = why or ("" if train is not None else f"the training pool of {t} GPUs: {train_why}")
        out.append(SplitOption(r, t, rollout, train_s, sync, step, kv, need,
                               train.candidate.label() if train is not None else "", reason,
                               asdict(train.candidate) if train is not None else None))
    return out, sims


def verdict(colocated_s: float | None, best: SplitOption | None) -> tuple[str, float | None]:
    """(``colocate``, ``split``, ``tie`` or ``neither``, the split's speed-up over colocating or None)."""
    if best is None or best.step_s is None:
        return ("colocate" if colocated_s is not None else "neither"), None
    if colocated_s is None:
        return "split", None
    speedup = colocated_s / best.step_s
    if speedup > 1 + SPLIT_TIE:
        return "split", speedup
    if speedup < 1 / (1 + SPLIT_TIE):
        return "colocate", speedup
    return "tie", speedup


def colocate_or_split(inputs: Any, planner: Any, colocated: Any | None) -> dict[str, Any]:
    """Whether the plan's inputs step faster colocated (``colocated``: the plan's recommended outcome, or None when
    nothing fits) or split, with every cut simulated, the best, the speed-up and a sentence."""
    options, sims = split_options(inputs, planner)
    fits = [o for o in options if o.step_s is not None]
    best = min(fits, key=lambda o: o.step_s) if fits else None
    colocated_s = colocated.step_s if colocated is not None else None
    answer, speedup = verdict(colocated_s, best)
    return {"verdict": answer, "speedup": speedup, "colocated_step_s": colocated_s,
            "best": asdict(best) if best else None, "options": [asdict(o) for o in options],
            "why": _words(answer, speedup, colocated_s, best, options), "simulations": sims}


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _words(answer: str, speedup: float | None, colocated_s: float | None, best: SplitOption | None,
           options: list[SplitOption]) -> str:
    if best is None:
        why = options[0].reason if options else "no cut of the GPUs leaves the training its tp x pp x cp"
        return f"colocate: no split fits ({why})" if colocated_s is not None else f"neither fits: {why}"
    cut = (f"{_gpus(best.rollout_gpus)} rolling out ({best.rollout_s:.1f} s) beside {best.train_gpus} training "
           f"({best.train_s:.1f} s), {best.sync_s:.2f} s of weight sync: {best.step_s:.1f} s a step")
    if colocated_s is None:
        return f"split: nothing fits colocated; {cut}"
    head = {"split": f"split, {speedup:.2f}x faster", "colocate": f"colocate, {1 / speedup:.2f}x faster than the best "
            "split", "tie": f"a tie within {SPLIT_TIE:.0%} ({speedup:.2f}x)"}[answer]
    return f"{head}: colocated {colocated_s:.1f} s a step; split {cut}"


# --------------------------------------------------------------------------- where the answer turns


#: what the crossover sweeps, and the factors of the plan's own value it tries
SWEEPS = {"response_len": (0.25, 0.5, 1.0, 2.0, 4.0), "layers": (0.5, 1.0, 2.0), "gpus": (0.25, 0.5, 1.0, 2.0)}


def scale_layers(model: ModelShape, layers: int) -> ModelShape:
    """``model`` with ``layers`` layers of the same shape (the embedding and output layers unchanged)."""
    if not model.layers:
        raise PlanInputError(f"{model.name}: the layer count is not known; the model size is not swept")
    embed = model.vocab * model.hidden * 2
    f = layers / model.layers
    return replace(model, name=f"{model.name} x {layers} layers", layers=layers,
                   params=int(embed + (model.params - embed) * f), expert_params=int(model.expert_params * f),
                   active_params=int(embed + (model.active_params - embed) * f),
                   tensors=max(3, int(model.tensors * f)), kv_bytes_per_token=int(model.kv_bytes_per_token * f))


def _swept(inputs: Any, planner: Any, axis: str, factor: float) -> tuple[Any, float]:
    """(the inputs with ``axis`` scaled by ``factor``, the axis's value); PlanInputError where it cannot be."""
    w, lay = inputs.workload, planner.lay
    if axis == "response_len":
        value = max(16, int(w.response_len * factor))
        rollout_s = w.rollout_s * value / w.response_len if w.rollout_s is not None else None
        return replace(inputs, workload=replace(w, response_len=value, rollout_s=rollout_s)), value
    if axis == "layers":
        layers = max(lay.pp, int(round(planner.inp.model.layers * factor / lay.pp)) * lay.pp)
        model = scale_layers(planner.inp.model, layers)
        return replace(inputs, model=model), model.params / 1e9
    gpus = int(planner.m.gpus * factor)
    per = lay.tp * lay.pp * lay.cp
    if gpus < per or gpus % per:
        raise PlanInputError(f"{gpus} GPUs do not take tp x pp x cp = {per}")
    layout = replace(lay, dp=gpus // per, fsdp=0 if lay.fsdp == lay.dp else lay.fsdp, eddp=0)
    if gpus <= planner.m.per_node:
        return replace(inputs, gpus_per_node=gpus, nodes=1, layout=layout), gpus
    cluster = inputs.cluster if inputs.nodes > 1 else MULTI_NODE.get(inputs.cluster)
    if cluster is None or gpus % planner.m.per_node:
        raise PlanInputError(f"{gpus} GPUs: no multi-node preset for {inputs.cluster}")
    return replace(inputs, cluster=cluster, nodes=gpus // planner.m.per_node, gpus_per_node=inputs.gpus_per_node,
                   layout=layout), gpus


def _point(inputs: Any, planner_class: type) -> dict[str, Any]:
    """Colocated (the offload stage's recommendation, pg none) against the best split, for one point of a sweep."""
    from sim.planner.plan_rank import rank, recommend

    planner = planner_class(replace(inputs, layouts=None))
    colocated, _why = recommend(rank(planner._run(planner.offload_candidates(), "crossover: colocated")),
                                planner.kv_need_gib)
    result = colocate_or_split(inputs, planner, colocated)
    best = result["best"]
    return {"colocated_s": result["colocated_step_s"], "split_s": best["step_s"] if best else None,
            "speedup": result["speedup"], "verdict": result["verdict"],
            "cut": f"{best['rollout_gpus']}:{best['train_gpus']}" if best else None}


def crossover(inputs: Any, planner: Any, axes: tuple[str, ...] = tuple(SWEEPS),
              tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """For each axis of :data:`SWEEPS`: colocated against split at each factor of the plan's own value, and where
    the faster of the two changes (between which values), one axis at a time, the others as planned."""
    out: dict[str, Any] = {}
    for axis in axes:
        points = []
        for factor in SWEEPS[axis]:
            try:
                swept, value = _swept(inputs, planner, axis, factor)
                point = {"factor": factor, "value": value, **_point(swept, type(planner))}
            except PlanInputError as exc:
                point = {"factor": factor, "value": None, "skipped": str(exc)}
            points.append(point)
            if tick is not None:
                tick(f"crossover: {axis}")
        out[axis] = {"points": points, "turns": _turns(points)}
    return out


def _side(p: dict[str, Any]) -> str | None:
    """The faster at a point of a sweep: ``split``, ``colocate`` or ``tie`` (within :data:`SPLIT_TIE`)."""
    return p.get("verdict") if p.get("verdict") in ("split", "colocate", "tie") else None


def _turns(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where, between neighbouring points of a sweep, the faster of colocated and split changes (a tie counts as a
    side of its own: colocate, then a tie, then split is two turns)."""
    done = [p for p in points if p.get("value") is not None and _side(p) is not None]
    return [{"between": (a["value"], b["value"]), "from": _side(a), "to": _side(b)}
            for a, b in zip(done, done[1:]) if _side(a) != _side(b)]


def _runs(points: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """Neighbouring points of a sweep with the same faster side, as (side, their values)."""
    runs: list[tuple[str, list[Any]]] = []
    for p in points:
        if runs and runs[-1][0] == _side(p):
            runs[-1][1].append(p["value"])
        else:
            runs.append((_side(p), [p["value"]]))
    return runs


def crossover_words(cross: dict[str, Any]) -> list[str]:
    """One line per swept axis: where the faster of colocated and split changes, or that it does not."""
    names = {"response_len": ("response length", "{:,.0f} tokens"), "layers": ("model size", "{:.1f}B params"),
             "gpus": ("GPU count", "{:,.0f} GPUs")}
    lines = []
    for axis, result in cross.items():
        name, fmt = names[axis]
        done = [p for p in result["points"] if p.get("value") is not None and p.get("speedup") is not None]
        seen = ", ".join(f"{fmt.format(p['value'])} {p['speedup']:.2f}x" for p in done)
        words = {"split": "split faster", "colocate": "colocated faster", "tie": "a tie"}
        runs = _runs([p for p in done if _side(p) is not None])
        if len(runs) > 1:
            parts = []
            for i, (side, values) in enumerate(runs):
                if i == 0:
                    parts.append(f"{words[side]} up to {fmt.format(values[-1])}")
                elif i == len(runs) - 1:
                    parts.append(f"{words[side]} from {fmt.format(values[0])}")
                elif len(values) == 1:
                    parts.append(f"{words[side]} at {fmt.format(values[0])}")
                else:
                    parts.append(f"{words[side]} from {fmt.format(values[0])} to {fmt.format(values[-1])}")
            lines.append(f"{name}: {', '.join(parts)} (split's speed-up: {seen})")
        elif done:
            lines.append(f"{name}: {words[_side(done[0])]} over the whole sweep (split's speed-up: {seen})")
    return lines


__all__ = ["MULTI_NODE", "PUBLISHED", "SINGLE_NODE", "SPLIT_NEIGHBOURS", "SPLIT_TIE", "SWEEPS", "SplitOption", "colocate_or_split",
           "crossover", "crossover_words", "rollout_pool", "rollout_sizes", "scale_layers", "split_options", "sync_s",
           "train_pool", "verdict"]

