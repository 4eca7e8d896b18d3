"""``timeshare sim calibrate``: fit a preset's communicator and scrub constants on a fit set of records.

What is fitted, and from which part of which record (each fitted constant's
``source`` names the record file and the section, ``FILE#comm_raw``):

* from ``comm_raw`` of records whose communicators have one rank (one GPU:
  ``bench/gpu/comm_h200.py``'s record): ``nccl_suspend``, ``nccl_resume`` (per
  communicator), ``nccl_comm_memory``, ``nccl_comm_persistent``, and where
  measured ``nccl_destroy`` and ``nccl_init``;
* from ``comm_raw`` of records whose communicators span two or more ranks:
  the same as ``*_multi`` constants, used for every communicator of two or
  more ranks ([Note: one-rank and multi-rank communicators] in
  :mod:`sim.presets`);
* ``create_first_collective_s`` is creating the group and running its first
  collective; the group object's own cost is the base preset's ``pg_create``
  (an assumption, said in the source), and the rest is the lazy NCCL init
  (``nccl_init``/``nccl_init_multi``), which torch pays at the first collective;
* where a record splits them (``create_s``, ``first_collective_s``,
  ``first_collective_after_resume_s``, ``destroy_uninitialized_s``): the group
  object alone (``pg_create``), the init alone, the first collective after a
  resume (``nccl_resume_first_collective``) and destroying a never-used group;
* from ``bench/gpu/h2d_scrub_probe.py`` records: ``h200_scrub``, the driver's
  scrub rate of freed device memory;
* from ``bench/agreement_probe.py`` records: ``gloo_agreement``, one lifecycle
  agreement on the Gloo control group;
* from NCCL's own logs of destroy walks (``bench/gpu/run_destroy_walk.sh``):
  ``nccl_destroy`` and ``nccl_destroy_multi``, a destroy's own cost beyond the
  wait for the proxy poll (from each UDS proxy thread's exit to the next
  destroy's proxy stop, [Note: a destroy's own cost, from NCCL's log] in
  :mod:`sim.calibrate.destroy_walks`), and ``nccl_proxy_poll``;
* from ``bench/gpu/rebuild_probe.py`` records (one rank, the runtime as users run
  it): ``nccl_destroy`` (a destroy with the proxy waker) and ``nccl_init`` (the
  rebuild and its first collective, less the group object);
* from ``bench/gpu/destroy_walk_probe.py`` records: ``nccl_poll_phase_spread``,
  how far the proxy poll phases of a training step's communicators move against
  one another between steps (:func:`sim.calibrate.destroy_walks.poll_phase_spread`): a
  destroy simulated as waiting less than that for its poll timeout may wait a
  whole period more on hardware ([Note: one poll period more] in
  :mod:`sim.calibrate.destroy_walks`).

Destroying an initialised communicator without the runtime's proxy waker waits
for its NCCL proxy thread's next 500 ms poll timeout ([Note: the proxy's 500 ms
poll] in :mod:`sim.presets`; ``nccl_proxy_poll``, from NCCL's source and its
logs), then costs ``nccl_destroy``; with the waker, ``nccl_destroy`` alone. The
destroy's own cost is read where it stands apart from the wait (NCCL's log, the
rebuild probe's destroy with the waker), not from a walk's total: a walk over
communicators destroyed right after their first collectives
(``bench/gpu/comm_split_probe.py``) is paced by their inits, so its total
carries one destroy's own cost and the inits' spacing; :func:`replay_destroys`
replays such a walk as a check (``tests/sim/machine/test_proxy_poll.py``).

Several records giving one constant are averaged (the source lists each).
Everything else comes from the base preset unchanged, with its own source.
The lifecycle's switch window, the offload/reload times of the store and the
dedup reload are *not* fitted: :mod:`bench.validate` predicts them from these
costs and compares with records outside the fit set.
"""
from __future__ import annotations

import copy
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from sim.presets import load_preset_data
from sim.calibrate.records import (AgreementRecord, DestroyWalkRecord, MultiGpuRecord, NcclLogRecord,
                                    RebuildProbeRecord, Record, RecordError, ScrubProbeRecord, held_out)

