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
that group's size class (one-rank or multi-rank, :class:`sim.machine.collectives.NcclComm`);
the ranks run in parallel, so a phase costs the slowest rank's walk, not the
sum over ranks. torch creates NCCL communicators lazily, so a rebuilt group
costs the process-group object at ``recreate_group`` and the NCCL init at its
first collective (charged by the collective itself, ``init_at_collective``);
a group destroyed before any collective costs ``destroy_uninitialized``, an
initialised one ``destroy``, after, where the record's runtime did not wake
NCCL's proxy thread (its ``wake_proxies``, [Note: the runtime's proxy waker in
a record] in :mod:`sim.calibrate.records`), the wait for the thread's next
500 ms poll timeout (``proxy_poll``, from the end of its init). So without the
waker the weight sync, which destroys the sync group right after its first
collective, waits almost a whole poll period, and a pause that destroys the
groups the training step just initialised is paced by those inits. Agreements are
collectives on the Gloo control group (``agreement`` each, where the preset has
it); a canary on a just-resumed group pays ``resume_first_collective`` on top of
the collective model.

[Note: a phase one poll period late] Which poll timeout a destroy catches is
decided by milliseconds: the proxy poll phases of a training step's
communicators move against one another by up to ``poll_phase_spread`` between
steps (fitted on ``bench/gpu/destroy_walk_probe.py`` records). So a phase whose
walk has a destroy waiting less than that for its timeout
(:attr:`sim.calibrate.switch_window.PolicyResult.poll_late`) ends, in each step, either
when the model says or one poll period (0.5 s) later. How often is fitted on
the probe records alone (``poll_late_rate``: the fraction of their walks over
just-initialised groups that took a period longer, :func:`sim.calibrate.destroy_walks.late_walks`),
so such a phase is predicted as its expected figure, the model's plus
``poll_late_rate`` periods (:meth:`sim.calibrate.switch_window.PolicyResult.expected`),
with the range from the model's figure to a whole period more, and scored
against the measured mean. Nothing of the validated record decides it.

[Note: validate is blind] No constant, spread, rate or correction may come from
any part of a validated file: a record that a calibrated preset's
``fitted_on`` lists, or that a constant's ``source`` names (the file, or its
directory), is refused whole; and no preset constant or shipped default names a
record of the validation set (:data:`sim.calibrate.records.VALIDATION_SET`, what
``timeshare sim validate`` scores when given no record; ``tests/sim/calibrate/test_blind.py``).
The dedup replay's PCIe layout is the preset's, never the record's. The held-out
records (:data:`sim.calibrate.records.HELD_OUT`), which ``timeshare sim calibrate``
refuses to read, are scored apart, and their score is printed first. Figures of
0.1 s and more and figures under 0.1 s are scored apart, each by its relative
error (no absolute floor); a figure measured as 0 has no relative error and is
counted, not scored.

Every policy's switch cost ([Note: the switch cost] in :mod:`sim.machine.switch_cost`)
is compared where the record timed the first collectives after the wake, and
policies are ranked by it (by the window where a record did not time them).
"""
from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from sim.calibrate.records import (PHASES, VALIDATION_SET, FigureRangesRecord, MultiGpuRecord, OffloadRecord, Record,
                                   RecordError)

log = logging.getLogger(__name__)

#: default tolerances: switch-window phases 15%, offload/reload 10%
SWITCH_TOLERANCE = 0.15
OFFLOAD_TOLERANCE = 0.10
#: figures at least this long and figures shorter are scored apart ([Note: validate is blind])
SHORT_S = 0.1


@dataclass(frozen=True)
class Row:
    """One compared figure."""

    record: str
    what: str
    measured: float
    predicted: float
    tolerance: float
    #: how the prediction was made, where a phase may end a poll period late ([Note: a phase one poll period late])
    note: str = ""

    @property
    def rel_error(self) -> float:
        """(predicted - measured) / measured (inf when nothing was measured)."""
        return (self.predicted - self.measured) / self.measured if self.measured else float("inf")

    @property
    def scored(self) -> bool:
        """False for a figure measured as 0 (no relative error)."""
        return self.measured > 0

    @property
    def short(self) -> bool:
        """A figure measured under :data:`SHORT_S` (scored apart)."""
        return self.measured < SHORT_S

    @property
    def ok(self) -> bool:
        """Within ``tolerance`` of the measured figure, relatively (a figure measured as 0 is not scored: True)."""
        return not self.scored or abs(self.rel_error) <= self.tolerance


def fitted_on(preset_data: dict[str, Any]) -> list[str]:
    """Every record file or results directory the preset was fitted on: its ``fitted_on`` records (written by
    ``timeshare sim calibrate``) and whatever a constant's ``source`` names."""
    out = list((preset_data.get("fitted_on") or {}).get("records", []))
    for c in preset_data.get("constants", {}).values():
        out.extend(c.get("records", []))  # the records a constant was read from, kept apart from its worded source
        for m in re.finditer(r"bench/results/[\w.\-/]+(?:#\w+)?", str(c.get("source", ""))):
            out.append(m.group(0).partition("#")[0].rstrip("/."))
    return sorted(set(out))


