"""What ``timeshare plan`` shows a person: the tables, the answer in the user's own keys, the timeline picture.

Tables go through :func:`refimpl.output.table` (one library, units in every header, at most 100
columns unless ``--wide``). The picture (:func:`write_timeline_png`) has three panels: the step's turns
and switches (one fixed colour per kind of segment, the same in every run), the switches on their own
scale, and the GPU memory in use in each turn against the GPU's capacity.
"""
from __future__ import annotations

from typing import Any

from sim.planner.plan import MICRO_BATCH_TERMS
from sim.planner.plan_inputs import Layout

#: one colour per kind of timeline segment, the same in every picture (colour-blind-safe palette)
SEGMENT_COLOURS = {"compute": "#0072B2", "switch": "#E69F00", "switch out": "#D55E00", "weight sync": "#009E73",
                   "first use after wake": "#CC79A7"}
#: the GPU's capacity in the memory panel: a colour no segment has, so that no mark means two things
CAPACITY_COLOUR = "#000000"


def _step(o: dict[str, Any]) -> str:
    return "-" if o["step_s"] is None else f"{o['step_s']:.2f}"


def layout_table(plan: dict[str, Any], wide: bool = False) -> str:
    """The layouts compared, each with its best offload setting (pg none)."""
    from refimpl.output import table

    rows = []
    for r in plan["layouts"]:
        mark = ("chosen" if r.get("chosen") else "") + (" (yours)" if r.get("mine") else "")
        if r["fits"]:
            rows.append([r["layout"], f"{r['step_s']:.2f}", f"{r['layout_s']:.2f}", f"{r['peak_gpu_gib']:.1f}",
                         f"{r['rollout_gib']:.1f}", mark.strip() or "yes"])
        else:
            rows.append([r["layout"], "-", "-", "-", "-", f"no: {r['reason']}" + mark])
    return table(["layout", "step (s)", "layout comm (s)", "peak (GiB)", "KV (GiB)", "fits"], rows,
                 wide=wide, right=(1, 2, 3, 4), min_widths={0: 24}, title="layouts compared (the best offload setting of each, pg none)")


def candidate_table(plan: dict[str, Any], rows: int, wide: bool = False) -> str:
    """The ranked candidates; ``=`` marks those tied with the fastest inside the estimate's error; why the ones that do
    not fit do not, under the table."""
    from refimpl.output import table

    tied = set(plan.get("ties", []))
    if len(tied) < 2:  # the fastest alone is tied with nobody
        tied = set()
    head = ["#", "candidate", "step (s)", "switch (s)", "peak (GiB)", "KV (GiB)", "host/node (GiB)"]
    if wide:
        head += ["pinned/rank (GiB)", "layout comm (s)"]
    head.append("fits")
    body, why = [], []
    for i, o in enumerate(plan["outcomes"][:rows], 1):
        label = o["candidate"]["label"]
        row = [f"{i}{'=' if label in tied else ''}", label, _step(o), f"{o['switch_s']:.2f}" if o["feasible"] else "-",
               f"{o['peak_gpu_gib']:.1f}", f"{o['rollout_gib']:.1f}", f"{o['pinned_node_gib']:.0f}"]
        if wide:
            row += [f"{o['pinned_rank_gib']:.1f}", f"{sum(v['total'] for v in o['layout_s'].values()):.2f}"]
        row.append("yes" if o["feasible"] else "no")
        if not o["feasible"]:
            why.append(f"  #{i} does not fit: {o['reason']}")
        body.append(row)
    out = table(head, body, wide=wide, right=tuple(range(2, len(head) - 1)), min_widths={1: 28},
                title="candidates, fastest first (= : a tie with the fastest, inside the estimate's error)")
    return "\n".join([out, *why])


