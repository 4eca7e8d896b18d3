"""The record of a colocated RL step (bench/rl_loop.py): its summary, the JSON and the PNG timeline.

``summarize`` turns the phase spans into per-phase seconds (the mean over the
steps after the first, which pinned its host memory), the switch overhead
(offload + weight_sync + reload) and the time the copies alone need at the
line rates measured in the same run; ``switch_cost_s`` is the switch's whole cost to the step
(:mod:`bench.switch_modes`, [Note: switch cost]) against the same copy time and the step.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from bench.switch_modes import switch_costs

logger = logging.getLogger(__name__)

#: phases of one step, in order
PHASES = ("train", "offload", "rollout", "weight_sync", "reload")


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
        "switch_cost_s": cost, "switch_costs": costs,
        "switch_cost_x_copy_time": (cost / copy_line) if (cost is not None and copy_line) else None,
        "step_s": step_s, "switch_cost_share_of_step": (cost / step_s) if step_s else None,
        "steps_used": use, "phase_s": per, "switch_overhead_s": overhead, "offload_bytes": off_b,
        "runtime_spans_by_phase": span_breakdown(rec, use),
        "copy_time_at_line_s": copy_line,
        "overhead_x_copy_time": (overhead / copy_line) if copy_line else None,
        "weights_bitwise_equal_every_sync": all(s["weight_check"]["bitwise_equal"] for s in rec["steps"])
        and rec["initial_sync"]["bitwise_equal"],
    }


def runtime_spans(rt, t0: float) -> list[dict[str, Any]]:
    """The runtime's recorded spans (``lifecycle.*``, the store's phases) as dicts, seconds since ``t0``."""
    return [{"name": n, "start_s": a - t0, "end_s": e - t0} for n, a, e in rt.spans]


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
