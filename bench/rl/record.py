"""The record of a colocated RL step: what is written, its summary, and what a switch costs the step.

Rank 0 writes ``rl_step_<world>.json`` (:func:`write_outputs`; a partial one after every step, in case the
run is cut short) and ``rl_step_<world>.png``, a timeline of the phases (:func:`write_png`). The record holds:

* ``spans``: each phase of each step, ``{"step", "phase", "start_s", "end_s"}`` in seconds since the phases'
  clock began (:class:`bench.rl.clock.PhaseClock`); the phases of a step are :data:`PHASES`, then the
  training step after the last switch (``train``) and two that follow no switch (``train_plain``);
* ``runtime_spans``: the runtime's own spans (the lifecycle's destroy, rebuild and cooldown, the store's
  phases) on the same clock (:func:`runtime_spans`), so a phase's time can be taken apart
  (:func:`span_breakdown`);
* ``steps``: one dict per step with the figures its phases wrote (bytes moved, the store's and the gather's
  seconds, the weight check); ``after_steps``: the training steps after the last switch;
* the switch on several GPUs, per step: ``nccl_in_rollout`` (the lifecycle's groups and, under ``process``,
  every process group alive in the process with its NCCL communicator and bytes), ``resume_ahead`` (a resume
  run on a thread from the rollout's end: where it ran on the phases' clock, its rebuild and warm-up, the wait
  and agreement where the next forward joined it; :func:`resume_ahead_spans`), ``early_sync`` (the weight
  sync in the backward, per FSDP unit in the order the backward steps them: bytes, host and device seconds),
  ``mesh_problems`` / ``mesh_names`` (what the mesh resolves to after the step's rebuild); per run ``mesh``,
  ``mesh_dims``, ``mesh_groups``, ``trainer_groups`` (which groups the lifecycle manages and which carry the
  loss, the weight check and the weight sync), ``world_collectives`` and ``process_groups_at_end``;
* ``summary`` (:func:`summarize`): per-phase seconds (the mean over the steps after the first, which pinned its
  host memory), the switch overhead (offload + weight_sync + reload) and the time the copies alone need at the
  line rates measured in the same run, the switch cost (:func:`switch_costs`) against the same copy time
  and the step, and the N-GPU terms' means (:func:`ngpu_terms`).

The simulator reads these records (``sim.calibrate.colocated``, ``sim.calibrate.switch_modes``): their keys
are part of the benchmark's interface.

[Note: switch cost]
``switch_cost_s``: everything the pause, the weight sync and the wake add to a
step beyond the two roles' own work, up to the end of training's first step
after the wake: the window's phases (offload + weight_sync + reload) plus what
the training step after the switch takes beyond a training step that follows
no switch (``train_plain``, measured at the end of the same run). That
difference holds the first collective's lazy initialisation on rebuilt groups,
a cooldown or peer wait that lands there, the streamed reload's wait at the
optimizer step and any slowdown of compute by copies beside it. With early
copies (``--offload-in-backward``) that step also copies early for the next
switch, as every step before a switch does: the row holds the next switch's
early copies in place of its own, the same in the steady state (the copies
that outlast the step are paid there, its phase ending on a device
synchronisation). The same rule and name as the simulator's.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

#: phases of one step, in order (with ``--sync-first`` the weight sync comes right after ``train``)
PHASES = ("train", "offload", "rollout", "weight_sync", "reload")


def public_fields(s: dict[str, Any]) -> dict[str, Any]:
    """A step record without its private working fields (keys starting with ``_``)."""
    return {k: v for k, v in s.items() if not k.startswith("_")}


def phase_spans(spans: list[tuple[int, str, float, float]]) -> list[dict[str, Any]]:
    """The clock's ``(step, phase, start, end)`` spans as the record's dicts."""
    return [{"step": a, "phase": b, "start_s": c, "end_s": d} for a, b, c, d in spans]


def runtime_spans(rt, t0: float) -> list[dict[str, Any]]:
    """The runtime's recorded spans (``lifecycle.*``, the store's phases) as dicts, seconds since ``t0``."""
    return [{"name": n, "start_s": a - t0, "end_s": e - t0} for n, a, e in rt.spans]


def resume_ahead_spans(rec: dict[str, Any]) -> None:
    """Into each step's ``resume_ahead`` (a resume run on a thread from the rollout's end: [Note: rebuild ahead]
    in :mod:`bench.rl.modes`), the seconds of the lifecycle's spans inside it: ``rebuild_s`` (the walk that
    re-creates the groups, its warm-up included), ``warm_s`` (the warm-up: the communicators' creation by a first
    collective) and ``resume_s``; the cooldown's rest and the agreements are ``resume_s`` less ``rebuild_s``."""
    rt_spans = rec.get("runtime_spans") or []
    for s in [*rec.get("steps", []), *rec.get("after_steps", [])]:
        ahead = s.get("resume_ahead")
        if not ahead:
            continue
        for key, name in (("rebuild_s", "lifecycle.rebuild"), ("warm_s", "lifecycle.warm"),
                          ("resume_s", "lifecycle.resume")):
            ahead[key] = sum(sp["end_s"] - sp["start_s"] for sp in rt_spans if sp["name"] == name
                             and sp["start_s"] >= ahead["start_s"] - 1e-3 and sp["end_s"] <= ahead["end_s"] + 1e-3)


