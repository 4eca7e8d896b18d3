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
from dataclasses import replace
from pathlib import Path

from sim.planner.plan_inputs import MODEL_PRESETS, GpuSpec, Layout, PlanInputError, Workload

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Wire ``timeshare plan``'s options into ``parser``."""
    parser.add_argument("config", nargs="?", metavar="CONFIG.yaml",
                        help="a verl or ROLL config: the model, GPUs, layout, batch and rollout are read from it and "
                             "the answer is given in its keys (the options below then override it)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides of the config, e.g. data.train_batch_size=512 (+KEY=VALUE adds a key, "
                             "++KEY=VALUE adds or sets, ~KEY deletes); alone, they apply to verl's ppo_trainer.yaml, as "
                             "python -m verl.trainer.main_ppo does")
    parser.add_argument("--config-path", metavar="DIR",
                        help="Hydra's config directory: with --config-name, as in a verl launch script (a name that is "
                             "not in DIR but is verl's own, ppo_trainer or ppo_megatron_trainer, is verl's)")
    parser.add_argument("--config-name", metavar="NAME", help="Hydra's config name (NAME.yaml in --config-path)")
    g = parser.add_argument_group("model")
    g.add_argument("--model", metavar="NAME|config.json",
                   help=f"a preset ({', '.join(MODEL_PRESETS)}) or a transformers config.json (default Qwen2.5-7B)")
    g.add_argument("--params-b", type=float, help="explicit size instead of --model: billions of parameters")
    g.add_argument("--active-params-b", type=float, help="with --params-b: billions active per token (MoE)")
    g.add_argument("--expert-params-b", type=float, default=0.0, help="with --params-b: billions in routed experts")
    c = parser.add_argument_group("cluster and parallelism")
    c.add_argument("--cluster", default=None, help="topology preset (timeshare sim list); default hgx-h200-8x, or "
                   "hgx-h200-8x-ib when CONFIG has more than one node")
    c.add_argument("--nodes", type=int, default=None, help="nodes of a multi-node preset (default 1, or CONFIG's)")
    c.add_argument("--gpus-per-node", type=int,
                   help="use only the first N GPUs of each node of the preset (default: all), e.g. 2 for a 2 x H200 host")
    for name, text in (("tp", "tensor parallel (default 1)"), ("pp", "pipeline parallel (default 1)"),
                       ("cp", "context parallel: Megatron CP, verl's Ulysses sequence parallel (default 1)"),
                       ("dp", "data parallel (default: GPUs / (tp x pp x cp))"), ("ep", "expert parallel (default 1)"),
                       ("eddp", "expert data parallel (default dp x cp x tp / ep)"),
                       ("fsdp", "ranks of each dp group that shard the state (default all of dp; 1 = DDP)"),
                       ("rollout-tp", "rollout engine tensor parallel (default: fits half a GPU)")):
        c.add_argument(f"--{name}", type=int, default=None, help=text)
    c.add_argument("--gpu-tflops", type=float, help="peak dense bf16 TFLOP/s per GPU (default from the cluster preset)")
    c.add_argument("--mfu", type=float, default=0.35, help="model FLOPs utilisation of training passes (default 0.35)")
    w = parser.add_argument_group("RL step")
    w.add_argument("--prompts", type=int, default=None, help="prompts per step (default 256, or CONFIG's)")
    w.add_argument("--samples", type=int, default=None, help="responses per prompt (default 8, or CONFIG's)")
    w.add_argument("--prompt-len", type=int, default=None, help="tokens per prompt (default 512, or CONFIG's)")
    w.add_argument("--response-len", type=int, default=None, help="tokens per response (default 1024, or CONFIG's)")
    w.add_argument("--micro-batch-tokens", type=int, default=None,
                   help="tokens per rank per forward/backward (default 16384, or CONFIG's)")
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
    s.add_argument("--wake-proxies", choices=("on", "off"), default="on",
                   help="with --pg-groups megatron: whether the runtime wakes NCCL's proxy thread in a destroy "
                        "(default on, as TorchRuntime; off: each destroy waits for the proxy's 500 ms poll)")
    s.add_argument("--layouts", choices=("given", "search"), default=None,
                   help="search: compare the layouts the training backend allows (TP, PP, CP, EP, FSDP) before the "
                        "offload settings; given: plan only the layout given (default: search with CONFIG, else given)")
    s.add_argument("--crossover", action="store_true",
                   help="also sweep the response length, the model size (layers) and the GPU count, colocated against "
                        "split into a rollout and a training pool, and say where the faster one changes (about 10-20 "
                        "more plans)")
    s.add_argument("--no-split", action="store_true",
                   help="do not compare the colocated step with a split into a rollout and a training pool")
    s.add_argument("--rows", type=int, default=15, help="rows of the ranked table (default 15)")
    s.add_argument("--wide", action="store_true", help="tables up to 220 columns instead of 100")
    s.add_argument("--json", action="store_true", help="print the plan as JSON on stdout (the table is not printed)")
    s.add_argument("--png", metavar="TIMELINE.png", help="write a timeline of the recommended step (needs matplotlib)")
    s.add_argument("--quiet", action="store_true", help="no progress bar or progress lines on stderr")


