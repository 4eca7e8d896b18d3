"""``timeshare bench``: benchmarks that print ratios against baselines measured in the same run.

* ``timeshare bench offload [--dry-run] ...``: the offload store against per-tensor copies,
  fresh pinning, torch_memory_saver and the PCIe line rate (:mod:`bench.offload`).
* ``timeshare bench switch-window ...``: process-group policies in the actor/rollout switch
  (:mod:`bench.switch_window`).
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys

from refimpl.cli_errors import one_line_errors

logger = logging.getLogger(__name__)

_OTHER = {"switch-window": ("bench.switch_window", "process-group policies in the switch window")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Sub-benchmarks: ``offload`` and the others registered in :data:`_OTHER`."""
    sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    off = sub.add_parser("offload", help="offload store vs baselines vs PCIe line rate")
    off.add_argument("--dry-run", action="store_true",
                     help="tiny shapes, 2 cycles: a quick check that everything runs (CPU or GPU)")
    off.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda if available)")
    off.add_argument("--shapes", default="dense,moe", help="comma-separated: dense, moe")
    off.add_argument("--moe-layers", type=int, default=None, help="override the MoE layer count")
    off.add_argument("--methods", default=None,
                     help="comma-separated store variant labels and baselines (default: all variants, then "
                          "per_tensor, fresh_pin, memory_saver, memory_saver_retain)")
    off.add_argument("--variant", action="append", default=[], metavar="NAME[:key=value,...]",
                     help="a store variant with StoreConfig overrides, e.g. store_1t:pin_threads=1; the key "
                          "pin_ahead=background|off sets pinning ahead, consolidate=0 skips store.consolidate() at setup (repeatable; 'store' with "
                          "defaults is always first)")
    off.add_argument("--cycles", type=int, default=None, help="steady cycles after the cold one (default 3; dry run 2)")
    off.add_argument("--baseline-cycles", type=int, default=None,
                     help="steady cycles for the baselines (default: as --cycles; they are slow)")
    off.add_argument("--no-check", action="store_true", help="skip the bit-exactness check (saves a state copy)")
    off.add_argument("--phase-gap-s", type=float, default=None,
                     help="pause between each offload and the next reload, the other role's turn (default 0.25 "
                          "on CUDA, 0 on CPU); one extra back-to-back cycle is always measured without it")
    off.add_argument("--other-role-gb", type=float, default=0.0,
                     help="device memory the other role takes in each gap and frees right before the reload "
                          "(default 0)")
    off.add_argument("--line-max-gib", "--line-max-gb", dest="line_max_gib", type=float, default=8.0,
                     help="cap on the line-rate copy size, GiB (default 8)")
    off.add_argument("--out", default=".", help="directory for the JSON report (default: the current directory)")
    off.add_argument("--wide", action="store_true", help="the table up to 220 columns instead of 100")
    off.add_argument("--json", action="store_true", help="print the report as JSON (common envelope) instead of the table")
    off.add_argument("--model", default=None, metavar="NAME",
                     help="a real transformers model under FSDP2 instead of the shapes (qwen2-0.85b, tiny): the store "
                          "against verl's way of offloading it and verl's own functions where verl is installed")
    off.add_argument("--model-methods", default="store,verl_like,verl", help="with --model: which methods run")
    for name, (module, help_text) in _OTHER.items():
        p = sub.add_parser(name, help=help_text)
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            p.set_defaults(_bench_missing=f"{name}: not available ({exc})")
            continue
        mod.add_arguments(p)
        p.set_defaults(_bench_run=mod.run)
    off.set_defaults(_bench_run=run_offload)


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen benchmark."""
    if getattr(args, "_bench_missing", None):
        print(args._bench_missing)
        return 2
    fn = getattr(args, "_bench_run", None)
    if fn is None:
        print("usage: timeshare bench {offload,switch-window} ... (see --help)")
        return 2
    return int(fn(args) or 0)


@one_line_errors
def run_offload(args: argparse.Namespace) -> int:
    """``timeshare bench offload``."""
    from bench.offload import BASELINES, SHAPES, format_report, parse_variant, run_bench, shapes_by_name, write_report
    from refimpl.cli_errors import CliInputError, check_number, check_output_path
    from refimpl.output import progress_bar
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.torch_runtime.device_check import check_device
    from refimpl.store import StoreConfig

    # bad input is one line and exit 2 before anything runs (refimpl.cli_errors)
    check_device(args.device)
    if args.model is not None:
        return _run_model(args)
    names = [s for s in args.shapes.split(",") if s]
    if not names or any(n not in SHAPES for n in names):
        raise CliInputError(f"--shapes {args.shapes!r}: expected a comma-separated list of {sorted(SHAPES)}")
    for opt, v in (("--cycles", args.cycles), ("--baseline-cycles", args.baseline_cycles), ("--moe-layers", args.moe_layers)):
        check_number(opt, v, lo=1, integer=True)
    check_number("--line-max-gib", args.line_max_gib, lo=0, strict=True)
    check_number("--phase-gap-s", args.phase_gap_s, lo=0)
    check_number("--other-role-gb", args.other_role_gb, lo=0)
    check_output_path(args.out, "--out", is_dir=True)
    rt = TorchRuntime(args.device)
    variants = {"store": StoreConfig()}
    no_consolidate = set()
    for text in args.variant:
        name, cfg, consolidate = parse_variant(text)
        variants[name] = cfg
        if not consolidate:
            no_consolidate.add(name)
    methods = args.methods.split(",") if args.methods else [*variants, *BASELINES]
    shapes = shapes_by_name([s for s in args.shapes.split(",") if s], tiny=args.dry_run, moe_layers=args.moe_layers)
    cycles = args.cycles if args.cycles is not None else (2 if args.dry_run else 3)
    gap = args.phase_gap_s if args.phase_gap_s is not None else (0.25 if rt.device.type == "cuda" else 0.0)
    info = sys.stderr if args.json else sys.stdout
    print(f"device {rt.device}; phase gap {gap:g} s; shapes: " + "; ".join(s.describe() for s in shapes), file=info)
    # a bar with the time left on a terminal (stderr), one step per method measured on a shape; off with --json
    with progress_bar(len(shapes) * len(methods), "bench offload", enabled=not args.json) as tick:
        report = run_bench(rt, shapes=shapes, methods=methods, variants=variants, cycles=cycles,
                           baseline_cycles=args.baseline_cycles,
                           check=not args.no_check, line_max_bytes=int(args.line_max_gib * 2**30),
                           no_consolidate=frozenset(no_consolidate), phase_gap_s=gap,
                           other_role_bytes=int(args.other_role_gb * 1e9), tick=tick)
    report["dry_run"] = bool(args.dry_run)
    if args.json:
        from refimpl.output import envelope

        print(json.dumps(envelope("bench offload", report), indent=1, default=str))
    else:
        print(format_report(report, wide=args.wide))
    path = write_report(report, args.out)
    print(f"wrote {path}", file=info)
    return 0


def _run_model(args: argparse.Namespace) -> int:
    """``timeshare bench offload --model NAME`` (:mod:`bench.model_offload`)."""
    from bench.model_offload import METHODS, MODELS, format_report, run_model_bench
    from refimpl.cli_errors import CliInputError, check_number, check_output_path

    if args.model not in MODELS:
        raise CliInputError(f"--model {args.model!r}: expected one of {sorted(MODELS)}")
    methods = [m for m in args.model_methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods):
        raise CliInputError(f"--model-methods {args.model_methods!r}: expected a comma-separated list of {list(METHODS)}")
    check_number("--cycles", args.cycles, lo=1, integer=True)
    check_output_path(args.out, "--out", is_dir=True)
    from refimpl.output import progress_bar

    with progress_bar(len(methods), f"bench offload --model {args.model}", enabled=not args.json) as tick:
        report = run_model_bench(args.model, device=args.device, cycles=args.cycles or 3, methods=methods,
                                 out=args.out, tick=tick)
    if args.json:
        from refimpl.output import envelope

        print(json.dumps(envelope("bench offload", report), indent=1, default=str))
    else:
        print(format_report(report, wide=args.wide))
    return 0 if all(m.get("bitwise_every_cycle", True) for m in report["methods"]) else 1


__all__ = ["add_arguments", "run", "run_offload"]