def summarize(rec: dict[str, Any]) -> dict[str, Any]:
    """Per-phase seconds (mean over steps after the first when there are several), switch overhead vs copies at line."""
    spans = rec["spans"]
    steps = sorted({s["step"] for s in spans})
    use = steps[1:] if len(steps) > 1 else steps
    per: dict[str, float] = {}
    for ph in PHASES:
        vals = [s["end_s"] - s["start_s"] for s in spans if s["phase"] == ph and s["step"] in use]
        per[ph] = sum(vals) / len(vals) if vals else 0.0
    last = [s for s in rec["steps"] if s["step"] in use]
    off_b = sum(s["offload_bytes"] for s in last) / max(1, len(last))
    rel_b = off_b  # everything offloaded comes back (params in weight_sync, the rest in reload)
    line = rec.get("line", {})
    copy_line = (off_b / (line["d2h_gbps"] * 1e9) + rel_b / (line["h2d_gbps"] * 1e9)) if line else None
    overhead = per["offload"] + per["weight_sync"] + per["reload"]
    costs = switch_costs(rec) if any(sp["phase"] == "train_plain" for sp in spans) else {}
    cost = costs.get("switch_cost_s")
    step_s = (costs["train_plain_s"] + per["rollout"] + cost) if cost is not None else None
    return {
        "switch_cost_s": cost, "switch_costs": costs, "ngpu": ngpu_terms(last),
        "switch_cost_x_copy_time": (cost / copy_line) if (cost is not None and copy_line) else None,
        "step_s": step_s, "switch_cost_share_of_step": (cost / step_s) if step_s else None,
        "steps_used": use, "phase_s": per, "switch_overhead_s": overhead, "offload_bytes": off_b,
        "runtime_spans_by_phase": span_breakdown(rec, use),
        "copy_time_at_line_s": copy_line,
        # --logprob-pass: the pass's device seconds in the steps after no switch (what the simulator takes)
        "logprob_pass_s": _plain_pass_s(rec),
        "overhead_x_copy_time": (overhead / copy_line) if copy_line else None,
        "weights_bitwise_equal_every_sync": all(s["weight_check"]["bitwise_equal"] for s in rec["steps"])
        and rec["initial_sync"]["bitwise_equal"],
    }


def _plain_pass_s(rec: dict[str, Any]) -> float | None:
    """The mean seconds of the log-prob pass in the steps after no switch (every ``after_steps`` entry but the
    first), or None where the run had none."""
    vals = [s["logprob_pass"]["s"] for s in (rec.get("after_steps") or [])[1:] if s.get("logprob_pass")]
    return sum(vals) / len(vals) if vals else None