log = logging.getLogger(__name__)

MiB = 2**20

#: NCCL's UDS proxy thread's poll timeout, which a destroy of an initialised communicator waits out
NCCL_PROXY_POLL_S = 0.5
NCCL_PROXY_POLL_SOURCE = ("NVIDIA/nccl src/proxy.cc: ncclProxyServiceUDS polls its socket with poll(pollfds, 1, 500) "
                          "and reads the stop flag only when the poll returns; commFree (src/init.cc) joins the thread")


def _log_observations(rec: NcclLogRecord) -> list[Observation]:
    """A destroy's own cost by communicator size and the proxy poll period, from an NCCL log of destroy walks."""
    from sim.calibrate.destroy_walks import destroy_costs, destroy_gaps, nccl_log_lines, uds_report, uds_threads

    lines = nccl_log_lines(rec.path)
    costs = destroy_costs(destroy_gaps(lines))
    if not costs:
        raise RecordError(f"{rec.name}: no two destroys one after the other in the log (a proxy stop, its UDS thread's "
                          "exit, the next stop); write it with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY and "
                          "microsecond timestamps (bench/gpu/run_destroy_walk.sh)")
    out = [Observation("nccl_destroy" + ("" if size == 1 else "_multi"), v, rec.name,
                       f"NCCL's log: from each {size}-rank communicator's UDS proxy thread exit to the next destroy's "
                       f"proxy stop, median of {n}")
           for size, (v, n) in costs.items()]
    out.append(Observation("nccl_proxy_poll", NCCL_PROXY_POLL_S, rec.name,
                           f"{NCCL_PROXY_POLL_SOURCE}; NCCL's log: {uds_report(uds_threads(lines))}"))
    return out


def _rebuild_observations(rec: RebuildProbeRecord, group_s: float, less: str) -> list[Observation]:
    """A one-rank destroy with the proxy waker and a one-rank lazy init, from a rebuild-probe record."""
    if rec.world_size != 1:
        log.info("%s: a %d-rank rebuild probe; only one-rank records are fitted", rec.name, rec.world_size)
        return []
    m = rec.medians
    init = m["rebuild_wake1_s"] - group_s
    if init <= 0:
        raise RecordError(f"{rec.name}: rebuild_wake1_s is not more than the group object's own cost; no init to fit")
    cumem = f"NCCL_CUMEM_ENABLE {rec.cumem}"
    return [Observation("nccl_destroy", m["destroy_wake1_s"], rec.name,
                        f"destroy with the proxy waker, {cumem}, median of the rounds after the first (without it, "
                        f"{rec.idle_s:g} s after the warm-up: {m['destroy_wake0_s']:.3f} s)"),
            Observation("nccl_init", init, rec.name,
                        f"recreate_group and its first collective {m['rebuild_wake1_s'] * 1e3:.1f} ms, {cumem}, "
                        f"less {less}")]


def replay_destroys(n: int, init_s: float, gap_s: float, base_s: float, poll_s: float = NCCL_PROXY_POLL_S) -> float:
    """Seconds to destroy ``n`` communicators one after the other, right after their first collectives.

    The first collectives ran one after the other, ``init_s`` each (communicator ``k``'s proxy thread starts
    its poll period when its initialisation ends, ``(k + 1) * init_s``); the destroys start ``gap_s`` after the
    last one. Each destroy waits for its thread's next poll timeout, then takes ``base_s``.
    """
    start = t = n * init_s + gap_s
    for k in range(n):
        t += ((k + 1) * init_s - t) % poll_s + base_s
    return t - start


def fit_destroy(n: int, init_s: float, gap_s: float, measured_s: float,
                poll_s: float = NCCL_PROXY_POLL_S) -> tuple[float, float]:
    """``(base_s, replayed_s)``: the per-communicator destroy cost beyond the proxy poll waits whose
    :func:`replay_destroys` comes nearest ``measured_s`` (0 if the waits alone take longer), and that replay."""
    if replay_destroys(n, init_s, gap_s, 0.0, poll_s) >= measured_s:
        return 0.0, replay_destroys(n, init_s, gap_s, 0.0, poll_s)
    lo, hi = 0.0, measured_s / n  # replay(hi) >= n * hi = measured
    for _ in range(60):  # the replay does not fall as base_s grows (it may jump a poll period)
        mid = (lo + hi) / 2
        if replay_destroys(n, init_s, gap_s, mid, poll_s) >= measured_s:
            hi = mid
        else:
            lo = mid
    best = min((lo, hi), key=lambda b: abs(replay_destroys(n, init_s, gap_s, b, poll_s) - measured_s))
    return best, replay_destroys(n, init_s, gap_s, best, poll_s)