def check_blind(preset_data: dict[str, Any], record: Record) -> None:
    """Raise RecordError if any part of ``record`` was used to fit the preset ([Note: validate is blind])."""
    name = record.name
    for path in fitted_on(preset_data):
        if name == path or name.startswith(path.rstrip("/") + "/"):
            raise RecordError(
                f"{name} is in the fit set of preset {preset_data.get('name')!r} (fitted on {path}): validate is "
                "blind to its own answers, so no part of a validated file may have been fitted; validate on records "
                "the preset was not fitted to, or calibrate a preset without it"
            )


def simulate_switch_window(preset: str, settings: dict[str, Any], policies: Iterable[str]) -> dict[str, Any]:
    """Each policy's :class:`PolicyResult` for a record's settings, simulated on ``preset`` (the
    switch-window benchmark's own simulation, :func:`bench.switch_window.simulate`): its mesh (``dp``, ``tp`` and
    where given ``cp``, ``pp``, ``ep``, ``etp``), steps, times, and whether its runtime woke NCCL's proxy thread in
    a destroy (``wake_proxies``, [Note: the runtime's proxy waker in a record] in :mod:`sim.calibrate.records`)."""
    from bench.switch_window import resolve, row_names, simulate, summarize_simulated
    from sim.calibrate.switch_window import MeshError, megatron_groups

    mesh = {k: int(settings[k]) for k in ("dp", "tp", "cp", "pp", "ep") if settings.get(k) is not None}
    mesh["etp"] = settings.get("etp")
    try:
        per_rank = len([s for s in megatron_groups(**mesh) if 0 in s.ranks])
    except MeshError as exc:
        raise RecordError(f"settings: {exc}") from None
    if per_rank != settings["groups_per_rank"]:
        raise RecordError(f"settings.groups_per_rank: the record says {settings['groups_per_rank']} but the mesh "
                          f"{mesh} gives {per_rank}; the benchmark's group families changed")
    out = {}
    for name in policies:
        try:
            policy, _ = resolve(name)  # a PGPolicy's name or a benchmark variant's (SUSPEND_PLANNED_LAZY)
        except ValueError:
            raise RecordError(f"switch_window.results: unknown policy {name!r}; known: {row_names()}") from None
        per_rank_steps = simulate(policy, steps=settings["steps"], train_s=settings["train_s"],
                                  rollout_s=settings["rollout_s"], cooldown_s=settings["cooldown_s"], topology=preset,
                                  wake_proxies=bool(settings.get("wake_proxies", True)), **mesh)
        out[name] = summarize_simulated(policy, per_rank_steps, settings["warmup"], preset)
    return out


def _expected_note(pred: Any, phase: str) -> str:
    late = [ph for ph in pred.poll_late if phase in (ph, "total", "switch_cost")]
    if not late:
        return ""
    period = pred.poll_period_s * len(late)
    base = pred.expected(phase) - pred.poll_late_rate * period
    return (f"expected: {base:.3f} s modelled + {pred.poll_late_rate:.3f} x {period:g} s late polls (rate fitted on "
            f"probe records), range {base:.3f}-{base + period:.3f} s")