def answer_for(fc: Any, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The recommendation in the config's own keys: all of them, those that change, and a YAML snippet; when nothing
    fits but a smaller micro-batch does, that key (``fix``); None when there is neither. ``ignored``: keys of the
    config the framework does not define and ignores (and so does the plan)."""
    from sim.planner.plan_config import answer, changed, snippet

    rec = plan["recommendation"]
    fix = (plan.get("micro_batch_fix") or {}).get("keys")
    split_fits = (plan.get("split") or {}).get("verdict") == "split"
    if rec is None and not (fix and plan["micro_batch_fix"]["fits"]) and not split_fits:
        return None
    if rec is None:
        keys = dict(fix or {})
    else:
        lay = Layout(**plan["inputs"]["layout"])
        keys = answer(fc, rec["candidate"], lay, rec["rollout_gib"], plan["inputs"]["engine_gib"],
                      plan["inputs"]["gpu_gib"])
    diff = changed(fc, keys)
    out = {"framework": fc.framework, "keys": keys, "changed": {k: {"now": now, "set": v} for k, (now, v) in diff.items()},
           "snippet": snippet(keys), "config_gpu_memory_utilization": fc.gpu_memory_utilization,
           "ignored": list(fc.ignored)}
    if rec is None:
        out["fix"] = dict(fix)
    split = plan.get("split") or {}
    if split.get("verdict") == "split" and split.get("best"):
        from sim.planner.plan_config import split_answer

        gpn = plan["inputs"]["gpus"] // plan["inputs"]["nodes"]
        out["split"] = split_answer(fc, split["best"], gpn)
        out["split"]["snippet"] = snippet(out["split"]["keys"])
    return out


def _header(plan: dict[str, Any]) -> list[str]:
    from sim.planner.layout_cost import describe

    inp = plan["inputs"]
    m, w = inp["model"], inp["workload"]
    lay = Layout(**inp["layout"])
    return [
        f"model {m['name']} ({m['params'] / 1e9:.2f}B params, {m['active_params'] / 1e9:.2f}B active; {m['source']})",
        f"cluster {inp['cluster']}: {inp['gpus']} GPUs of {inp['gpu_gib']:.1f} GiB; layout {describe(lay)}, "
        f"rollout tp {lay.rollout_tp}",
        f"step: {w['prompts']} prompts x {w['samples_per_prompt']} samples, {w['tokens'] / 1e6:.2f}M tokens; the "
        f"rollout needs {inp['kv_need_gib']:.1f} GiB of KV cache per GPU for its batch, {inp['rollout_full_s']:.2f} s with it",
    ]


def _split_lines(plan: dict[str, Any]) -> list[str]:
    """Colocated or split, in a line; the split's keys where it is the faster; where the answer turns."""
    split = plan.get("split")
    if not split:
        return []
    lines = [f"colocate or split: {split['why']}"]
    ans = (plan.get("answer") or {}).get("split")
    if ans:
        lines.append(f"split ({ans['entry']}): " + ", ".join(f"{k}={v}" for k, v in ans["keys"].items()))
    if plan.get("crossover"):
        from sim.planner.split import crossover_words

        lines += [f"where it turns, {line}" for line in crossover_words(plan["crossover"])]
    return lines


def format_plan(plan: dict[str, Any], rows: int = 15, *, wide: bool = False) -> str:
    """Everything ``timeshare plan`` prints: inputs, layouts, candidates, the answer, the reason and margin."""
    lines = _header(plan) + [""]
    if plan.get("layouts"):
        lines.append(layout_table(plan, wide))
        search = plan.get("layout_search") or {}
        if search.get("ranked_without_simulation"):
            lines.append(f"  ({search['ranked_without_simulation']} more layouts ranked lower by compute and "
                         "communication alone)")
        if search.get("why"):
            lines.append(f"layout: {search['why']}")
        lines.append("")
    lines.append(candidate_table(plan, rows, wide))
    if len(plan["outcomes"]) > rows:
        lines.append(f"... {len(plan['outcomes']) - rows} more (--rows N, or --json for all)")
    rec = plan["recommendation"]
    lines.append("")
    ans = plan.get("answer")
    if rec is None:
        lines.append(f"answer: {plan['reason']}")
        more = plan.get("more_nodes")
        if more:
            lines.append(f"it fits on {more['nodes']} nodes ({more['cluster']}): {more['candidate']}, step "
                         f"{more['step_s']:.2f} s" + "".join(f"; set {k}={v}" for k, v in more.get("keys", {}).items()))
        elif "more_nodes" in plan:
            driver = plan.get("memory_driver") or {}
            per_gpu = driver.get("biggest") in MICRO_BATCH_TERMS
            lines.append("it does not fit on 2, 4 or 8 times the nodes either"
                         + (": the micro-batch's memory is per GPU, more GPUs do not shrink it" if per_gpu else ""))
    if ans and ans.get("ignored"):
        lines.append(f"keys {ans['framework']} does not define and ignores (so does the plan): " + ", ".join(ans["ignored"]))
    if rec is not None and ans:
        lines.append(f"answer ({ans['framework']} keys; paste into the config, or pass each as KEY=VALUE):")
        lines += ["  " + x for x in ans["snippet"].splitlines()]
        if ans["changed"]:
            lines.append("changes from the config: " + ", ".join(
                f"{k} {'(not set)' if c['now'] is None else c['now']} -> {c['set']}" for k, c in ans["changed"].items()))
        else:
            lines.append("the config already has these settings")
    elif rec is not None:
        order = " -> ".join(rec["candidate"]["order"])
        lines.append(f"recommendation: {rec['candidate']['label']}; order {order}")
    if rec is not None:
        lines.append(f"reason: {plan['reason']}")
    lines += _split_lines(plan)
    if plan.get("pg_switch_windows"):
        lines.append("PG-policy switch costs over the Megatron families (sleep + update_weights + wake_up + the first "
                     "collectives' extra after the wake, s): "
                     + ", ".join(f"{p} {w['sleep']:.2f} + {w['update_weights']:.2f} + {w['wake_up']:.2f} + "
                                 f"{w['first_use']:.2f} = {w['switch_cost']:.2f}"
                                 for p, w in plan["pg_switch_windows"].items() if p != "none"))
    lines.append(f"{len(plan['outcomes'])} candidates, {plan['simulations']} simulations "
                 f"({plan['simulation_wall_s']:.1f} s of {plan['wall_s']:.1f} s wall)")
    from refimpl.output import wrap

    width = 220 if wide else 100
    return "\n".join(x if len(x) <= width else wrap(x, wide=wide, indent=" " * (len(x) - len(x.lstrip())))
                     for x in "\n".join(lines).splitlines())


def write_timeline_png(plan: dict[str, Any], path: str) -> None:
    """Three panels of the recommended step: its turns and switches (fixed colours), the switches on their own scale,
    and the GPU memory in use in each turn against the GPU's capacity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rec = plan["recommendation"]
    fig, (ax, sw, mem) = plt.subplots(3, 1, figsize=(13, 6.4), gridspec_kw={"height_ratios": [1, 1.2, 1.6]})
    t, spans = 0.0, {}
    for seg in rec["timeline"]:
        ax.barh(0, max(seg["s"], rec["step_s"] * 0.002), left=t, color=SEGMENT_COLOURS.get(seg["kind"], "#999999"),
                edgecolor="white", linewidth=0.5)
        if seg["s"] > 0.04 * rec["step_s"]:
            ax.text(t + seg["s"] / 2, 0, seg["role"], ha="center", va="center", fontsize=8, color="white")
        if seg["kind"] == "compute":
            spans[seg["role"]] = (t, seg["s"])
        t += seg["s"]
    ax.set_yticks([])
    ax.set_xlim(0, t)
    ax.set_title(f"{plan['inputs']['model']['name']} on {plan['inputs']['cluster']}: {rec['candidate']['label']}"
                 f" (switches {rec['switch_s']:.2f} s of {rec['step_s']:.2f} s)", fontsize=9)
    # every legend beside its panel, never over the bars it explains
    ax.legend(handles=[Patch(color=c, label=k) for k, c in SEGMENT_COLOURS.items()], loc="upper left", fontsize=7,
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    # the switches on their own scale: in a long step they are too short to see in the timeline above
    moves = [seg for seg in rec["timeline"] if seg["kind"] != "compute"]
    for i, seg in enumerate(moves):
        sw.barh(i, seg["s"], color=SEGMENT_COLOURS.get(seg["kind"], "#999999"))
        sw.text(seg["s"], i, f" {seg['s']:.3f} s", va="center", fontsize=7)
    sw.set_yticks(range(len(moves)))
    sw.set_yticklabels([f"{seg['kind']}: {seg['role']}" for seg in moves], fontsize=7)
    sw.invert_yaxis()
    sw.set_xlim(0, max([seg["s"] for seg in moves] + [1e-3]) * 1.3)
    sw.set_xlabel("switch time (s), in step order")
    gpu = plan["inputs"]["gpu_gib"]
    for role, (start, width) in spans.items():
        used = rec["memory_gib"].get(role)
        if used is not None:
            mem.bar(start, used, width=max(width, t * 0.004), align="edge", color=SEGMENT_COLOURS["compute"], alpha=0.8)
            mem.text(start + width / 2, used, f"{role}\n{used:.0f}", ha="center", va="bottom", fontsize=7)
    mem.axhline(gpu, color=CAPACITY_COLOUR, linestyle="--", linewidth=1)
    mem.set_xlim(0, t)
    mem.set_ylim(0, gpu * 1.25)
    mem.set_ylabel("GPU memory (GiB)")
    mem.set_xlabel("time in the step (s)")
    mem.legend(handles=[Patch(color=SEGMENT_COLOURS["compute"], alpha=0.8, label="in use in the turn"),
                        Line2D([], [], color=CAPACITY_COLOUR, linestyle="--", linewidth=1,
                               label=f"GPU capacity {gpu:.0f} GiB")],
               loc="upper left", fontsize=7, bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["CAPACITY_COLOUR", "SEGMENT_COLOURS", "answer_for", "candidate_table", "format_plan", "layout_table", "write_timeline_png"]
