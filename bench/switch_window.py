"""``timeshare bench switch-window``: what each process-group policy costs in the actor/rollout switch.

The switch window of one RL step is the time the trainer spends in ``sleep``
(pause), ``update_weights`` (weight sync) and ``wake_up`` (resume), the three
phases the Relax report measures. The switch cost, by which the rows are
ranked, is the window plus what training's first collectives after the wake
cost beyond the same collectives on live groups (the lazy NCCL init of groups
rebuilt at the wake): [Note: the switch cost] in :mod:`sim.machine.switch_cost`. Only the lifecycle's own work is in the
window here (no trainer offload, a tiny weight-sync all-gather), so the figures
are what the policy costs, and the rollout between pause and resume is where a
deferred cooldown can hide. Policies:

* ``DESTROY``: the Relax baseline (destroy with an inline port wait, rebuild
  for the weight sync, destroy and wait again, rebuild for training);
* ``DESTROY_DEFERRED``: the same with the wait deferred to the next rebuild;
* ``PAUSED_LIVE``: groups kept live (NCCL memory stays held in the rollout);
* ``SUSPEND``: groups kept, NCCL memory released (ncclCommSuspend/Resume).
* ``SUSPEND_PLANNED``: one agreed plan per group (keep / suspend / destroy),
  each group taken down once per step and brought back once at wake
  (:mod:`refimpl.comm.group_plan`); no sync groups are declared here, so all
  stay up through the weight sync, as in the GPU benchmark.
* ``SUSPEND_PLANNED_LAZY`` (a variant, not a policy): the same with the weight
  sync's TP group declared (the other groups go down at the pause) and a lazy
  wake: nothing comes back in ``wake_up``; the training step's first use of its
  groups brings them up (``PGLifecycle.use``), outside the window, in the
  "first collective after the wake" line.
* ``DESTROY_DEFERRED_PARALLEL``, ``SUSPEND_PLANNED_PARALLEL`` (variants): the
  same with each walk's destroys run together (``LifecycleConfig.parallel_destroy``):
  their proxy-poll waits overlap.

On CPU the job is simulated: 8 ranks, each a member of 14 groups (Megatron's
14 group families over a TP x CP x DP x PP mesh with EP experts), on the
``hgx-h200-8x`` topology preset with the communicator constants ``timeshare
sim calibrate`` fitted on the H200 records (``sim/presets/calibrated/``): one-
rank communicators as measured on one H200, communicators of two or more ranks
as measured on 2 x H200. The
same driver, :func:`run_steps`, runs on TorchRuntime for the GPU measurement
(``bench/gpu/comm_h200.py``). Ratios are against ``DESTROY`` in the same run.
"""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import asdict

from typing import TYPE_CHECKING, Any

from refimpl.cli_errors import one_line_errors

if TYPE_CHECKING:  # pragma: no cover
    from sim.calibrate.switch_window import PolicyResult

log = logging.getLogger(__name__)

#: the driver's pure parts live where the planner (sim/) may import them; their names stay importable from here,
#: loaded on first use (the driver imports torch; ``timeshare bench --help`` does not need it)
_DRIVER = ("RELAX_FAMILIES", "VARIANTS", "PolicyResult", "StepTimes", "first_use_after_wake", "mesh_groups",
           "plan_rules", "poll_period", "resolve", "row_config", "row_names", "run_steps", "simulate", "summarize",
           "summarize_simulated")
#: the rows ``--policy`` takes (the driver's ``row_names()``, lower case; tests/test_cli_lazy.py holds them equal)
POLICY_ROWS = ("destroy", "destroy_deferred", "paused_live", "suspend", "suspend_planned", "suspend_planned_lazy",
               "destroy_deferred_parallel", "suspend_planned_parallel")