@dataclass(frozen=True)
class Observation:
    """One record's value for one constant (SI units) and where exactly it came from."""

    constant: str
    value: float
    record: str
    how: str


def observations(records: Iterable[Record], *, pg_create_s: float) -> list[Observation]:
    """Every constant value the fit set gives (see the module docstring for which).

    A record that gives creation and first collective only together has the group object's cost
    taken off: the mean ``create_s`` the fit set measured for that size class, else ``pg_create_s``.
    """
    records = list(records)
    created: dict[str, list[float]] = {}
    for rec in records:
        raw = getattr(rec, "comm_raw", None)
        if raw is not None and raw.per_comm("create_s") is not None:
            created.setdefault("" if raw.comm_ranks == 1 else "_multi", []).append(raw.per_comm("create_s"))
    out: list[Observation] = []
    for rec in records:
        if isinstance(rec, NcclLogRecord):
            out += _log_observations(rec)
            continue
        if isinstance(rec, RebuildProbeRecord):
            group_s, less = _group_object_s(created, "", pg_create_s)
            out += _rebuild_observations(rec, group_s, less)
            continue
        if isinstance(rec, ScrubProbeRecord):
            out.append(Observation("h200_scrub", rec.scrub_bps(), rec.name,
                                   f"11 GiB H2D right after a free at {rec.fresh_gbps_at_zero_delay:.2f} GB/s against "
                                   f"{rec.reused_gbps:.2f} GB/s into a reused buffer"))
            continue
        if isinstance(rec, AgreementRecord):
            out.append(Observation("gloo_agreement", rec.per_agreement_s, rec.name,
                                   f"median all_reduce(MIN) on the Gloo control group, {rec.world_size} ranks, "
                                   f"host {rec.host!r}"))
            continue
        if isinstance(rec, DestroyWalkRecord):
            from sim.calibrate.destroy_walks import poll_phase_spread

            spread, how = poll_phase_spread(rec.data, rec.name)
            out.append(Observation("nccl_poll_phase_spread", spread, rec.name,
                                   f"{rec.policy}, {rec.world_size} ranks, {how}: the range"))
            from sim.calibrate.destroy_walks import late_walks

            late, walks, how = late_walks(rec.data, rec.name)
            out.append(Observation("nccl_poll_late_rate", late / walks, rec.name, f"{rec.policy}: {how}"))
            continue
        if not isinstance(rec, MultiGpuRecord) or rec.comm_raw is None:
            log.info("%s: nothing to fit (no comm_raw)", rec.name)
            continue
        raw = rec.comm_raw
        suffix = "" if raw.comm_ranks == 1 else "_multi"
        where = f"{rec.name}#comm_raw"
        what = f"{raw.n_comms} {raw.comm_ranks}-rank communicators one after the other"
        for field, name in (("suspend_s", "nccl_suspend"), ("resume_s", "nccl_resume")):
            per = raw.per_comm(field)
            if per is not None:
                out.append(Observation(name + suffix, per, where, f"{field} {getattr(raw, field):.3f} s for {what}"))
        for field, name in (("create_s", "pg_create"), ("first_collective_after_resume_s", "nccl_resume_first_collective"),
                            ("destroy_uninitialized_s", "nccl_destroy_uninitialized")):
            per = raw.per_comm(field)
            if per is not None:
                out.append(Observation(name + suffix, per, where, f"{field} {getattr(raw, field):.3f} s for {what}"))
        per = raw.per_comm("first_collective_s")
        if per is not None:
            out.append(Observation("nccl_init" + suffix, per, where,
                                   f"first_collective_s {raw.first_collective_s:.3f} s for {what}"))
        elif raw.per_comm("create_first_collective_s") is not None:
            group_s, less = _group_object_s(created, suffix, pg_create_s)
            per = raw.per_comm("create_first_collective_s") - group_s
            if per <= 0:
                raise RecordError(f"{where}.create_first_collective_s: not more than the group object's own cost; "
                                  "no init time left to fit")
            out.append(Observation("nccl_init" + suffix, per, where,
                                   f"create_first_collective_s {raw.create_first_collective_s:.3f} s for {what}, "
                                   f"less {less}"))
        for field, name, part in (("suspendable_bytes", "nccl_comm_memory", "suspendable"),
                                  ("persistent_bytes", "nccl_comm_persistent", "persistent")):
            per = raw.per_comm(field)
            if per is not None:
                out.append(Observation(name + suffix, per, where, f"ncclCommMemStats {part} bytes, "
                                       f"{getattr(raw, field):,} over {what}"))
    return out


