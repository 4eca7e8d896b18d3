"""``timeshare sim validate``: replay each record's workload in the simulator, predicted against measured.

It lives with the benchmarks (the application floor) because it runs their
switch-window driver; ``refimpl.cli`` wires it under ``timeshare sim``.

For a ``multigpu`` record (:mod:`sim.calibrate.records`) the lifecycle benchmark of
:mod:`bench.switch_window` runs with the record's settings (mesh
``dp`` x ``tp``, steps, warmup, train, rollout, cooldown) on a simulated world
of the preset, each policy the record has, and every phase (``sleep``,
``update_weights``, ``wake_up``, ``total``) is compared; so is the order of the
policies by total time. For an offload report the store's steady offload and
reload of each shape are compared (:func:`sim.calibrate.calibration.compare`), with the
preset's own PCIe rates rather than the ones measured in the same run, the
report's phase gap, and the memory another role freed right before the reload
(``other_role_bytes``), which the driver scrubs while the reload waits. A
multigpu record's ``dedup`` section (the ``local`` and ``local_dedup`` reloads
of replicated state on every rank at once) is replayed by
:mod:`bench.validate_dedup`, held to the offload tolerance.

[Note: how the switch window is charged] Every rank runs the lifecycle's
code. Each communicator operation is charged per rank, on the rank that does
it, one group after the other in the lifecycle's sorted walk, at the cost of
that group's size class (one-rank or multi-rank, :class:`sim.models.collectives.NcclComm`);
the ranks run in parallel, so a phase costs the slowest rank's walk, not the
sum over ranks. torch creates NCCL communicators lazily, so a rebuilt group
costs the process-group object at ``recreate_group`` and the NCCL init at its
first collective (charged by the collective itself, ``init_at_collective``);
a group destroyed before any collective costs ``destroy_uninitialized``, an
initialised one waits for its NCCL proxy thread's next 500 ms poll timeout
(``proxy_poll``, from the end of its init) and costs ``destroy`` more. So the
weight sync, which destroys the sync group right after its first collective,
waits almost a whole poll period, and a pause that destroys the groups the
training step just initialised is paced by those inits. Agreements are
collectives on the Gloo control group (``agreement`` each, where the preset has
it); a canary on a just-resumed group pays ``resume_first_collective`` on top of
the collective model.

[Note: a phase one poll period late] Which poll timeout a destroy catches is
decided by milliseconds: the proxy poll phases of a training step's
communicators move against one another by up to ``poll_phase_spread`` between
steps (fitted on ``bench/gpu/destroy_walk_probe.py`` records). So a phase whose
walk has a destroy waiting less than that for its timeout
(:attr:`sim.calibrate.switch_window.PolicyResult.poll_late`) ends, in each step, either
when the model says or one poll period (0.5 s) later, and every later destroy
of the walk with it; the same code on the same machine type measured
SUSPEND_PLANNED's weight sync at 2.02 s in every step of two runs and 1.51 s
in every step of a third. For such a phase the prediction compared is the
model's plus ``k/n`` periods, ``n`` the measured steps and ``k`` the count
of measured steps whose own figure (the record's lifecycle spans, slowest
rank) exceeds the model's by more than half a period; a record without spans
gets the ``k`` (0..n) that matches its mean best. The row says ``k of n
steps one poll late``, the total adds the phases' ``k``, and the ranking is
taken on those totals (the model's own ranking, every step on time, is in
``facts["nominal_order"]``). Phases without such a destroy have one prediction.

A record part that was used to fit the preset (a constant's ``source`` names
the record file, with no ``#section`` or with the same section, or its
directory) is refused: fit and validation sets must be disjoint.
"""
from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from sim.calibrate.records import PHASES, MultiGpuRecord, OffloadRecord, Record, RecordError

log = logging.getLogger(__name__)

#: default tolerances: switch-window phases 15%, offload/reload 10% (issue 11)
SWITCH_TOLERANCE = 0.15
OFFLOAD_TOLERANCE = 0.10
#: phases shorter than this are compared in absolute terms (|error| <= tolerance x this)
ABS_FLOOR_S = 0.1


