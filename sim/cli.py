"""``timeshare sim``: run a simulated scenario and print a per-rank, per-phase summary.

* ``timeshare sim`` runs the built-in default scenario (one offload/reload
  cycle of a dense 7B shard on each of the 8 GPUs of one H200 HGX node);
* ``timeshare sim run FILE.json [--out result.json] [--trace trace.json]
  [--png timeline.png]`` runs a scenario file (or a shipped example by name,
  e.g. ``relax_4xa6000_qwen3_4b``), writes the JSON result, a Chrome trace
  (open it in https://ui.perfetto.dev) and a PNG timeline;
* ``timeshare sim list`` lists the topology presets and example scenarios.

Before a run it prints an estimate of its wall time and memory to stderr and
refuses it past ``--max-est-seconds`` / ``--max-est-gb`` (``--force`` runs it
anyway); while it runs it reports the simulated time and events every few
seconds. Symmetric jobs are folded (one node simulated for all, the result
expanded, identical to the full run; ``--no-fold`` turns it off).

The exit status is 0 when every invariant held, 1 when one was violated (the
JSON says which), 2 when the scenario itself is invalid (the message names the
field), 3 when the run was refused for its estimated cost.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Wire the ``sim`` subcommand's arguments into ``parser``."""
    sub = parser.add_subparsers(dest="sim_command", metavar="{run,list}")
    run = sub.add_parser("run", help="run a scenario file (or a shipped example by name)")
    run.add_argument("scenario", help="path to a scenario JSON file, or the name of a shipped example")
    run.add_argument("--out", metavar="RESULT.json", help="write the JSON result here")
    run.add_argument("--trace", metavar="TRACE.json", help="write a Chrome trace (opens in Perfetto)")
    run.add_argument("--png", metavar="TIMELINE.png", help="write a PNG timeline, one row per rank (needs matplotlib)")
    run.add_argument("--quiet", action="store_true", help="print only the result line, not the per-rank table")
    run.add_argument("--max-est-seconds", type=float, default=None, metavar="S",
                     help="refuse a run estimated to take longer (default 900)")
    run.add_argument("--max-est-gb", type=float, default=None, metavar="GB",
                     help="refuse a run estimated to need more memory (default 8)")
    run.add_argument("--force", action="store_true", help="run even past the estimate's budget")
    run.add_argument("--no-fold", action="store_true",
                     help="simulate every rank even where symmetric ranks could be simulated once (docs/sim.md)")
    run.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                     help="report simulated time and events to stderr every S seconds of wall time (default 5)")
    sub.add_parser("list", help="list topology presets and example scenarios")


def _run_one(name_or_path: str, out: str | None, trace: str | None, png: str | None, quiet: bool,
             args: argparse.Namespace | None = None) -> int:
    from sim.fold import plan_fold
    from sim.scale import (DEFAULT_MAX_GB, DEFAULT_MAX_SECONDS, BudgetError, Progress, SizeError, estimate,
                           precheck_file, run_auto)
    from sim.scenario import ScenarioError, load_scenario
    from sim.trace import Timeline, TraceError, write_chrome_trace, write_png

    max_s = getattr(args, "max_est_seconds", None)
    max_gb = getattr(args, "max_est_gb", None)
    force = getattr(args, "force", False)
    # a trace shows every rank, so it needs every rank simulated
    fold = not getattr(args, "no_fold", False) and not (trace or png)
    try:
        precheck_file(name_or_path)
        scn = load_scenario(name_or_path)
        planned = plan_fold(scn) if fold else (None, "folding turned off" if not (trace or png) else
                                               "a trace or timeline needs every rank")
        limits = (DEFAULT_MAX_SECONDS if max_s is None else max_s, DEFAULT_MAX_GB if max_gb is None else max_gb)

        def check(est) -> None:
            print(est.line(), file=sys.stderr)
            if not force:
                est.check(*limits)

        check(estimate(scn, *planned))
        with Progress(lambda line: print(line, file=sys.stderr, flush=True),
                      every_s=getattr(args, "progress_every", 5.0)) as progress:
            result, world, plan, _how = run_auto(scn, fold=fold, planned=planned, on_world=progress.watch,
                                                 check_full=check)
    except (ScenarioError, SizeError) as exc:
        print(f"error: invalid scenario: {exc}", file=sys.stderr)
        return 2
    except BudgetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(result.table().split("\n\n")[0] if not quiet else "", end="\n\n" if not quiet else "")
    print(result.table().split("\n\n", 1)[1])
    if out:
        Path(out).write_text(json.dumps(result.to_dict(), indent=1))
        print(f"result written to {out}")
    if trace or png:
        timeline = Timeline.from_world(world, faults=plan)
        try:
            if trace:
                write_chrome_trace(timeline, trace)
                print(f"Chrome trace written to {trace} (open it in https://ui.perfetto.dev)")
            if png:
                write_png(timeline, png, title=f"{scn.name} on {result.data['topology']['name']}")
                print(f"timeline written to {png}")
        except TraceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return result.exit_code


def _list() -> int:
    from sim.presets import list_presets, list_scenarios, load_preset_data, scenario_path

    print("topology presets:")
    for name in list_presets():
        print(f"  {name:<18} {load_preset_data(name).get('description', '')}")
    print("example scenarios (timeshare sim run NAME):")
    for name in list_scenarios():
        desc = json.loads(scenario_path(name).read_text()).get("description", "")
        print(f"  {name:<28} {desc[:100]}{'...' if len(desc) > 100 else ''}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare sim``; returns the exit status."""
    command = getattr(args, "sim_command", None)
    if command == "list":
        return _list()
    if command == "run":
        return _run_one(args.scenario, args.out, args.trace, args.png, args.quiet, args)
    return _run_one("default", None, None, None, False)


__all__ = ["add_arguments", "run"]
