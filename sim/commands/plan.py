"""``timeshare plan``: rank offload settings, PG policies and role orders for a model on a cluster.

With no arguments it plans the built-in default (GRPO on Qwen2.5-7B with a
reference model, FSDP over one 8xH200 node) and says so. See docs/plan.md.

Exit status: 0 with a recommendation, 1 when no candidate fits, 2 for bad input.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from sim.planner.plan_model import MODEL_PRESETS, GpuSpec, Layout, PlanInputError, Workload

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Wire ``timeshare plan``'s options into ``parser``."""
    g = parser.add_argument_group("model")
    g.add_argument("--model", metavar="NAME|config.json",
                   help=f"a preset ({', '.join(MODEL_PRESETS)}) or a transformers config.json (default Qwen2.5-7B)")
    g.add_argument("--params-b", type=float, help="explicit size instead of --model: billions of parameters")
    g.add_argument("--active-params-b", type=float, help="with --params-b: billions active per token (MoE)")
    g.add_argument("--expert-params-b", type=float, default=0.0, help="with --params-b: billions in routed experts")
    c = parser.add_argument_group("cluster and parallelism")
    c.add_argument("--cluster", default="hgx-h200-8x", help="topology preset (timeshare sim list); default hgx-h200-8x")
    c.add_argument("--nodes", type=int, default=1, help="nodes of a multi-node preset (default 1)")
    c.add_argument("--gpus-per-node", type=int,
                   help="use only the first N GPUs of each node of the preset (default: all), e.g. 2 for a 2 x H200 host")
    for name, default, text in (("tp", 1, "tensor parallel"), ("pp", 1, "pipeline parallel"),
                                ("dp", None, "data parallel (default: GPUs / (tp x pp))"), ("ep", 1, "expert parallel"),
                                ("eddp", 0, "expert data parallel (default dp x tp / ep)"),
                                ("fsdp", 0, "ranks of each dp group that shard the state (default all of dp; 1 = DDP)"),
                                ("rollout-tp", 0, "rollout engine tensor parallel (default: fits half a GPU)")):
        c.add_argument(f"--{name}", type=int, default=default, help=text)
    c.add_argument("--gpu-tflops", type=float, help="peak dense bf16 TFLOP/s per GPU (default from the cluster preset)")
    c.add_argument("--mfu", type=float, default=0.35, help="model FLOPs utilisation of training passes (default 0.35)")
    w = parser.add_argument_group("RL step")
    w.add_argument("--prompts", type=int, default=256, help="prompts per step (default 256)")
    w.add_argument("--samples", type=int, default=8, help="responses per prompt (default 8)")
    w.add_argument("--prompt-len", type=int, default=512, help="tokens per prompt (default 512)")
    w.add_argument("--response-len", type=int, default=1024, help="tokens per response (default 1024)")
    w.add_argument("--micro-batch-tokens", type=int, default=16384, help="tokens per rank per forward/backward")
    w.add_argument("--no-reference", action="store_true", help="no reference model (no KL term)")
    w.add_argument("--critic", action="store_true", help="a critic of the actor's size (PPO)")
    w.add_argument("--reward-model", metavar="NAME|config.json", help="a reward model sharing the GPUs")
    w.add_argument("--kv-gib", type=float, help="KV cache per GPU the rollout needs (strict; default: its whole batch at once)")
    w.add_argument("--tokens-per-s-per-gib", type=float,
                   help="rollout speed per GiB of KV cache per GPU (rollout time then follows the memory it gets)")
    w.add_argument("--rollout-s", type=float, help="rollout time with all the KV it needs (default: decode-bound estimate)")
    s = parser.add_argument_group("search and output")
    s.add_argument("--overlap", action="store_true", help="switches overlap the outgoing D2H with the incoming H2D")
    s.add_argument("--exhaustive", action="store_true", help="every combination instead of the staged search")
    s.add_argument("--pg-groups", choices=("layout", "megatron"), default="layout",
                   help="groups the PG-policy switch costs are simulated over: layout (default), the plan layout's own "
                        "groups; megatron, the 14 Megatron group families per rank of the dp x tp mesh, with the "
                        "lifecycle driver of `timeshare bench switch-window`")
    s.add_argument("--cooldown-s", type=float, default=2.0,
                   help="with --pg-groups megatron: port-release cooldown of the destroying policies (default 2)")
    s.add_argument("--rows", type=int, default=15, help="rows of the ranked table (default 15)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON on stdout (the table is not printed)")
    s.add_argument("--png", metavar="TIMELINE.png", help="write a timeline of the recommended step (needs matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _model(text: str | None, args: argparse.Namespace, flag: str = "--model"):
    from sim.planner.plan_model import model_preset, shape_from_hf_config, shape_from_sizes

    if flag == "--model" and args.params_b is not None:
        if text:
            raise PlanInputError("give --model or --params-b, not both")
        return shape_from_sizes(args.params_b, active_b=args.active_params_b, expert_b=args.expert_params_b)
    if text is None:
        return model_preset("Qwen2.5-7B")
    if text.endswith(".json") or Path(text).is_file():
        return shape_from_hf_config(text)
    try:
        return model_preset(text)
    except PlanInputError as exc:
        raise PlanInputError(str(exc).replace("--model", flag)) from None


def inputs_from_args(args: argparse.Namespace):
    """:class:`sim.planner.plan.PlanInputs` from parsed options (raises :class:`PlanInputError` naming the bad one)."""
    from sim.planner.plan import PlanInputs
    from sim.planner.plan_model import GPU_FLOPS

    for name in ("prompts", "samples", "prompt_len", "response_len", "micro_batch_tokens", "nodes", "rows"):
        if getattr(args, name) < 1:
            raise PlanInputError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {getattr(args, name)}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise PlanInputError(f"--gpus-per-node: expected an integer >= 1, got {args.gpus_per_node}")
    if not args.cooldown_s >= 0:
        raise PlanInputError(f"--cooldown-s: expected a number >= 0, got {args.cooldown_s}")
    for name in ("kv_gib", "tokens_per_s_per_gib", "rollout_s", "gpu_tflops"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise PlanInputError(f"--{name.replace('_', '-')}: expected a number > 0, got {v}")
    if not 0 < args.mfu <= 1:
        raise PlanInputError(f"--mfu: expected a fraction in (0, 1], got {args.mfu}")
    model = _model(args.model, args)
    reward = _model(args.reward_model, args, "--reward-model") if args.reward_model else None
    gpus_hint = None
    if args.dp is None:
        from sim.planner.plan_model import Machine

        gpus_hint = (args.gpus_per_node * args.nodes if args.gpus_per_node is not None
                     else Machine(args.cluster, args.nodes).gpus)
        dp = max(1, gpus_hint // (args.tp * args.pp)) if args.tp >= 1 and args.pp >= 1 else 0
    else:
        dp = args.dp
    layout = Layout(tp=args.tp, pp=args.pp, dp=dp, ep=args.ep, eddp=args.eddp, fsdp=args.fsdp, rollout_tp=args.rollout_tp)
    gpu = None
    if args.gpu_tflops is not None:
        gpu = GpuSpec(args.gpu_tflops * 1e12, "--gpu-tflops", mfu=args.mfu)
    elif args.mfu != 0.35:
        flops, src = GPU_FLOPS.get(args.cluster, (None, None))
        if flops is None:
            raise PlanInputError(f"--gpu-tflops: no peak FLOP/s known for cluster {args.cluster!r}; give --gpu-tflops")
        gpu = GpuSpec(flops, src, mfu=args.mfu)
    workload = Workload(prompts=args.prompts, samples_per_prompt=args.samples, prompt_len=args.prompt_len,
                        response_len=args.response_len, micro_batch_tokens=args.micro_batch_tokens,
                        reference=not args.no_reference, critic=args.critic, reward_model=reward, kv_gib=args.kv_gib,
                        tokens_per_s_per_gib=args.tokens_per_s_per_gib, rollout_s=args.rollout_s)
    return PlanInputs(model=model, cluster=args.cluster, nodes=args.nodes, layout=layout, workload=workload, gpu=gpu,
                      overlap=args.overlap, exhaustive=args.exhaustive, pg_groups=args.pg_groups,
                      cooldown_s=args.cooldown_s, gpus_per_node=args.gpus_per_node)


def format_plan(plan: dict, rows: int = 15) -> str:
    """The ranked table, the Pareto front and the recommendation (GiB, s)."""
    inp = plan["inputs"]
    m = inp["model"]
    lines = [
        f"model {m['name']} ({m['params'] / 1e9:.2f}B params, {m['active_params'] / 1e9:.2f}B active; {m['source']})",
        f"cluster {inp['cluster']}: {inp['gpus']} GPUs of {inp['gpu_gib']:.1f} GiB; layout "
        + ", ".join(f"{k} {v}" for k, v in inp["layout"].items()),
        f"step: {inp['workload']['prompts']} prompts x {inp['workload']['samples_per_prompt']} samples, "
        f"{inp['workload']['tokens'] / 1e6:.2f}M tokens; rollout needs {inp['kv_need_gib']:.1f} GiB KV per GPU "
        f"for its batch, {inp['rollout_full_s']:.2f} s with it",
        "",
    ]
    head = (f"{'#':>3} {'candidate':<62}{'step s':>9}{'switch s':>10}{'peak GPU':>10}{'rollout':>9}"
            f"{'pinned/rank':>12}{'pinned/node':>12}  fits")
    lines += [head + "   (memory in GiB)", "-" * len(head)]
    for i, o in enumerate(plan["outcomes"][:rows], 1):
        lines.append(f"{i:>3} {o['candidate']['label']:<62}{o['step_s']:>9.2f}{o['switch_s']:>10.2f}"
                     f"{o['peak_gpu_gib']:>10.1f}{o['rollout_gib']:>9.1f}{o['pinned_rank_gib']:>12.1f}"
                     f"{o['pinned_node_gib']:>12.1f}  {'yes' if o['feasible'] else 'no: ' + o['reason']}")
    if len(plan["outcomes"]) > rows:
        lines.append(f"... {len(plan['outcomes']) - rows} more (--rows N, or --json for all)")
    lines += ["", "Pareto front (step time, rollout memory, pinned host per node):"]
    lines += [f"  {label}" for label in plan["pareto"]] or ["  (nothing fits)"]
    rec = plan["recommendation"]
    lines.append("")
    if rec:
        order = " -> ".join(rec["candidate"]["order"])
        lines.append(f"recommendation: {rec['candidate']['label']}; order {order}")
    lines.append(f"reason: {plan['reason']}")
    if plan.get("pg_switch_windows"):
        lines.append("PG-policy switch costs over the Megatron families (sleep + update_weights + wake_up + the first "
                     "collectives' extra after the wake, s): "
                     + ", ".join(f"{p} {w['sleep']:.2f} + {w['update_weights']:.2f} + {w['wake_up']:.2f} + "
                                 f"{w['first_use']:.2f} = {w['switch_cost']:.2f}"
                                 for p, w in plan["pg_switch_windows"].items() if p != "none"))
    lines.append(f"{len(plan['outcomes'])} candidates, {plan['simulations']} simulations "
                 f"({plan['simulation_wall_s']:.1f} s of {plan['wall_s']:.1f} s wall)")
    return "\n".join(lines)


def write_timeline_png(plan: dict, path: str) -> None:
    """A one-row timeline of the recommended step: compute, switches and the weight sync per role."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = plan["recommendation"]
    colors = {"compute": "#4c72b0", "switch": "#dd8452", "first use after wake": "#dd8452", "switch out": "#dd8452", "weight sync": "#55a868"}
    fig, ax = plt.subplots(figsize=(12, 2.2))
    t = 0.0
    for seg in rec["timeline"]:
        ax.barh(0, seg["s"], left=t, color=colors.get(seg["kind"], "#999999"), edgecolor="white")
        if seg["s"] > 0.04 * rec["step_s"]:
            ax.text(t + seg["s"] / 2, 0, seg["role"], ha="center", va="center", fontsize=8, color="white")
        t += seg["s"]
    ax.set_yticks([])
    ax.set_xlabel("s")
    ax.set_title(f"{plan['inputs']['model']['name']} on {plan['inputs']['cluster']}: {rec['candidate']['label']}", fontsize=9)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items() if k != "switch out"], loc="upper right",
              fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stderr_progress(msg: str) -> None:
    """Progress lines go to stderr so that ``--json`` output stays clean."""
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare plan``; returns the exit status."""
    from refimpl.cli_errors import CliInputError, check_output_path
    from refimpl.output import envelope
    from sim.planner.plan import make_plan

    fresh = argparse.ArgumentParser()
    add_arguments(fresh)
    output_only = {"json", "png", "rows", "quiet"}
    defaults = all(getattr(args, k, v) == v for k, v in vars(fresh.parse_args([])).items() if k not in output_only)
    try:
        if args.png:
            check_output_path(args.png, "--png", suffix=".png")
        inputs = inputs_from_args(args)
    except (PlanInputError, CliInputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if defaults:
        print("no arguments: planning the built-in default (GRPO, Qwen2.5-7B with a reference model, FSDP on one "
              "8xH200 node); see timeshare plan --help", file=sys.stderr if args.json else sys.stdout)
    elif args.model is None and args.params_b is None:
        print("no --model given: planning Qwen2.5-7B", file=sys.stderr if args.json else sys.stdout)
    try:
        plan = make_plan(inputs, None if args.quiet else stderr_progress)
    except PlanInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(envelope("plan", plan, ok=plan["recommendation"] is not None), indent=1))
    else:
        print(format_plan(plan, args.rows))
    if args.png and plan["recommendation"]:
        write_timeline_png(plan, args.png)
        print(f"timeline written to {args.png}", file=sys.stderr if args.json else sys.stdout)
    return 0 if plan["recommendation"] else 1


__all__ = ["add_arguments", "format_plan", "inputs_from_args", "run", "stderr_progress", "write_timeline_png"]
