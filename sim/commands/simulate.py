"""``timeshare sim``: run a simulated scenario and print a per-rank, per-phase summary.

* ``timeshare sim`` runs the built-in default scenario (one offload/reload
  cycle of a dense 7B shard on each of the 8 GPUs of one H200 HGX node);
* ``timeshare sim run FILE.json [--out result.json] [--trace trace.json]
  [--png timeline.png]`` runs a scenario file (or a shipped example by name,
  e.g. ``relax_4xa6000_qwen3_4b``), writes the JSON result, a Chrome trace
  (open it in https://ui.perfetto.dev) and a PNG timeline;
* ``timeshare sim list`` lists the topology presets and example scenarios;
* ``timeshare sim calibrate RECORD.json... --out PRESET.json [--canary-from RECORD.json]``
  fits the communicator and scrub constants on a fit set of records (:mod:`sim.calibrate.fit`,
  :mod:`sim.calibrate.fit_window`);
* ``timeshare sim validate RECORD.json...`` replays each record in the
  simulator and prints predicted against measured (:mod:`bench.validate`,
  wired here by ``refimpl.cli``); exit 1 when a figure is outside its
  tolerance or the policies rank differently.
* ``timeshare sim compare A B`` puts two runs' phases side by side
  (:mod:`sim.scenarios.compare`).

Before a large run it prints an estimate of its wall time and memory to stderr;
it refuses a run past ``--max-est-seconds`` / ``--max-est-gb`` (``--force`` runs it
anyway); while it runs it reports the simulated time and events every few
seconds. Symmetric jobs are folded (a node or two simulated for all, the result
expanded, identical to the full run; ``--no-fold`` turns it off; see
:mod:`sim.scenarios.fold`, :mod:`sim.scenarios.scale`).

Scenarios may be JSON or YAML; ``--set key=value`` overrides a field (dotted
keys, JSON-typed values; :mod:`sim.scenarios.scenario_io`). ``--json`` prints the result
in the common envelope (:mod:`refimpl.output`) instead of the table.

The exit status is 0 when every invariant held, 3 when one was violated (the
JSON says which), 2 when the input is invalid (the scenario, a ``--set``, or an
output path that cannot be written, a world past the simulator's size limit or
a run past its estimate's budget; one line names it) — see
:mod:`refimpl.cli_errors`.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> Any:
    """Wire the ``sim`` subcommand's arguments into ``parser``; returns its subparsers, to which
    ``refimpl.cli`` adds ``validate`` (it drives the benchmarks, a floor above the simulator)."""
    sub = parser.add_subparsers(dest="sim_command", metavar="{run,list,compare,calibrate,validate}")
    run = sub.add_parser("run", help="run a scenario file (or a shipped example by name)")
    run.add_argument("scenario", help="path to a scenario JSON or YAML file, or the name of a shipped example")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario field, e.g. --set workload.rollout_s=30 --set pg_policy=suspend (repeatable)")
    run.add_argument("--json", action="store_true", help="print the result as JSON (common envelope) instead of the table")
    run.add_argument("--out", metavar="RESULT.json", help="write the JSON result here")
    run.add_argument("--trace", metavar="TRACE.json", help="write a Chrome trace (opens in Perfetto)")
    run.add_argument("--png", metavar="TIMELINE.png", help="write a PNG timeline, one row per rank (needs matplotlib)")
    run.add_argument("--quiet", action="store_true", help="print only the result line, not the per-rank table")
    run.add_argument("--wide", action="store_true", help="the per-rank table up to 220 columns instead of 100")
    run.add_argument("--max-est-seconds", type=float, default=None, metavar="S",
                     help="refuse a run estimated to take longer (default 900)")
    run.add_argument("--max-est-gb", type=float, default=None, metavar="GB",
                     help="refuse a run estimated to need more memory (default 8)")
    run.add_argument("--force", action="store_true", help="run even past the estimate's budget")
    run.add_argument("--no-fold", action="store_true",
                     help="simulate every rank even where symmetric ranks could be simulated once (docs/sim.md)")
    run.add_argument("--progress-every", type=float, default=5.0, metavar="S",
                     help="report simulated time and events to stderr every S seconds of wall time (default 5)")
    lst = sub.add_parser("list", help="list every preset (topologies, scenarios, models) and what it was measured on")
    lst.add_argument("--wide", action="store_true", help="tables up to 220 columns instead of 100")
    cmp_ = sub.add_parser("compare", help="two runs' phases side by side (results, or scenarios to run)")
    cmp_.add_argument("a", help="a result JSON (sim run --out) or a scenario file/name")
    cmp_.add_argument("b", help="a result JSON or a scenario file/name")
    cmp_.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override applied to both scenarios")
    cmp_.add_argument("--set-b", action="append", default=[], metavar="KEY=VALUE", help="override applied to B only")
    cmp_.add_argument("--json", action="store_true", help="print the comparison as JSON (common envelope)")
    cmp_.add_argument("--wide", action="store_true", help="the table up to 220 columns instead of 100")
    cal = sub.add_parser("calibrate", help="fit communicator and scrub constants on records; write a preset")
    cal.add_argument("records", nargs="+", metavar="RECORD.json", help="the fit set (multigpu, comm_h200, scrub probe)")
    cal.add_argument("--base", default="hgx-h200-8x", help="preset whose other constants are kept (default hgx-h200-8x)")
    cal.add_argument("--out", required=True, metavar="PRESET.json", help="where to write the calibrated preset")
    cal.add_argument("--canary-from", action="append", default=[], metavar="RECORD.json",
                     help="a multigpu record whose SUSPEND wake_up gives the first collective after a resume of a "
                          "multi-rank communicator (sim.calibrate.fit_window); its switch_window joins the fit set")
    return sub


def _check_outputs(out: str | None, trace: str | None, png: str | None) -> None:
    """Output paths are checked before the run (raises CliInputError, one line)."""
    from refimpl.cli_errors import check_output_path

    if out:
        check_output_path(out, "--out")
    if trace:
        check_output_path(trace, "--trace")
    if png:
        check_output_path(png, "--png", suffix=".png")


def _run_one(name_or_path: str, out: str | None, trace: str | None, png: str | None, quiet: bool,
             sets: list[str] | None = None, as_json: bool = False, args: argparse.Namespace | None = None) -> int:
    from sim.scenarios.scale import command_gc

    with command_gc():  # see [Note: the cyclic GC of a command] in sim/scenarios/scale.py
        return _run_one_scenario(name_or_path, out, trace, png, quiet, sets, as_json, args)


def _run_one_scenario(name_or_path: str, out: str | None, trace: str | None, png: str | None, quiet: bool,
                      sets: list[str] | None, as_json: bool, args: argparse.Namespace | None) -> int:
    from refimpl.cli_errors import EXIT_BAD_INPUT, CliInputError, describe_os_error
    from refimpl.output import ProgressBar, envelope
    from sim.scenarios.fold import plan_fold
    from sim.scenarios.scale import (DEFAULT_MAX_GB, DEFAULT_MAX_SECONDS, BudgetError, Progress, SizeError, check_size, estimate,
                           run_auto)
    from sim.scenarios.scenario import ScenarioError, parse_scenario
    from sim.scenarios.scenario_io import apply_overrides, read_scenario_raw
    from sim.scenarios.trace import Timeline, TraceError, write_chrome_trace, write_png

    max_s = getattr(args, "max_est_seconds", None)
    max_gb = getattr(args, "max_est_gb", None)
    force = getattr(args, "force", False)
    # a trace shows every rank, so it needs every rank simulated
    fold = not getattr(args, "no_fold", False) and not (trace or png)
    try:
        _check_outputs(out, trace, png)
        raw = apply_overrides(read_scenario_raw(name_or_path), list(sets or []))
        check_size(raw.get("world_size") if isinstance(raw, dict) else None)  # before anything is built
        scn = parse_scenario(raw)
    except (ScenarioError, CliInputError, SizeError) as exc:
        bad_scenario = isinstance(exc, (ScenarioError, SizeError))
        print(f"error: {'invalid scenario: ' if bad_scenario else ''}{exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    limits = (DEFAULT_MAX_SECONDS if max_s is None else max_s, DEFAULT_MAX_GB if max_gb is None else max_gb)

    def check(est) -> None:
        if est.large:
            print(est.line(), file=sys.stderr)
        if not force:
            est.check(*limits)

    try:
        planned = plan_fold(scn) if fold else (None, "folding turned off" if not (trace or png) else
                                               "a trace or timeline needs every rank")
        check(estimate(scn, *planned, writes_json=bool(out or as_json)))
        # a bar with the time left on a terminal (off with --quiet or --json); else a line every few seconds
        with ProgressBar(f"simulating {scn.name}", 0, enabled=not (quiet or as_json)) as bar, \
                Progress(lambda line: print(line, file=sys.stderr, flush=True), every_s=getattr(args, "progress_every", 5.0),
                         bar=(lambda done, total, label: bar.update(done, total, label)) if bar.drawing else None,
                         steps=scn.steps) as progress:
            result, world, plan, _how = run_auto(scn, fold=fold, planned=planned, on_world=progress.watch,
                                                 check_full=check, writes_json=bool(out or as_json))
    except ScenarioError as exc:  # a check the runner makes on the scenario (e.g. its size)
        print(f"error: invalid scenario: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BudgetError as exc:  # nothing was run
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    info = sys.stderr if as_json else sys.stdout
    if as_json:
        print(json.dumps(envelope("sim run", result.to_dict(), ok=result.ok), indent=1))
    else:
        text = result.table(wide=getattr(args, "wide", False))
        print(text.split("\n\n")[0] if not quiet else "", end="\n\n" if not quiet else "")
        print(text.split("\n\n", 1)[1])
    try:
        if out:
            with open(out, "w") as f:  # streamed: 131,072 ranks make 210 MB of JSON, never held whole in memory
                json.dump(result.to_dict(), f, indent=1)
            print(f"result written to {out}", file=info)
        if trace or png:
            timeline = Timeline.from_world(world, faults=plan)
            if trace:
                write_chrome_trace(timeline, trace)
                print(f"Chrome trace written to {trace} (open it in https://ui.perfetto.dev)", file=info)
            if png:
                write_png(timeline, png, title=f"{scn.name} on {result.data['topology']['name']}")
                print(f"timeline written to {png}", file=info)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        print(f"error: {describe_os_error(exc, 'writing the output')}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return result.exit_code


def _compare(args: argparse.Namespace) -> int:
    from refimpl.cli_errors import EXIT_BAD_INPUT
    from refimpl.output import envelope
    from sim.scenarios.compare import compare, format_compare, load_side
    from sim.scenarios.scenario import ScenarioError

    try:
        la, a = load_side(args.a, args.set)
        lb, b = load_side(args.b, [*args.set, *args.set_b])
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rows = compare(a, b)
    if args.json:
        print(json.dumps(envelope("sim compare", {"a": la, "b": lb, "rows": rows}, ok=bool(a.get("ok") and b.get("ok"))),
                         indent=1))
    else:
        print(format_compare(la, lb, a, b, rows, wide=args.wide))
    return 0


def _list(wide: bool = False) -> int:
    """Every preset a command accepts, with what it is and what its figures were measured or fitted on."""
    from refimpl.output import table
    from sim.presets import list_calibrated, list_presets, list_scenarios, load_preset_data, scenario_path
    from sim.presets.wording import basis, in_user_words

    rows = []
    calibrated = list_calibrated()
    for name in list_presets():
        data = load_preset_data(name)
        nodes = data.get("nodes", 1)
        gpus = sum(1 for e in data.get("node", {}).get("elements", []) if e.get("kind") == "gpu")
        desc = in_user_words(str(data.get("description", "")))
        rows.append([name, f"{gpus}" + (f" x {nodes} nodes" if nodes > 1 else ""), desc, basis(data)])
    print(table(["preset (--topology, --cluster)", "GPUs", "what it is", "constants: where from"], rows, wide=wide,
                title="topology presets (every constant's source: timeshare sim run --json, topology.constants)"))
    print()
    print("calibrated presets (measured communicator constants; each the default for its machine):")
    for name in calibrated:
        fit = in_user_words(str(load_preset_data(name).get("fitted_on", {}).get("words", "measurements")))
        import textwrap

        fit = fit.replace("NCCL communicator costs on one H200, NCCL communicator costs on",
                          "NCCL communicator costs on one H200 and on")
        print(textwrap.fill(f"{name} fitted on {fit}", width=100, initial_indent="  ", subsequent_indent=" " * 6))
    for name in list_presets():
        if f"calibrated/{name}" in calibrated:
            print(f"  {name}: (plan and bench use calibrated/{name} for it)")
    print()
    rows = []
    for name in list_scenarios():
        desc = in_user_words(json.loads(scenario_path(name).read_text()).get("description", ""))
        rows.append([name, desc if wide or len(desc) <= 150 else desc[:147] + "..."])
    print(table(["scenario (timeshare sim run NAME)", "what it runs"], rows, wide=wide, title="example scenarios"))
    print()
    from sim.planner.plan_inputs import MODEL_PRESETS

    rows = [[name, source] for name, (_arch, source, _k) in MODEL_PRESETS.items()]
    print(table(["model (timeshare plan --model)", "shapes read from"], rows, wide=wide, title="model presets"))
    return 0


def _record_name(where: str) -> str:
    """A record's folder and file (and section), without the directories above: ``run1/comm.json#comm_raw``."""
    path, _, section = where.partition("#")
    p = Path(path)
    return f"{p.parent.name}/{p.name}" + (f"#{section}" if section else "")