def validate_switch_window(record: MultiGpuRecord, preset: str, *,
                           tolerance: float = SWITCH_TOLERANCE) -> tuple[list[Row], dict[str, Any]]:
    """Rows per policy: each phase, the window and the switch cost (where measured); and facts: predicted/measured
    ranking (by switch cost where every policy has one, else by window), NCCL memory in the rollout, and for each
    phase that may end a poll period late the range of its figure (on time in every step to late in every step)."""
    from sim.presets import load_preset_data
    from sim.machine.switch_cost import recorded_switch_cost
    from sim.machine.topology import Topology

    sw = record.switch_window
    if sw is None:
        raise RecordError(f"{record.name}: no switch_window to validate")
    data = load_preset_data(preset)
    check_blind(data, record)
    topo = Topology(data, where=f"preset {preset!r}")
    if record.world_size > topo.num_gpus:
        raise RecordError(f"{record.name}: world size {record.world_size} does not fit preset {preset!r} "
                          f"({topo.num_gpus} GPUs)")
    predicted = simulate_switch_window(preset, dict(sw.settings), sw.results)
    rows, measured_cost, predicted_cost, ranges = [], {}, {}, {}
    for name, meas in sw.results.items():
        pred = predicted[name]
        for phase in (*PHASES, "total"):
            if meas[phase] is not None:
                what = f"{name} {'window' if phase == 'total' else phase}"
                rows.append(Row(record.name, what, meas[phase], pred.expected(phase), tolerance,
                                _expected_note(pred, phase)))
                if phase in pred.poll_late:
                    ranges[what] = (getattr(pred, phase), getattr(pred, phase) + pred.poll_period_s)
        cost = recorded_switch_cost(sw.results, name)
        if cost is not None and pred.switch_cost is not None:
            measured_cost[name], predicted_cost[name] = cost.total, pred.expected("switch_cost")
            rows.append(Row(record.name, f"{name} switch cost", cost.total, predicted_cost[name], tolerance,
                            _expected_note(pred, "switch_cost")))
    by_cost = len(measured_cost) == len(sw.results)
    measured_key = measured_cost if by_cost else {p: sw.results[p]["total"] for p in sw.results}
    predicted_key = predicted_cost if by_cost else {p: predicted[p].expected("total") for p in sw.results}
    memory = {p: (sw.results[p]["held_in_rollout_gib"], predicted[p].held_in_rollout_gib) for p in sw.results}
    return rows, {"measured_order": sorted(sw.results, key=measured_key.get),
                  "predicted_order": sorted(sw.results, key=predicted_key.get),
                  "ranked_by": "switch cost" if by_cost else "window", "memory_gib": memory,
                  "late_range": ranges}


#: phases of a policy's simulated result a transcribed figure may name, and the fields that hold them
_FIGURE_FIELDS = {"sleep": "sleep", "update_weights": "update_weights", "wake_up": "wake_up", "window": "total",
                  "switch_cost": "switch_cost", "first_use_after_wake": "first_use_after_wake",
                  "device_used_in_rollout_gib": "device_used_in_rollout_gib",
                  "held_in_rollout_gib": "held_in_rollout_gib"}
#: phases over which the idle-destroy probe's idle time is spread (a uniform phase of the proxy poll)
IDLE_PHASES = 20