def _model(text: str | None, args: argparse.Namespace, flag: str = "--model"):
    from sim.planner.plan_inputs import model_preset, shape_from_hf_config, shape_from_sizes

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


#: the RL step without a CONFIG and without its option (``--prompts`` ...)
WORKLOAD_DEFAULTS = {"prompts": 256, "samples": 8, "prompt_len": 512, "response_len": 1024, "micro_batch_tokens": 16384}
#: the most nodes a plan takes: the simulator's scale work is checked up to 2,048 nodes of 8 GPUs
MAX_NODES = 2048


def _check_numbers(args: argparse.Namespace) -> None:
    names = ("prompts", "samples", "prompt_len", "response_len", "micro_batch_tokens", "nodes", "rows", "gpus_per_node",
             "tp", "pp", "cp", "dp", "ep")
    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise PlanInputError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {v}")
    for name in ("eddp", "fsdp", "rollout_tp"):
        v = getattr(args, name)
        if v is not None and v < 0:
            raise PlanInputError(f"--{name.replace('_', '-')}: expected an integer >= 1, got {v}")
    if not args.cooldown_s >= 0:
        raise PlanInputError(f"--cooldown-s: expected a number >= 0, got {args.cooldown_s}")
    for name in ("kv_gib", "tokens_per_s_per_gib", "rollout_s", "gpu_tflops"):
        v = getattr(args, name)
        if v is not None and not v > 0:
            raise PlanInputError(f"--{name.replace('_', '-')}: expected a number > 0, got {v}")
    if not 0 < args.mfu <= 1:
        raise PlanInputError(f"--mfu: expected a fraction in (0, 1], got {args.mfu}")
    if args.nodes is not None and args.nodes > MAX_NODES:
        raise PlanInputError(f"--nodes {args.nodes}: at most {MAX_NODES} nodes")


def _cluster(args: argparse.Namespace, fc) -> tuple[str, int, int | None, int]:
    """(preset, nodes, GPUs per node used or None for all, GPUs in all) from the options and the config."""
    from sim.planner.plan_inputs import Machine
    from sim.presets import load_preset_data

    nodes = args.nodes or (fc.nodes if fc else 1)
    if nodes > MAX_NODES:
        raise PlanInputError(f"{fc.path if fc else '--nodes'}: {nodes} nodes; at most {MAX_NODES}")
    cluster = args.cluster or ("hgx-h200-8x-ib" if nodes > 1 else "hgx-h200-8x")
    try:
        data = load_preset_data(cluster)
    except Exception as exc:  # noqa: BLE001 - PresetError and the file errors of a preset path: bad input
        raise PlanInputError(f"--cluster: {exc}") from None
    if nodes > 1 and not data.get("fabric"):
        raise PlanInputError(f"--nodes {nodes}: preset {cluster!r} is one node with no network between nodes; pick a "
                             "multi-node preset such as hgx-h200-8x-ib (timeshare sim list)")
    per_node = Machine(cluster, 1).per_node
    gpn = args.gpus_per_node
    if gpn is None and fc is not None and fc.gpus_per_node != per_node:
        gpn = fc.gpus_per_node
    if gpn is not None and gpn > per_node:
        raise PlanInputError(f"{'--gpus-per-node' if args.gpus_per_node else fc.path + ': GPUs per node'} {gpn}: preset "
                             f"{cluster!r} has {per_node} GPUs per node")
    return cluster, nodes, gpn, (gpn or per_node) * nodes