def __getattr__(name: str) -> Any:
    """The driver's names (:data:`_DRIVER`) from :mod:`sim.calibrate.switch_window`, on first use."""
    if name in _DRIVER:
        import sim.calibrate.switch_window as driver

        return getattr(driver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

def format_results(results: list[PolicyResult], header: str, *, wide: bool = False) -> str:
    """A table with each policy's switch cost ([Note: the switch cost] in :mod:`sim.machine.switch_cost`), the window's
    phases beside it, the first use's extra, and the ratio of switch costs to DESTROY's (one library draws every
    ``timeshare`` table, :func:`refimpl.output.table`: units in every header, at most 100 columns unless ``wide``)."""
    from refimpl.output import table, wrap

    base = next((r.switch_cost for r in results if r.policy == "DESTROY"), None)
    rows = []
    for r in results:
        ratio = f"{r.switch_cost / base:.3f}" if base and r.switch_cost is not None else "-"
        held = "unknown" if r.held_in_rollout_gib is None else f"{r.held_in_rollout_gib:.2f}"
        cost = "-" if r.switch_cost is None else f"{r.switch_cost:.3f}"
        extra = "-" if r.first_use_extra is None else f"{r.first_use_extra:.3f}"
        rows.append([r.policy, cost, ratio, f"{r.sleep:.3f}", f"{r.update_weights:.3f}", f"{r.wake_up:.3f}",
                     f"{r.total:.3f}", extra, held, f"{r.device_used_in_rollout_gib:.2f}"])
    head = ["policy", "switch\ncost\n(s)", "vs\nDESTROY\n(x)", "sleep\n(s)", "update\n(s)", "wake\n(s)", "window\n(s)",
            "first\nuse +\n(s)", "NCCL\nrollout\n(GiB)", "device\nrollout\n(GiB)"]
    width = max([len("policy")] + [len(r.policy) for r in results])
    return "\n".join([wrap(header, wide=wide), table(head, rows, wide=wide, right=tuple(range(1, len(head))),
                                                     min_widths={0: width}),
                      wrap("switch cost = window (sleep + update + wake) + first use +: the training step's first "
                           "collectives after the wake beyond the same collectives on live groups (lazy NCCL init of "
                           "rebuilt groups); NCCL / device rollout: GPU memory NCCL holds / all GPU memory in use "
                           "during the rollout", wide=wide)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``timeshare bench switch-window``."""
    parser.add_argument("--dp", type=int, default=4, help="data-parallel size of the simulated mesh (default 4)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (default 2; ranks = dp * tp)")
    parser.add_argument("--cp", type=int, default=1, help="context-parallel size (default 1; ranks = tp * cp * dp * pp)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default 1)")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel size (default 1; experts over etp x ep x edp x pp)")
    parser.add_argument("--etp", type=int, default=None,
                        help="expert tensor-parallel size (default: --tp where tp x ep x pp divides the ranks, else 1)")
    parser.add_argument("--steps", type=int, default=4, help="RL steps per policy (default 4)")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the means (default 2: two-phase "
                        "enabling keeps the first step on the fallback path)")
    parser.add_argument("--train-s", type=float, default=30.0, help="simulated training time per step")
    parser.add_argument("--rollout-s", type=float, default=60.0, help="simulated rollout time per step")
    parser.add_argument("--cooldown-s", type=float, default=2.0, help="port-release cooldown (Relax: 2 s)")
    parser.add_argument("--topology", default="calibrated/hgx-h200-8x",
                        help="sim topology preset (a name, or a preset file) for collective, memory and communicator "
                             "models; a machine with a calibrated preset gets it (default: calibrated/hgx-h200-8x, "
                             "measured communicator constants; '' for the simulator's defaults)")
    parser.add_argument("--wake-proxies", choices=("on", "off"), default="on",
                        help="whether the runtime wakes NCCL's proxy thread in a destroy (default on, as TorchRuntime "
                             "does; off: each destroy waits for the proxy's next 500 ms poll, as without the waker)")
    parser.add_argument("--policy", action="append", metavar="POLICY",
                        help=f"policies (or variants) to run, any case: {', '.join(POLICY_ROWS)} "
                             "(repeatable; default all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--wide", action="store_true", help="the table up to 220 columns instead of 100")


def _check_mesh_size(args: argparse.Namespace) -> None:
    """The mesh's sizes before anything is built: each an integer >= 1, and the ranks they make within the
    topology's GPUs (without a topology, within the simulator's limit); CliInputError naming the limit."""
    from refimpl.cli_errors import CliInputError, check_number

    for opt, v in (("--dp", args.dp), ("--tp", args.tp), ("--cp", args.cp), ("--pp", args.pp), ("--ep", args.ep),
                   ("--steps", args.steps)):
        check_number(opt, v, lo=1, integer=True)
    if args.etp is not None:
        check_number("--etp", args.etp, lo=1, integer=True)
    ranks = args.dp * args.tp * args.cp * args.pp
    dims = [(o, v) for o, v in (("--dp", args.dp), ("--tp", args.tp), ("--cp", args.cp), ("--pp", args.pp))
            if v > 1 or o in ("--dp", "--tp")]
    said = " x ".join(f"{o} {v}" for o, v in dims) + f" = {ranks:,} ranks"
    lower = " or ".join(o for o, _ in dims)
    if args.topology:
        from sim.machine.topology import Topology
        from sim.presets import PresetError, list_presets, load_preset_data, preferred_preset

        args.topology = preferred_preset(args.topology)  # a machine's calibrated preset where one is shipped
        try:
            data = load_preset_data(args.topology)  # a built-in name, calibrated/NAME, or a preset file
        except PresetError:
            raise CliInputError(f"--topology {args.topology!r}: not a preset; expected one of {list_presets()}, "
                                "calibrated/hgx-h200-8x, a preset file (.json) or ''") from None
        gpus = Topology(data, where="--topology").num_gpus
        if ranks > gpus:
            raise CliInputError(f"{said}, but --topology {args.topology} has {gpus:,} GPUs; lower {lower}, or pick a "
                                "larger preset")
    else:
        from sim.scenarios.scale import MAX_RANKS

        if ranks > MAX_RANKS:
            raise CliInputError(f"{said}, past the simulator's limit of {MAX_RANKS:,} ranks; lower {lower}")


def _mesh_groups(args: argparse.Namespace) -> list:
    """The Megatron groups of the options' mesh (its sizes checked first, :func:`_check_mesh_size`); CliInputError
    for sizes that make none."""
    from refimpl.cli_errors import CliInputError
    from sim.calibrate.switch_window import MeshError, megatron_groups

    _check_mesh_size(args)
    try:
        return megatron_groups(tp=args.tp, dp=args.dp, cp=args.cp, pp=args.pp, ep=args.ep, etp=args.etp)
    except MeshError as exc:
        raise CliInputError(f"--tp/--cp/--dp/--pp/--ep/--etp: {exc}") from None


@one_line_errors
def run(args: argparse.Namespace) -> int:
    """Simulate every policy and print the switch window of each, with ratios against DESTROY."""
    from refimpl.cli_errors import CliInputError, check_number, check_output_path
    from refimpl.output import progress_bar, wrap
    from sim.calibrate.switch_window import (first_use_after_wake, mesh_groups, resolve, row_names, simulate,
                                             summarize_simulated)

    specs = _mesh_groups(args)
    check_number("--warmup", args.warmup, lo=0, integer=True)
    for opt, v in (("--train-s", args.train_s), ("--rollout-s", args.rollout_s), ("--cooldown-s", args.cooldown_s)):
        check_number(opt, v, lo=0)
    if args.warmup >= args.steps:
        raise CliInputError(f"--warmup ({args.warmup}) must be smaller than --steps ({args.steps})")
    if args.json:
        check_output_path(args.json, "--json")
    try:
        policies = [resolve(p)[0] for p in (args.policy or row_names())]
    except ValueError as exc:
        raise CliInputError(f"--policy: {exc}") from None
    results = []
    with progress_bar(len(policies), "switch-window") as tick:  # a bar with the time left on a terminal's stderr
        for policy in policies:
            per_rank = simulate(policy, dp=args.dp, tp=args.tp, cp=args.cp, pp=args.pp, ep=args.ep, etp=args.etp,
                                steps=args.steps, train_s=args.train_s, rollout_s=args.rollout_s,
                                cooldown_s=args.cooldown_s, topology=args.topology or None,
                                wake_proxies=args.wake_proxies == "on")
            results.append(summarize_simulated(policy, per_rank, args.warmup, args.topology or None))
            tick(policy)
    def say(text: str) -> None:
        print(wrap(text, wide=args.wide))

    groups = len([s for s in specs if 0 in s.ranks])
    world = args.dp * args.tp * args.cp * args.pp
    mesh = f"tp {args.tp} cp {args.cp} dp {args.dp} pp {args.pp} ep {args.ep}"
    header = (f"switch cost per RL step (simulated): {world} ranks ({mesh}), {groups} Megatron groups per rank, "
              f"topology {args.topology or 'defaults'}, proxy waker {args.wake_proxies}, cooldown {args.cooldown_s:g} s, "
              f"rollout {args.rollout_s:g} s; "
              f"mean of steps {args.warmup + 1}-{args.steps}, slowest rank")
    print(format_results(results, header, wide=args.wide))
    late = [f"{r.policy} {ph}" for r in results for ph in r.poll_late]
    if late:
        period = max(r.poll_period_s for r in results)
        rate = max(r.poll_late_rate for r in results)
        say(f"may end one NCCL proxy poll period ({period:g} s) later in some steps (a destroy waits for a poll "
              "timeout closer than the poll phases move between steps; docs/calibration.md): " + ", ".join(late)
              + (f"; expected {rate:.3f} x {period:g} s more each (the late-walk rate of the fit records)" if rate else ""))
    wrong = [r.policy for r in results if r.bitwise_after_wake is False]
    say("first collectives after every wake bitwise right: " + ("all rows" if not wrong else f"NOT for {wrong}"))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            from refimpl.output import envelope

            settings = {"dp": args.dp, "tp": args.tp, "cp": args.cp, "pp": args.pp, "ep": args.ep, "etp": args.etp,
                        "steps": args.steps, "warmup": args.warmup, "train_s": args.train_s,
                        "rollout_s": args.rollout_s, "cooldown_s": args.cooldown_s, "groups_per_rank": groups,
                        "topology": args.topology or None, "wake_proxies": args.wake_proxies == "on"}
            json.dump(envelope("bench switch-window", {"header": header, "settings": settings,
                                                       "results": [asdict(r) for r in results]}), f, indent=1)
    return 0


__all__ = ["POLICY_ROWS", "RELAX_FAMILIES", "VARIANTS", "PolicyResult", "StepTimes", "add_arguments", "first_use_after_wake",
           "format_results", "mesh_groups", "plan_rules", "poll_period", "resolve", "row_config", "row_names", "summarize_simulated",
           "run", "run_steps", "simulate", "summarize"]