def validate_figure_ranges(record: FigureRangesRecord, preset: str, *,
                           tolerance: float = SWITCH_TOLERANCE) -> tuple[list[Row], list[str]]:
    """Rows for a transcribed record's figures, and lines about what is reported but not scored.

    Each switch-window figure is a range over the record's meshes: the prediction is the mean over those meshes of
    the simulated figure (each mesh's in the row's note), compared with the middle of the range. The idle-destroy
    probe's mean destroy is predicted as the mean over a uniform phase of the proxy poll (:data:`IDLE_PHASES`
    phases) of :func:`sim.calibrate.destroy_walks.simulate_idle_destroys`."""
    from sim.presets import load_preset_data

    check_blind(load_preset_data(preset), record)
    rows: list[Row] = []
    facts: list[str] = []
    policies = sorted({p for f in record.figures for p in f.policies})
    per_mesh = []
    for mesh in record.meshes:
        settings = {**record.settings, **mesh}
        settings.setdefault("dp", 1)
        settings.setdefault("tp", 1)
        per_mesh.append((mesh, simulate_switch_window(preset, settings, policies)))
    for f in record.figures:
        if f.what not in _FIGURE_FIELDS:
            raise RecordError(f"{record.name}: figure {f.what!r}: not one of {sorted(_FIGURE_FIELDS)}")
        for policy in f.policies:
            values = [getattr(res[policy], _FIGURE_FIELDS[f.what]) for _, res in per_mesh]
            if any(v is None for v in values):
                raise RecordError(f"{record.name}: {policy} {f.what} is not simulated")
            each = ", ".join(f"{_mesh_words(m)} {v:.3f}" for (m, _), v in zip(per_mesh, values))
            measured = f"{f.lo:g}" if f.lo == f.hi else f"{f.lo:g}-{f.hi:g}"
            pred = statistics.fmean(values)
            if not f.scored:
                facts.append(f"  {policy} {f.what}: measured {measured}, predicted {pred:.2f} ({each}; reported, not "
                             "scored)")
                continue
            rows.append(Row(record.name, f"{policy} {f.what}", f.mid, pred, tolerance,
                            f"measured {measured} over the meshes, their middle compared; predicted per mesh: {each}"))
    idle = record.idle_destroy
    if idle is not None:
        rows.append(_idle_destroy_row(record, preset, idle, tolerance))
    return rows, facts


def _mesh_words(mesh: Mapping[str, int]) -> str:
    return " ".join(f"{k}{v}" for k, v in mesh.items() if v > 1) or "dp1"


def _idle_destroy_row(record: FigureRangesRecord, preset: str, idle: Mapping[str, Any], tolerance: float) -> Row:
    """The idle-destroy probe's mean destroy (of a round), simulated over a uniform phase of the proxy poll."""
    from sim.calibrate.destroy_walks import simulate_idle_destroys
    from sim.machine.topology import Topology

    poll = Topology.from_preset(preset).comm.proxy_poll_s or 0.5
    rounds = [simulate_idle_destroys(preset, groups=int(idle["groups"]), idle_s=float(idle["idle_s"]),
                                     phase_s=poll * k / IDLE_PHASES, wake_proxies=bool(idle.get("wake_proxies", False)))
              for k in range(IDLE_PHASES)]
    first = [r[0] for r in rounds]
    others = [d for r in rounds for d in r[1:]]
    lo, hi = float(idle["mean_lo_s"]), float(idle["mean_hi_s"])
    note = (f"measured {lo * 1e3:g}-{hi * 1e3:g} ms, the middle compared; predicted over {IDLE_PHASES} phases of the "
            f"poll: the first destroy {min(first) * 1e3:.0f}-{max(first) * 1e3:.0f} ms (measured "
            f"{float(idle['first_lo_s']) * 1e3:g}-{float(idle['first_hi_s']) * 1e3:g}), the others "
            f"{min(others) * 1e3:.0f}-{max(others) * 1e3:.0f} ms (measured {float(idle['others_lo_s']) * 1e3:g}-"
            f"{float(idle['others_hi_s']) * 1e3:g})")
    pred = statistics.fmean(statistics.fmean(r) for r in rounds)
    return Row(record.name, f"idle destroy, mean of {int(idle['groups'])}", (lo + hi) / 2, pred, tolerance, note)


def validate_offload(record: OffloadRecord, preset: str, *, tolerance: float = OFFLOAD_TOLERANCE) -> list[Row]:
    """Rows per shape: the store's steady offload and reload, predicted with the preset's own line rates."""
    from sim.calibrate.calibration import compare
    from sim.presets import load_preset_data

    check_blind(load_preset_data(preset), record)
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
        check_blind(load_preset_data(p), record)
    return [Row(record.name, what, measured, predicted, tolerance)
            for what, measured, predicted in compare_dedup(record, preset, offload_preset)]