def _calibrate(args: argparse.Namespace) -> int:
    from refimpl.cli_errors import EXIT_BAD_INPUT
    from sim.calibrate.fit import calibrated_preset, write_preset
    from sim.presets import PresetError
    from sim.calibrate.records import RecordError, load_record

    try:
        records = [load_record(p) for p in args.records]
        data, obs = calibrated_preset(args.base, records, canary_from=[load_record(p) for p in args.canary_from])
        path = write_preset(data, args.out)
    except (RecordError, PresetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    from refimpl.output import table

    rows = [[o.constant, f"{o.value:.6g}", f"{_record_name(o.record)}: {o.how}"] for o in obs]
    print(table(["constant", "value\n(s, B, B/s)", "fitted from (record: how)"], rows, right=(1,),
                min_widths={0: max([8] + [len(o.constant) for o in obs])},
                title=f"fitted on {len(records)} record(s), base preset {args.base}"))
    print(f"wrote {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare sim``; returns the exit status."""
    command = getattr(args, "sim_command", None)
    if command == "list":
        return _list(getattr(args, "wide", False))
    if command == "calibrate":
        return _calibrate(args)
    if command == "run":
        return _run_one(args.scenario, args.out, args.trace, args.png, args.quiet, args.set, args.json, args)
    if command == "compare":
        return _compare(args)
    return _run_one("default", None, None, None, False)


__all__ = ["add_arguments", "run"]