def _group_object_s(created: dict[str, list[float]], suffix: str, pg_create_s: float) -> tuple[float, str]:
    """The group object's own cost to take off a rebuild-and-first-collective figure, and how it was known: the mean
    ``create_s`` the fit set measured for that size class, else the base preset's ``pg_create`` (an assumption)."""
    if suffix in created:
        group_s = sum(created[suffix]) / len(created[suffix])
        return group_s, f"the group object's create_s measured in the fit set ({group_s * 1e3:.2f} ms each)"
    return pg_create_s, f"the group object's pg_create ({pg_create_s * 1e3:g} ms, assumption) each"


#: constant -> (unit written in the preset, factor from SI, comm-section key or None)
_UNITS = {
    "nccl_suspend": ("s", 1.0, "suspend"), "nccl_resume": ("s", 1.0, "resume"), "nccl_destroy": ("s", 1.0, "destroy"),
    "nccl_init": ("s", 1.0, "init"), "nccl_comm_memory": ("MiB", 1 / MiB, "memory"),
    "nccl_comm_persistent": ("MiB", 1 / MiB, "persistent"), "h200_scrub": ("GB/s", 1e-9, None),
    "pg_create": ("ms", 1e3, "create_group"), "nccl_destroy_uninitialized": ("ms", 1e3, "destroy_uninitialized"),
    "nccl_resume_first_collective": ("s", 1.0, "resume_first_collective"), "nccl_proxy_poll": ("ms", 1e3, "proxy_poll"),
    "gloo_agreement": ("ms", 1e3, "agreement"), "nccl_poll_phase_spread": ("ms", 1e3, "poll_phase_spread"),
    "nccl_poll_late_rate": ("1", 1.0, "poll_late_rate"),
}


def _unit(name: str) -> tuple[str, float, str | None]:
    base = name[: -len("_multi")] if name.endswith("_multi") else name
    unit, factor, key = _UNITS[base]
    return unit, factor, (None if key is None else key + ("_multi" if name.endswith("_multi") else ""))