@dataclass(frozen=True)
class Row:
    """One compared figure."""

    record: str
    what: str
    measured: float
    predicted: float
    tolerance: float
    floor_s: float = 0.0
    #: how the prediction was matched, where a phase may end a poll period late ([Note: a phase one poll period late])
    note: str = ""

    @property
    def rel_error(self) -> float:
        """(predicted - measured) / measured (inf when nothing was measured)."""
        return (self.predicted - self.measured) / self.measured if self.measured else float("inf")

    @property
    def ok(self) -> bool:
        """Within tolerance x max(measured, floor)."""
        return abs(self.predicted - self.measured) <= self.tolerance * max(self.measured, self.floor_s)


def fitted_on(preset_data: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``(path, section or None)`` of every record or results directory a preset constant's source names."""
    out = []
    for c in preset_data.get("constants", {}).values():
        for m in re.finditer(r"bench/results/[\w.\-/]+(?:#\w+)?", str(c.get("source", ""))):
            path, _, section = m.group(0).rstrip("/.").partition("#")
            out.append((path.rstrip("/"), section or None))
    return out


def check_disjoint(preset_data: dict[str, Any], record: Record, section: str) -> None:
    """Raise RecordError if ``section`` of ``record`` was used to fit the preset."""
    name = record.name
    parent = str(Path(name).parent)
    for path, sec in fitted_on(preset_data):
        if path == parent or (path == name and sec in (None, section)):
            raise RecordError(
                f"{name}#{section} is in the fit set of preset {preset_data.get('name')!r} (a constant's source "
                f"names {path}{'#' + sec if sec else ''}); validate on records the preset was not fitted to, or "
                "calibrate a preset without it"
            )


def simulate_switch_window(preset: str, settings: dict[str, Any], policies: Iterable[str]) -> dict[str, Any]:
    """Each policy's :class:`PolicyResult` for a record's settings, simulated on ``preset`` (the
    switch-window benchmark's own simulation, :func:`bench.switch_window.simulate`)."""
    from bench.switch_window import mesh_groups, resolve, row_names, simulate, summarize_simulated

    dp, tp = settings["dp"], settings["tp"]
    per_rank = len([s for s in mesh_groups(dp, tp) if 0 in s.ranks])
    if per_rank != settings["groups_per_rank"]:
        raise RecordError(f"settings.groups_per_rank: the record says {settings['groups_per_rank']} but "
                          f"mesh_groups({dp}, {tp}) gives {per_rank}; the benchmark's group families changed")
    out = {}
    for name in policies:
        try:
            policy, _ = resolve(name)  # a PGPolicy's name or a benchmark variant's (SUSPEND_PLANNED_LAZY)
        except ValueError:
            raise RecordError(f"switch_window.results: unknown policy {name!r}; known: {row_names()}") from None
        per_rank_steps = simulate(policy, dp=dp, tp=tp, steps=settings["steps"], train_s=settings["train_s"],
                                  rollout_s=settings["rollout_s"], cooldown_s=settings["cooldown_s"], topology=preset)
        out[name] = summarize_simulated(policy, per_rank_steps, settings["warmup"], preset)
    return out


def late_steps(nominal: float, measured: float, period_s: float, steps: int) -> int:
    """How many of ``steps`` measured steps ended one poll period late, as the measured mean over them says best:
    the ``k`` in ``0..steps`` that puts ``nominal + k * period_s / steps`` nearest ``measured``."""
    return min(range(steps + 1), key=lambda k: abs(nominal + k * period_s / steps - measured))


def validate_switch_window(record: MultiGpuRecord, preset: str, *, tolerance: float = SWITCH_TOLERANCE,
                           floor_s: float = ABS_FLOOR_S) -> tuple[list[Row], dict[str, Any]]:
    """Rows per policy and phase, and facts: predicted/measured ranking, NCCL memory in the rollout."""
    from sim.presets import load_preset_data
    from sim.models.topology import Topology

    sw = record.switch_window
    if sw is None:
        raise RecordError(f"{record.name}: no switch_window to validate")
    data = load_preset_data(preset)
    check_disjoint(data, record, "switch_window")
    topo = Topology(data, where=f"preset {preset!r}")
    if record.world_size > topo.num_gpus:
        raise RecordError(f"{record.name}: world size {record.world_size} does not fit preset {preset!r} "
                          f"({topo.num_gpus} GPUs)")
    predicted = simulate_switch_window(preset, dict(sw.settings), sw.results)
    n = sw.settings["steps"] - sw.settings["warmup"]
    rows, totals, late = [], {}, {}
    for name, meas in sw.results.items():
        pred = predicted[name]
        k_sum = 0
        for phase in PHASES:
            value, note = getattr(pred, phase), ""
            if phase in pred.poll_late and meas[phase] is not None:
                per_step = sw.steps.get(name, {}).get(phase)
                if per_step:  # each measured step's own figure says whether it was late
                    k = sum(d - value > pred.poll_period_s / 2 for d in per_step[sw.settings["warmup"]:])
                    how = "per the steps' spans"
                else:
                    k = late_steps(value, meas[phase], pred.poll_period_s, n)
                    how = "per the mean"
                value, note = value + k * pred.poll_period_s / n, f"{k} of {n} steps one poll late ({how})"
                k_sum += k
                late[f"{name} {phase}"] = (k, n)
            if meas[phase] is not None:
                rows.append(Row(record.name, f"{name} {phase}", meas[phase], value, tolerance, floor_s, note))
        totals[name] = pred.total + k_sum * pred.poll_period_s / n
        if meas["total"] is not None:
            rows.append(Row(record.name, f"{name} total", meas["total"], totals[name], tolerance, floor_s,
                            f"{k_sum} late phase-steps of {n} steps" if pred.poll_late else ""))
    measured_order = sorted(sw.results, key=lambda p: sw.results[p]["total"])
    predicted_order = sorted(sw.results, key=lambda p: totals[p])
    nominal_order = sorted(sw.results, key=lambda p: predicted[p].total)
    memory = {p: (sw.results[p]["held_in_rollout_gib"], predicted[p].held_in_rollout_gib) for p in sw.results}
    return rows, {"measured_order": measured_order, "predicted_order": predicted_order,
                  "nominal_order": nominal_order, "poll_late": late, "memory_gib": memory}


def validate_offload(record: OffloadRecord, preset: str, *, tolerance: float = OFFLOAD_TOLERANCE) -> list[Row]:
    """Rows per shape: the store's steady offload and reload, predicted with the preset's own line rates."""
    from sim.calibrate.calibration import compare
    from sim.presets import load_preset_data

    check_disjoint(load_preset_data(preset), record, "shapes")
    rows = []
    for r in compare(dict(record.data), preset=preset, line_rates="preset"):
        rows.append(Row(record.name, f"{r['shape']} {r['phase']}", r["measured_s"], r["predicted_s"], tolerance))
    return rows


def validate_dedup(record: MultiGpuRecord, preset: str, offload_preset: str, *,
                   tolerance: float = OFFLOAD_TOLERANCE) -> list[Row]:
    """Rows for the record's ``dedup`` section: each reload replayed by :func:`bench.validate_dedup.compare_dedup`."""
    from bench.validate_dedup import compare_dedup
    from sim.presets import load_preset_data

    for p in (preset, offload_preset):
        check_disjoint(load_preset_data(p), record, "dedup")
    return [Row(record.name, what, measured, predicted, tolerance)
            for what, measured, predicted in compare_dedup(record, preset, offload_preset)]


def format_rows(rows: list[Row]) -> str:
    """A table: measured, predicted, error and verdict per row."""
    lines = [f"{'record / what':<70}{'measured s':>12}{'predicted s':>13}{'error':>9}  verdict"]
    for r in rows:
        err = f"{r.rel_error:+.1%}" if r.measured else "-"
        limit = f"{r.tolerance:.0%}" + (f" (floor {r.floor_s:g} s)" if r.floor_s and r.measured < r.floor_s else "")
        lines.append(f"{(Path(r.record).parent.name + ' ' + r.what)[:69]:<70}{r.measured:>12.4f}{r.predicted:>13.4f}"
                     f"{err:>9}  {'ok' if r.ok else 'OUTSIDE'} {limit}" + (f"; {r.note}" if r.note else ""))
    return "\n".join(lines)


def median_abs_error(rows: list[Row]) -> float:
    """The median |relative error| of the rows (0 without rows)."""
    return statistics.median(abs(r.rel_error) for r in rows) if rows else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``timeshare sim validate``."""
    parser.add_argument("records", nargs="+", metavar="RECORD.json", help="the validation set (multigpu, offload reports)")
    parser.add_argument("--preset", default="calibrated/hgx-h200-8x",
                     help="preset for switch-window records (default: the shipped calibrated hgx-h200-8x)")
    parser.add_argument("--offload-preset", default="calibrated/h200-1x",
                     help="preset for offload reports (default: the shipped calibrated h200-1x)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="per switch-window phase (default 0.15)")
    parser.add_argument("--offload-tolerance", type=float, default=0.10, help="per offload/reload (default 0.10)")
    parser.add_argument("--floor-s", type=float, default=0.1,
                     help="phases shorter than this are held to tolerance x this many seconds (default 0.1)")
    parser.add_argument("--no-dedup", action="store_true",
                        help="leave out the dedup section of multigpu records (its replay takes a few seconds)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare sim validate``: every record, predicted against measured; the exit status."""
    from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
    from sim.presets import PresetError, load_preset_data
    from sim.calibrate.records import load_record

    rows, orders_ok, checked = [], True, 0
    try:
        for path in args.records:
            rec = load_record(path)
            dedup_rows = []
            if isinstance(rec, MultiGpuRecord) and rec.dedup and not args.no_dedup:
                dedup_rows = validate_dedup(rec, args.preset, args.offload_preset, tolerance=args.offload_tolerance)
            window = isinstance(rec, MultiGpuRecord) and rec.switch_window is not None
            if window and dedup_rows:  # a switch window the preset was fitted on leaves the dedup rows to check
                try:
                    check_disjoint(load_preset_data(args.preset), rec, "switch_window")
                except RecordError as exc:
                    print(f"{rec.name}: switch_window not validated: {exc}")
                    window = False
            if isinstance(rec, MultiGpuRecord) and not window and dedup_rows:
                rows += dedup_rows
            elif window:
                rows += dedup_rows
                r, facts = validate_switch_window(rec, args.preset, tolerance=args.tolerance, floor_s=args.floor_s)
                rows += r
                same = facts["measured_order"] == facts["predicted_order"]
                orders_ok &= same
                if rec.eager_init:
                    print(f"{rec.name}: measured with the default group bound to a device (NCCL initialised at "
                          "new_group); the simulator models torch's lazy init, so rebuilds are predicted cheaper")
                print(f"{rec.name}: policies by total, measured {' < '.join(facts['measured_order'])}; predicted "
                      f"{' < '.join(facts['predicted_order'])} ({'same' if same else 'DIFFERENT'})"
                      + ("" if facts["nominal_order"] == facts["predicted_order"] else
                         f"; with every step on time the model ranks {' < '.join(facts['nominal_order'])}"))
                for pol, (meas, pred) in facts["memory_gib"].items():
                    if meas is not None:
                        print(f"  {pol} NCCL memory in the rollout: measured {meas:.2f} GiB, predicted {pred:.2f} GiB "
                              "(reported, not checked)")
            elif isinstance(rec, OffloadRecord):
                rows += validate_offload(rec, args.offload_preset, tolerance=args.offload_tolerance)
            else:
                print(f"{rec.name}: nothing to validate (no switch_window or dedup section, not an offload report)")
                continue
            checked += 1
    except (RecordError, PresetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_rows(rows))
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)} of {len(rows)} figures within tolerance over {checked} record(s)"
          + ("" if orders_ok else "; the predicted ranking of policies differs from the measured one"))
    return EXIT_OK if rows and not bad and orders_ok else EXIT_FAILED


__all__ = ["ABS_FLOOR_S", "OFFLOAD_TOLERANCE", "Row", "SWITCH_TOLERANCE", "add_arguments", "check_disjoint",
           "fitted_on", "format_rows", "late_steps", "median_abs_error", "run", "simulate_switch_window", "validate_dedup",
           "validate_offload", "validate_switch_window"]