def ngpu_terms(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The terms of the switch on several GPUs, over ``steps`` (the steady ones): the means of a resume run ahead
    (``resume_ahead``: its thread's seconds, the rebuild and warm-up in it, the wait and agreement at the join),
    of the sync in the backward (``early_sync``: bytes, host seconds issuing it, device seconds on its stream),
    of the all-gathers the rollout's copy served (``forward_from_rollout``: units, bytes, host seconds issuing the
    fill; and where the resume was joined) and the most NCCL communicators, bytes and other groups any of them saw
    alive in the rollout."""
    def mean(rows: list[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    ahead = [s["resume_ahead"] for s in steps if s.get("resume_ahead")]
    early = [s["early_sync"] for s in steps if s.get("early_sync")]
    served = [s["forward_from_rollout"] for s in steps if s.get("forward_from_rollout")]
    held = [s["nccl_in_rollout"]["process"] for s in steps if "process" in s.get("nccl_in_rollout", {})]
    sizes = [h["nccl_bytes"] for h in held]
    return {
        "resume_ahead": {**{k: mean(ahead, k) for k in ("thread_s", "rebuild_s", "warm_s", "resume_s",
                                                        "join_wait_s", "join_agree_s")},
                         "join_at": sorted({a.get("join_at", "forward") for a in ahead})} if ahead else None,
        "forward_from_rollout": {k: mean(served, k) for k in ("units", "bytes", "fill_s")} if served else None,
        "early_sync": {k: mean(early, k) for k in ("bytes", "issue_s", "device_s")} if early else None,
        "nccl_in_rollout": {"communicators": max((h["nccl_communicators"] for h in held), default=None),
                            "bytes": None if None in sizes or not sizes else max(sizes),
                            "others": sorted({o for h in held for o in h["others"]})} if held else None,
    }


def switch_costs(rec: dict[str, Any]) -> dict[str, Any]:
    """Per steady step: ``switch_cost_s`` (see [Note: switch cost]) and its parts; the means over those steps."""
    spans = rec["spans"]
    dur: dict[tuple[int, str], float] = {(sp["step"], sp["phase"]): sp["end_s"] - sp["start_s"] for sp in spans}
    plain = [v for (st, ph), v in dur.items() if ph == "train_plain"]
    base = min(plain) if plain else None
    steps = sorted({st for (st, ph) in dur if ph == "offload"})
    use = steps[1:] if len(steps) > 1 else steps
    rows = []
    for k in use:
        window = sum(dur.get((k, ph), 0.0) for ph in ("offload", "weight_sync", "reload"))
        after = dur.get((k + 1, "train"))
        extra = max(0.0, after - base) if (after is not None and base is not None) else None
        rows.append({"step": k, "window_s": window, "train_after_s": after, "first_step_extra_s": extra,
                     "switch_cost_s": window + (extra or 0.0)})
    mean = (lambda key: sum(r[key] for r in rows if r[key] is not None) / max(1, sum(r[key] is not None for r in rows)))
    return {"train_plain_s": base, "rows": rows, "window_s": mean("window_s") if rows else None,
            "first_step_extra_s": mean("first_step_extra_s") if rows else None,
            "switch_cost_s": mean("switch_cost_s") if rows else None}


def span_breakdown(rec: dict[str, Any], steps: list[int]) -> dict[str, dict[str, float]]:
    """Per phase, the mean seconds per step of each runtime span (``lifecycle.destroy``, ``offload`` ...) that
    lies inside that phase's span, over ``steps``; spans nest, so a name's time may include another's."""
    rt_spans = rec.get("runtime_spans") or []
    out: dict[str, dict[str, float]] = {}
    for ph in rec.get("spans", []):
        if ph["step"] not in steps:
            continue
        row = out.setdefault(ph["phase"], {})
        for sp in rt_spans:
            if sp["start_s"] >= ph["start_s"] - 1e-6 and sp["end_s"] <= ph["end_s"] + 1e-6:
                row[sp["name"]] = row.get(sp["name"], 0.0) + (sp["end_s"] - sp["start_s"]) / max(1, len(steps))
    return out


def write_png(rec: dict[str, Any], path: str) -> str | None:
    """A timeline of the phases (one bar per phase, one row per step) as a PNG; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib missing: no PNG timeline")
        return None
    colors = {"train": "tab:blue", "offload": "tab:orange", "rollout": "tab:green", "weight_sync": "tab:red",
              "reload": "tab:purple", "train_plain": "tab:cyan"}
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.5 * len(rec["steps"])))
    for s in rec["spans"]:
        ax.barh(s["step"], s["end_s"] - s["start_s"], left=s["start_s"], color=colors[s["phase"]], edgecolor="k")
    ax.set_yticks([s["step"] for s in rec["steps"]], [f"step {s['step']}" for s in rec["steps"]])
    ax.set_xlabel("seconds (rank 0, device-synchronised)")
    ax.invert_yaxis()
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.55), fontsize=8)
    sm = rec["summary"]
    ax.set_title(f"colocated RL step, {rec['world_size']} rank(s), {rec['params'] / 1e6:,.1f} M params, "
                 f"{rec['device']}; switch overhead {sm['switch_overhead_s']:.3f} s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(rec: dict[str, Any], out_dir: str) -> tuple[str, str | None]:
    """Write ``rl_step_<world>.json`` and its PNG into ``out_dir``; return the paths."""
    os.makedirs(out_dir, exist_ok=True)
    tag = f"{rec.get('world_size', 0)}"
    jpath = os.path.join(out_dir, f"rl_step_{tag}.json")
    with open(jpath, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    png = None
    if "summary" in rec:
        try:
            png = write_png(rec, os.path.join(out_dir, f"rl_step_{tag}.png"))
        except Exception as e:  # noqa: BLE001 - the JSON is the record
            logger.warning("PNG timeline failed: %s", e)
    return jpath, png


__all__ = ["PHASES", "ngpu_terms", "phase_spans", "public_fields", "resume_ahead_spans", "runtime_spans", "span_breakdown",
           "summarize", "switch_costs", "write_outputs", "write_png"]