def _is_override(word: str) -> bool:
    """Whether a word of the command line is a Hydra override rather than a config file."""
    return word.startswith(("+", "~")) or ("=" in word and not Path(word).is_file())


def _check_mesh(args: argparse.Namespace, lay: Layout, gpus: int) -> None:
    """The parallel sizes against the cluster's GPUs, before anything is built (one line naming the limit)."""
    if lay.dp and lay.world != gpus:
        raise PlanInputError(f"--tp {lay.tp} x --pp {lay.pp} x --cp {lay.cp} x --dp {lay.dp} = {lay.world:,} ranks, but "
                             f"the cluster has {gpus:,} GPUs; change --dp (or --nodes / --cluster)")
    for name in ("tp", "pp", "cp", "dp", "ep", "eddp", "fsdp", "rollout_tp"):
        v = getattr(lay, name)
        if v > gpus:
            given = getattr(args, name, None) is not None
            what = f"--{name.replace('_', '-')} {v}" if given else f"the config's {name.replace('_', ' ')} size {v}"
            raise PlanInputError(f"{what}: more than the cluster's {gpus:,} GPUs")


def _layout(args: argparse.Namespace, fc, gpus: int) -> Layout:
    base = fc.layout if fc else Layout(dp=0)
    given = {k: getattr(args, k) for k in ("tp", "pp", "cp", "ep", "eddp", "fsdp", "rollout_tp") if getattr(args, k) is not None}
    lay = replace(base, **given)
    if args.dp is not None:
        return replace(lay, dp=args.dp)
    if fc is None or any(k in given for k in ("tp", "pp", "cp")):
        per = lay.tp * lay.pp * lay.cp
        return replace(lay, dp=max(1, gpus // per) if gpus % per == 0 else 0, fsdp=lay.fsdp if "fsdp" in given else 0)
    return lay


def _workload(args: argparse.Namespace, fc) -> Workload:
    base = fc.workload if fc else Workload(**{("samples_per_prompt" if k == "samples" else k): v
                                              for k, v in WORKLOAD_DEFAULTS.items()})
    given = {("samples_per_prompt" if k == "samples" else k): getattr(args, k) for k in WORKLOAD_DEFAULTS
             if getattr(args, k) is not None}
    for k in ("kv_gib", "tokens_per_s_per_gib", "rollout_s"):
        if getattr(args, k) is not None:
            given[k] = getattr(args, k)
    if args.no_reference:
        given["reference"] = False
    if args.critic:
        given["critic"] = True
    if args.reward_model:
        given["reward_model"] = _model(args.reward_model, args, "--reward-model")
    return replace(base, **given)


def inputs_from_args(args: argparse.Namespace):
    """(:class:`sim.planner.plan.PlanInputs`, the :class:`sim.planner.plan_config.FrameworkConfig` read or None) from parsed options
    (raises :class:`PlanInputError` naming the bad option or config key)."""
    from sim.planner.plan import PlanInputs
    from sim.planner.layout_cost import layout_choices
    from sim.planner.plan_inputs import gpu_flops

    _check_numbers(args)
    fc = None
    words = ([args.config] if getattr(args, "config", None) else []) + list(getattr(args, "overrides", None) or [])
    config = words[0] if words and not _is_override(words[0]) else None
    overrides = words[1:] if config is not None else words
    if config is not None or overrides or getattr(args, "config_name", None):
        from sim.planner.plan_config import read_config

        if getattr(args, "config_path", None) and not args.config_name:
            raise PlanInputError("--config-path: give --config-name with it (Hydra's NAME.yaml in that directory)")
        given = _model(args.model, args) if (args.model or args.params_b is not None) else None
        reward = _model(args.reward_model, args, "--reward-model") if args.reward_model else None
        fc = read_config(config, overrides, config_path=args.config_path, config_name=args.config_name, model=given,
                         reward_model=reward)
    model = fc.model if fc is not None else _model(args.model, args)
    cluster, nodes, gpn, gpus = _cluster(args, fc)
    layout = _layout(args, fc, gpus)
    _check_mesh(args, layout, gpus)
    workload = _workload(args, fc)
    gpu = None
    if args.gpu_tflops is not None:
        gpu = GpuSpec(args.gpu_tflops * 1e12, "--gpu-tflops", mfu=args.mfu)
    else:
        flops, src = gpu_flops(cluster)
        gpu = GpuSpec(flops, src, mfu=args.mfu)
    allow = None
    if fc is not None:
        from sim.planner.plan_config import expressible

        allow = (lambda off, backend, so, pg: expressible(fc, off, backend, so, pg))
    layouts = None
    if (args.layouts or ("search" if fc else "given")) == "search":
        family = fc.family if fc else ("fsdp" if layout.shard == "all" and layout.tp == layout.pp == 1 else "megatron")
        per_node = gpus // nodes
        layouts = [replace(x, rollout_tp=layout.rollout_tp) for x in
                   layout_choices(model, gpus, per_node, family, seq_len=workload.prompt_len + workload.response_len,
                                  heads=model.heads)]
    inputs = PlanInputs(model=model, cluster=cluster, nodes=nodes, layout=layout, workload=workload, gpu=gpu,
                        overlap=args.overlap, exhaustive=args.exhaustive, pg_groups=args.pg_groups,
                        cooldown_s=args.cooldown_s, wake_proxies=args.wake_proxies == "on", gpus_per_node=gpn,
                        allow=allow, layouts=layouts, split=not args.no_split, crossover=args.crossover)
    return inputs, fc


#: the multi-node preset of each single-node one, for the "fits on N nodes" hint
MULTI_NODE = {"hgx-h200-8x": "hgx-h200-8x-ib", "calibrated/hgx-h200-8x": "hgx-h200-8x-ib"}


def more_nodes(inputs, tries: tuple[int, ...] = (2, 4, 8), tick=None) -> dict | None:
    """When nothing fits: the fewest nodes (of ``tries`` x the plan's) on which something does, with its step time
    and candidate (the same layout with dp scaled; no layout search), or None. ``tick(label)``, if given, is called
    once per candidate evaluated (a progress bar)."""
    from sim.planner.plan import make_plan

    cluster = inputs.cluster if inputs.nodes > 1 else MULTI_NODE.get(inputs.cluster)
    if cluster is None:
        return None
    for k in tries:
        nodes = inputs.nodes * k
        lay = inputs.layout
        lay = replace(lay, dp=lay.dp * k, fsdp=0 if lay.fsdp in (0, lay.dp) else lay.fsdp, eddp=0)
        try:
            plan = make_plan(replace(inputs, cluster=cluster, nodes=nodes, layout=lay, layouts=None, split=False,
                                     crossover=False), tick=tick)
        except PlanInputError:
            continue
        rec = plan["recommendation"]
        if rec is not None:
            return {"nodes": nodes, "cluster": cluster, "step_s": rec["step_s"], "candidate": rec["candidate"]["label"]}
    return None


def micro_batch_fix_plan(inputs, plan: dict, fc) -> dict | None:
    """When nothing fits and a smaller micro-batch would (the plan's ``memory_driver``): the micro-batch in the
    config's own key (``--micro-batch-tokens`` without a config), planned once more to check that it fits; the
    plan's reason then says which key to set. None when not even one sequence fits."""
    from sim.planner.plan import make_plan

    d = plan["memory_driver"]
    fit, seq = d["micro_batch_tokens_that_fit"], d["sequence_tokens"]
    if fc is not None:
        from sim.planner.plan_config import micro_batch_fix

        keys = micro_batch_fix(fc, fit, seq)
        if keys is None:
            return None
        value = next(iter(keys.values()))
        tokens = value * seq if fc.micro_batch_key[1] == "sequences" else value
    else:
        if fit < 1:
            return None
        keys, tokens = {"--micro-batch-tokens": fit}, fit
    w = replace(inputs.workload, micro_batch_tokens=tokens)
    again = make_plan(replace(inputs, workload=w, layout=Layout(**plan["inputs"]["layout"]), layouts=None, split=False,
                              crossover=False))
    rec = again["recommendation"]
    out = {"keys": keys, "micro_batch_tokens": tokens, "fits": rec is not None,
           "step_s": rec["step_s"] if rec else None, "candidate": rec["candidate"]["label"] if rec else None}
    said = "; ".join(f"set {k}={v}" if not k.startswith("--") else f"{k} {v}" for k, v in keys.items())
    plan["reason"] += (f"; {said}: it fits, {rec['step_s']:.2f} s a step ({rec['candidate']['label']})" if rec
                       else f"; {said} fits this turn, but the step still does not fit ({again['reason']})")
    return out


def stderr_progress(msg: str) -> None:
    """Progress lines go to stderr so that ``--json`` output stays clean."""
    print(msg, file=sys.stderr, flush=True)


def _is_default(args: argparse.Namespace) -> bool:
    fresh = argparse.ArgumentParser()
    add_arguments(fresh)
    output_only = {"json", "png", "rows", "quiet", "wide", "crossover", "no_split"}
    return all(getattr(args, k, v) == v for k, v in vars(fresh.parse_args([])).items() if k not in output_only)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare plan``; returns the exit status (0 an answer, 1 nothing fits, 2 bad input)."""
    from refimpl.cli_errors import check_output_path
    from refimpl.output import envelope, progress_bar
    from sim.planner.plan import make_plan, plan_size
    from sim.commands.plan_report import answer_for, format_plan, write_timeline_png

    if args.png:
        check_output_path(args.png, "--png", suffix=".png")
    inputs, fc = inputs_from_args(args)
    info = sys.stderr if args.json else sys.stdout
    if _is_default(args):
        print("no arguments: planning the built-in default (GRPO, Qwen2.5-7B with a reference model, FSDP on one "
              "8xH200 node); see timeshare plan --help", file=info)
    elif args.model is None and args.params_b is None and fc is None:
        print("no --model given: planning Qwen2.5-7B", file=info)
    with progress_bar(plan_size(inputs), "plan", enabled=not (args.quiet or args.json)) as tick:
        plan = make_plan(inputs, None if args.quiet else (lambda m: None) if sys.stderr.isatty() else stderr_progress,
                         tick)
    if plan["recommendation"] is None:  # on how many nodes would it fit? (up to three more plans: a bar of its own)
        if plan.get("memory_driver"):
            plan["micro_batch_fix"] = micro_batch_fix_plan(inputs, plan, fc)
        with progress_bar(plan_size(replace(inputs, layouts=None)), "plan: on more nodes",
                          enabled=not (args.quiet or args.json)) as tick:
            plan["more_nodes"] = more_nodes(inputs, tick=tick)
        if plan["more_nodes"] and fc is not None:
            n = plan["more_nodes"]["nodes"]
            plan["more_nodes"]["keys"] = ({"trainer.nnodes": n} if fc.framework == "verl" else
                                          {"actor_train.device_mapping": f"list(range(0,{n * fc.gpus_per_node}))"})
    if fc is not None:
        plan["answer"] = answer_for(fc, plan)
    if args.json:
        print(json.dumps(envelope("plan", plan, ok=plan["recommendation"] is not None), indent=1))
    else:
        print(format_plan(plan, args.rows, wide=args.wide))
    if args.png and plan["recommendation"]:
        write_timeline_png(plan, args.png)
        print(f"timeline written to {args.png}", file=info)
    return 0 if plan["recommendation"] else 1


__all__ = ["MAX_NODES", "MULTI_NODE", "micro_batch_fix_plan", "more_nodes", "WORKLOAD_DEFAULTS", "add_arguments", "inputs_from_args", "run", "stderr_progress"]