def format_rows(rows: list[Row], *, wide: bool = False) -> str:
    """A table per record: measured, predicted, error and verdict per figure; how a figure that may end a poll
    period late was predicted, under its table (:func:`refimpl.output.table`: units in every header, at most 100
    columns unless ``wide``)."""
    from refimpl.output import table, wrap

    by_record: dict[str, list[Row]] = {}
    for r in rows:
        by_record.setdefault(r.record, []).append(r)
    out = []
    for record, part in by_record.items():
        body, notes = [], []
        for r in part:
            err = f"{r.rel_error * 100:+.1f}" if r.scored else "-"
            verdict = (f"{'ok' if r.ok else 'OUTSIDE'} {r.tolerance:.0%}" if r.scored else "not scored (measured 0)")
            body.append([r.what, f"{r.measured:.4f}", f"{r.predicted:.4f}", err, verdict + (" *" if r.note else "")])
            if r.note:
                notes.append(wrap(f"* {r.what}: {r.note}", wide=wide, indent="  "))
        title = f"{Path(record).parent.name}/{Path(record).name}"
        out += [table(["what", "measured (s)", "predicted (s)", "error (%)", "verdict (tolerance)"], body, wide=wide,
                      right=(1, 2, 3), title=title, min_widths={0: max(len(r.what) for r in part)}), *notes, ""]
    return "\n".join(out).rstrip("\n")


def median_abs_error(rows: list[Row]) -> float:
    """The median |relative error| of the scored rows (0 without any)."""
    errs = [abs(r.rel_error) for r in rows if r.scored]
    return statistics.median(errs) if errs else 0.0