def calibrated_preset(base: str, records: Iterable[Record], *,
                      canary_from: Iterable[Record] = ()) -> tuple[dict[str, Any], list[Observation]]:
    """The base preset's JSON with every constant the records give replaced (or added), and the observations.

    ``canary_from``: records whose SUSPEND ``wake_up`` gives the first collective after a resume of a
    multi-rank communicator, once everything else is fitted (:mod:`sim.calibrate.fit_window`; it replaces the
    ``comm_raw`` figure of that constant).
    """
    records, canary_from = list(records), list(canary_from)
    refuse_held_out([*records, *canary_from])
    data = copy.deepcopy(load_preset_data(base))
    consts = data["constants"]
    pg = consts.get("pg_create")
    pg_create_s = 0.0 if pg is None else float(pg["value"]) * {"ms": 1e-3, "s": 1.0, "us": 1e-6}[pg["unit"]]
    obs = observations(records, pg_create_s=pg_create_s)
    if not obs:
        raise RecordError("none of the records gives a constant to fit (comm_raw of a multigpu or comm_h200 "
                          "record, an h2d_scrub_probe record, an agreement_probe record or a destroy_walk_probe record)")
    by_name: dict[str, list[Observation]] = {}
    for o in obs:
        by_name.setdefault(o.constant, []).append(o)
    for name, group in sorted(by_name.items()):
        unit, factor, key = _unit(name)
        value = statistics.mean(o.value for o in group) * factor
        parts = "; ".join(f"{o.record}: {o.how} = {o.value * factor:.6g} {unit}" for o in group)
        consts[name] = {"value": round(value, 6), "unit": unit,
                        "source": f"fitted by timeshare sim calibrate ({'mean of ' if len(group) > 1 else ''}{parts})"}
        if key is not None:
            data["comm"][key] = name
        elif name == "h200_scrub":
            data["copy"]["scrub_bandwidth"] = name
    canary = list(canary_from)
    if canary:
        from sim.calibrate.fit_window import CONSTANT, derive_resume_canary

        derived = []
        for rec in canary:
            if not isinstance(rec, MultiGpuRecord):
                raise RecordError(f"{rec.name}: --canary-from needs a multigpu record with a switch window")
            value, how = derive_resume_canary(rec, data)
            derived.append(Observation(CONSTANT, value, f"{rec.name}#switch_window", how))
        obs = [o for o in obs if o.constant != CONSTANT] + derived
        value = statistics.mean(o.value for o in derived)
        parts = "; ".join(f"{o.record}: {o.how} = {o.value:.6g} s" for o in derived)
        consts[CONSTANT] = {"value": round(value, 6), "unit": "s", "source": f"derived by timeshare sim calibrate "
                            f"--canary-from ({'mean of ' if len(derived) > 1 else ''}{parts})"}
        data["comm"]["resume_first_collective_multi"] = CONSTANT
    data["name"] = f"{data.get('name', base)}-calibrated"
    used = sorted({o.record.split("#")[0] for o in obs})
    words = fit_words([r for r in (*records, *canary) if r.name in used])
    data["description"] = f"{data.get('description', base)}; communicator and scrub constants fitted on {words}"
    #: every record a constant was computed from: timeshare sim validate refuses these files whole
    data["fitted_on"] = {"records": used, "words": words}
    return data, obs


def refuse_held_out(records: Iterable[Record]) -> None:
    """Raise RecordError if a record is held out (:data:`sim.calibrate.records.HELD_OUT`): no fit may read it."""
    for rec in records:
        if held_out(rec.name):
            raise RecordError(f"{rec.name} is held out: no calibration may read it (it is scored apart by timeshare "
                              "sim validate); fit on the other records")


def fit_words(records: Iterable[Record]) -> str:
    """What a set of fit records measured, in words a user has (machines and what was timed; no file names)."""
    parts: list[str] = []
    for rec in records:
        if isinstance(rec, ScrubProbeRecord):
            part = "the driver's scrub of freed memory on one H200"
        elif isinstance(rec, AgreementRecord):
            part = f"the lifecycle's agreement on a {rec.world_size}-GPU H200 host"
        elif isinstance(rec, DestroyWalkRecord):
            part = f"destroy walks of the 14 Megatron groups on {rec.world_size} x H200"
        elif isinstance(rec, NcclLogRecord):
            part = "NCCL's own log of destroy walks on 2 x H200"
        elif isinstance(rec, RebuildProbeRecord):
            part = "a group's destroy and rebuild through the runtime on one H200"
        elif isinstance(rec, MultiGpuRecord):
            machine = "one H200" if rec.world_size == 1 else f"{rec.world_size} x H200"
            part = f"NCCL communicator costs on {machine}"
        else:
            continue
        if part not in parts:
            parts.append(part)
    return ", ".join(parts) + " (this project's measurements)"


def write_preset(data: dict[str, Any], out: str | Path) -> Path:
    """Write a preset JSON (after checking that it loads as a topology)."""
    from sim.machine.topology import Topology

    Topology(data, where=f"calibrated preset {out}")
    path = Path(out)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


__all__ = ["fit_words", "refuse_held_out", "NCCL_PROXY_POLL_S", "Observation", "calibrated_preset", "fit_destroy", "observations", "replay_destroys",
           "write_preset"]