def score(rows: list[Row]) -> str:
    """The score line of a set of rows: figures of 0.1 s and more, and figures under 0.1 s, apart, each as
    "k of n within tolerance" with the median relative error ([Note: validate is blind])."""
    parts = []
    for label, part in ((f">= {SHORT_S:g} s", [r for r in rows if r.scored and not r.short]),
                        (f"< {SHORT_S:g} s", [r for r in rows if r.scored and r.short])):
        ok = sum(r.ok for r in part)
        parts.append(f"{label}: {ok} of {len(part)} within tolerance (median |error| {median_abs_error(part):.1%})")
    zero = sum(not r.scored for r in rows)
    return "; ".join(parts) + (f"; {zero} measured as 0 (not scored)" if zero else "")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``timeshare sim validate``."""
    parser.add_argument("records", nargs="*", metavar="RECORD.json",
                        help="the records to score (multigpu, offload reports, transcribed figures); default: every "
                             "record no calibration read, the held-out ones among them (the validation set)")
    parser.add_argument("--preset", default="calibrated/h200-2x",
                        help="preset for switch-window and dedup records (default: the shipped calibrated h200-2x, the "
                             "two-H200 machine they were measured on)")
    parser.add_argument("--offload-preset", default="calibrated/h200-1x",
                        help="preset for offload reports (default: the shipped calibrated h200-1x)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="per switch-window figure (default 0.15)")
    parser.add_argument("--offload-tolerance", type=float, default=0.10, help="per offload/reload (default 0.10)")
    parser.add_argument("--wide", action="store_true", help="tables up to 220 columns instead of 100")
    parser.add_argument("--no-dedup", action="store_true",
                        help="leave out the dedup section of multigpu records (its replay takes a few seconds)")


def say(text: str) -> None:
    """Print one line, wrapped to 100 columns (continuation lines indented)."""
    from refimpl.output import wrap

    print(wrap(text, indent=" " * (len(text) - len(text.lstrip()))))


def _validate_record(rec: Record, args: argparse.Namespace) -> tuple[list[Row], bool, list[str]] | None:
    """(rows, ranking the same, lines about the record) of one record; None where it has nothing to validate."""
    if isinstance(rec, OffloadRecord):
        return validate_offload(rec, args.offload_preset, tolerance=args.offload_tolerance), True, []
    if isinstance(rec, FigureRangesRecord):
        rows, facts = validate_figure_ranges(rec, args.preset, tolerance=args.tolerance)
        meshes = ", ".join(_mesh_words(m) for m in rec.meshes)
        return rows, True, [f"{rec.name}: transcribed ranges over the meshes {meshes}; proxy waker "
                            f"{'on' if rec.settings['wake_proxies'] else 'off'}", *facts]
    if not isinstance(rec, MultiGpuRecord) or (rec.switch_window is None and not rec.dedup):
        return [], True, [f"{rec.name}: nothing to validate (no switch_window or dedup section, not an offload report)"]
    rows: list[Row] = []
    if rec.dedup and not args.no_dedup:
        rows += validate_dedup(rec, args.preset, args.offload_preset, tolerance=args.offload_tolerance)
    same, lines = True, []
    if rec.switch_window is not None:
        r, facts = validate_switch_window(rec, args.preset, tolerance=args.tolerance)
        rows += r
        same = facts["measured_order"] == facts["predicted_order"]
        waker = "on" if rec.switch_window.settings.get("wake_proxies") else "off"
        lines.append(f"{rec.name}: proxy waker {waker}")
        if rec.eager_init:
            lines.append("  measured with the default group bound to a device (NCCL initialised at new_group); the "
                         "simulator models torch's lazy init, so rebuilds are predicted cheaper")
        lines.append(f"  policies by {facts['ranked_by']}: measured {' < '.join(facts['measured_order'])};")
        lines.append(f"  predicted {' < '.join(facts['predicted_order'])} ({'same' if same else 'DIFFERENT'})")
        for pol, (meas, pred) in facts["memory_gib"].items():
            if meas is not None:
                lines.append(f"  {pol} NCCL memory in the rollout: measured {meas:.2f} GiB, predicted {pred:.2f} GiB "
                             "(reported, not checked)")
    return rows, same, lines


def run(args: argparse.Namespace) -> int:
    """Entry point of ``timeshare sim validate``: every record, predicted against measured; the held-out score
    first, then each record's table and the scores over all; the exit status."""
    from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
    from sim.presets import PresetError
    from sim.calibrate.records import REPO, held_out, load_record

    from refimpl.output import progress_bar

    paths = list(args.records) or [str(REPO / p) for p in VALIDATION_SET]
    rows, orders_ok, checked, held, lines = [], True, 0, [], []
    try:
        with progress_bar(len(paths), "validate") as tick:  # a bar with the time left on a terminal's stderr
            for path in paths:
                rec = load_record(path)
                got = _validate_record(rec, args)
                tick(Path(path).name)
                if got is None:
                    continue
                lines += got[2]
                if not got[0]:
                    continue
                rows += got[0]
                orders_ok &= got[1]
                checked += 1
                if held_out(rec.name):
                    held += got[0]
    except (RecordError, PresetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if held:
        say(f"held-out records (no calibration read them, {len({r.record for r in held})}): {score(held)}")
    else:
        say("held-out records: none among these (sim.calibrate.records.HELD_OUT names them)")
    for line in lines:
        say(line)
    print()
    print(format_rows(rows, wide=args.wide))
    bad = [r for r in rows if not r.ok]
    say(f"{len(rows) - len(bad)} of {len(rows)} figures within tolerance over {checked} record(s)"
        + ("" if orders_ok else "; the predicted ranking of policies differs from the measured one"))
    say(f"score: {score(rows)}")
    return EXIT_OK if rows and not bad and orders_ok else EXIT_FAILED


__all__ = ["IDLE_PHASES", "OFFLOAD_TOLERANCE", "Row", "SHORT_S", "SWITCH_TOLERANCE", "add_arguments", "check_blind",
           "fitted_on", "format_rows", "median_abs_error", "run", "score", "simulate_switch_window",
           "validate_dedup", "validate_figure_ranges", "validate_offload", "validate_switch_window"]
