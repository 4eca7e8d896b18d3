"""Measurement records the simulator is fitted on and validated against.

Three kinds of JSON record are read, each into one shape:

* ``"kind": "multigpu"``, ``"schema": 1`` (written by ``bench/gpu/multigpu.py``;
  ``bench/results/2026-11-30-h200x2-gpumd/`` transcribes the first 2 x H200
  table into it): ``world_size``; ``switch_window`` (``settings`` of the
  lifecycle benchmark and one result per policy, the fields of
  :class:`bench.switch_window.PolicyResult`); ``comm_raw``
  (``n_comms`` communicators of ``ranks_per_comm`` ranks, default ``world_size``;
  ``suspendable_bytes``, ``persistent_bytes``, ``suspend_s``, ``resume_s``,
  ``destroy_s``, ``create_first_collective_s`` are totals over the ``n_comms``
  communicators done one after the other, as ``bench/gpu/multigpu.py`` writes
  them; a part the script skipped is ``{"skipped": why}``; optional finer splits:
  ``create_s``, ``first_collective_s``, ``first_collective_after_resume_s``,
  ``destroy_uninitialized_s``); ``dedup``.
* The one-GPU communicator record of ``bench/gpu/comm_h200.py``
  (``comm_h200-nccl*.json``: ``per_group`` suspend/resume times of one-rank
  communicators and the switch window of 14 one-rank groups), read as a
  ``multigpu`` record of world size 1.
* The offload benchmark's report (``*-offload.json``: ``shapes``, ``variants``),
  compared by :mod:`sim.calibrate.calibration`.
* ``bench/gpu/h2d_scrub_probe.py``'s record (H2D rate right after a free and
  into a reused buffer), from which the driver's scrub rate is fitted.
* ``"kind": "agreement_probe"`` (``bench/agreement_probe.py``): what one lifecycle
  agreement (``all_reduce(MIN)`` on the Gloo control group) took.
* ``"kind": "rebuild_probe"`` (``bench/gpu/rebuild_probe.py``): a one-rank group's
  destroy with and without the proxy waker, its rebuild and first collective.
* An NCCL log (``.log``, or a ``.tgz`` of them, written with microsecond timestamps
  by ``bench/gpu/run_destroy_walk.sh``): every destroy's proxy stop and UDS thread
  exit (:func:`sim.calibrate.destroy_walks.destroy_costs`).
* ``"kind": "figure_ranges"``: figures transcribed from a table that gives ranges, not
  a run's raw record (``bench/results/2026-12-04-h200x2-from-gpu-md/``): the switch
  window's figures over the meshes it names, and the idle-destroy probe's.

[Note: the runtime's proxy waker in a record] Whether a destroy waited for NCCL's
proxy poll depends on the runtime: TorchRuntime wakes the proxy thread by default
since 2026-12-02 (:data:`PROXY_WAKER_SINCE`). A switch window's ``settings`` may say
so (``wake_proxies``); a record that does not is read as without the waker when it
was taken before that day, and refused after it (nothing is guessed).

A value a record does not have is ``None``; nothing is guessed.
"""
from __future__ import annotations

from refimpl.cli_errors import CliInputError  # bad input: the CLI answers it with one line and exit 2

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

log = logging.getLogger(__name__)

PHASES = ("sleep", "update_weights", "wake_up")
SETTINGS = ("dp", "tp", "steps", "warmup", "train_s", "rollout_s", "cooldown_s", "groups_per_rank")
#: optional mesh sizes of a switch window's settings (default 1; ``etp`` default as ``megatron_groups`` chooses)
MESH_SETTINGS = ("cp", "pp", "ep", "etp")
#: the first day TorchRuntime woke NCCL's proxy thread in a destroy by default ([Note: the runtime's proxy waker in a
#: record]): a record taken before it, without a ``wake_proxies`` setting, ran without the waker
PROXY_WAKER_SINCE = "2026-12-02"
COMM_RAW_TIMES = ("suspend_s", "resume_s", "destroy_s", "create_first_collective_s")
#: optional finer splits a record may carry (totals over n_comms, like the others): the group object alone
#: (``new_group``), the first collective alone, the first collective after a resume, destroying a group
#: whose communicator never ran a collective, and a second collective on each (between the first
#: collectives and the destroys in ``bench/gpu/comm_split_probe.py``)
COMM_RAW_OPTIONAL_TIMES = ("create_s", "first_collective_s", "first_collective_after_resume_s",
                           "destroy_uninitialized_s", "steady_collective_s")


#: the held-out records: no calibration may read them (``timeshare sim calibrate`` refuses them), so ``timeshare sim
#: validate`` scores them apart, as figures the simulator's constants never saw (docs/calibration.md names them)
HELD_OUT: tuple[str, ...] = (
    "bench/results/2026-11-30-h200x2-switch-8-steps/",
    "bench/results/2026-11-30-h200x2-parallel-walks/",
    "bench/results/2026-11-29-h200-run9/",
    "bench/results/2026-12-04-h200x2-from-gpu-md/",
)

_M = "multigpu-2026-11-30-nvidia-h200x2.json"
_OFFLOAD = "2026-11-29-h200-offload.json"
#: [Note: the records validation scores] what ``timeshare sim validate`` scores when given no record: every record
#: of a switch window, a dedup reload or the store's offload and reload that no calibration read, the held-out ones
#: among them. No constant of a preset, and no default the simulator or the runtime ships, may come from one of
#: these (``tests/sim/calibrate/test_blind.py``): what is scored was never fitted.
VALIDATION_SET: tuple[str, ...] = (
    f"bench/results/2026-11-30-h200x2-all-policies/{_M}",
    f"bench/results/2026-11-30-h200x2-lazy-wake/{_M}",
    f"bench/results/2026-11-30-h200x2-walk-probes/{_M}",
    f"bench/results/2026-11-30-h200x2-switch-8-steps/{_M}",
    f"bench/results/2026-11-30-h200x2-parallel-walks/{_M}",
    f"bench/results/2026-11-30-h200x2-all-policies/stock-nccl/{_M}",
    "bench/results/2026-11-30-h200x2-lifecycle-bind/2026-11-30-h200x2-lifecycle-lazy.json",
    "bench/results/2026-11-30-h200x2-lifecycle-bind/2026-11-30-h200x2-lifecycle-eager.json",
    "bench/results/2026-11-30-h200x2-gpumd/2026-11-30-h200x2-multigpu.json",
    "bench/results/2026-12-04-h200x2-from-gpu-md/figures-2026-12-04-h200x2.json",
    "bench/results/2026-11-30-h200-store/2026-11-30-h200-offload.json",
    *(f"bench/results/2026-11-29-h200-run{n}/{_OFFLOAD}" for n in (2, 3, 4, 5, 6, 9)),
    *(f"bench/results/2026-11-29-h200-run{n}/mallocasync/{_OFFLOAD}" for n in (4, 6)),
)


def held_out(name: str) -> bool:
    """True if the record ``name`` (a path relative to the repository, as :attr:`MultiGpuRecord.name`) is held out."""
    return any(str(name).startswith(d) for d in HELD_OUT)


class RecordError(CliInputError):
    """A measurement record is missing a field or has a wrong one; the message names it."""


@dataclass(frozen=True)
class CommRaw:
    """Raw communicator costs: ``n_comms`` communicators of ``comm_ranks`` ranks, handled one after the other.

    Times and bytes are totals over the ``n_comms`` communicators (None: not
    measured); :meth:`per_comm` divides.
    """

    n_comms: int
    comm_ranks: int
    suspendable_bytes: int | None
    persistent_bytes: int | None
    suspend_s: float | None
    resume_s: float | None
    destroy_s: float | None
    create_first_collective_s: float | None
    create_s: float | None = None
    first_collective_s: float | None = None
    first_collective_after_resume_s: float | None = None
    destroy_uninitialized_s: float | None = None
    steady_collective_s: float | None = None

    def per_comm(self, what: str) -> float | None:
        """``what`` (``suspend_s`` ..., ``suspendable_bytes``) per communicator, or None if not measured."""
        total = getattr(self, what)
        return None if total is None else total / self.n_comms


@dataclass(frozen=True)
class SwitchWindow:
    """The lifecycle benchmark's settings and, per policy, the measured phases (None: not given)."""

    settings: Mapping[str, Any]
    results: Mapping[str, Mapping[str, Any]]
    #: per policy and phase, each step's figure (slowest rank), from the lifecycle spans where the record has them
    #: (``switch_window.spans``: ``lifecycle.pause``, ``lifecycle.weight_sync``, ``lifecycle.resume`` per step)
    steps: Mapping[str, Mapping[str, list[float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class MultiGpuRecord:
    """One run's multi-GPU figures (see the module docstring)."""

    path: Path
    date: str
    device: str
    world_size: int
    command: str
    switch_window: SwitchWindow | None
    comm_raw: CommRaw | None
    dedup: list[Mapping[str, Any]] = field(default_factory=list)
    #: the run's default group was bound to a device (``init_process_group(device_id=...)``), so torch
    #: initialised each new group's communicator at ``new_group``; None where the record does not say
    eager_init: bool | None = None

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class OffloadRecord:
    """An offload benchmark report (read by :func:`sim.calibrate.calibration.compare`)."""

    path: Path
    data: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class ScrubProbeRecord:
    """``bench/gpu/h2d_scrub_probe.py``'s record: H2D rate into a fresh buffer ``delay`` s after a free, and
    into a reused one. The probe copies :attr:`PROBE_BYTES` (11 GiB) from registered host segments."""

    PROBE_BYTES = 11 * 2**30

    path: Path
    reused_gbps: float
    fresh_gbps_at_zero_delay: float

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)

    def scrub_bps(self) -> float:
        """Bytes/s the driver scrubs: the probe's bytes over the extra time of the copy right after the free."""
        extra = self.PROBE_BYTES / (self.fresh_gbps_at_zero_delay * 1e9) - self.PROBE_BYTES / (self.reused_gbps * 1e9)
        if extra <= 0:
            raise RecordError(f"{self.name}: the copy right after a free was not slower than into a reused buffer; "
                              "no scrub to fit")
        return self.PROBE_BYTES / extra


REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class AgreementRecord:
    """``bench/agreement_probe.py``'s record: seconds per lifecycle agreement (median of the slowest rank)."""

    path: Path
    world_size: int
    per_agreement_s: float
    host: str

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class DestroyWalkRecord:
    """``bench/gpu/destroy_walk_probe.py``'s record: every rank's collectives and destroys, host-timed
    (read by :mod:`sim.calibrate.destroy_walks`)."""

    path: Path
    world_size: int
    policy: str
    data: Mapping[str, Any]

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class RebuildProbeRecord:
    """``bench/gpu/rebuild_probe.py``'s record: a group's destroy with the proxy waker on and off (after ``idle_s``
    idle), its rebuild and first collective, medians of the rounds after the first (seconds)."""

    path: Path
    world_size: int
    cumem: str
    idle_s: float
    medians: Mapping[str, float]

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class NcclLogRecord:
    """An NCCL log (or a ``.tgz`` of them) with microsecond timestamps: each destroy's proxy stop and UDS thread exit
    (read by :func:`sim.calibrate.destroy_walks.destroy_costs`)."""

    path: Path

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


@dataclass(frozen=True)
class FigureRange:
    """One transcribed figure: ``lo`` to ``hi`` (equal where one value was given) of ``what`` for ``policies``."""

    what: str
    policies: tuple[str, ...]
    lo: float
    hi: float
    #: scored by ``timeshare sim validate`` (False: reported beside the scores, such as memory)
    scored: bool = True

    @property
    def mid(self) -> float:
        """The middle of the range (the figure compared with a prediction)."""
        return (self.lo + self.hi) / 2


@dataclass(frozen=True)
class FigureRangesRecord:
    """Figures transcribed from a table of ranges (``"kind": "figure_ranges"``): a switch window's over the meshes
    ``meshes`` names (each ``{"dp": ..., "tp": ..., "ep": ...}``), with its ``settings``, and the idle-destroy
    probe's (``idle_destroy``: groups, idle seconds, the mean destroy's range)."""

    path: Path
    date: str
    world_size: int
    settings: Mapping[str, Any]
    meshes: tuple[Mapping[str, int], ...]
    figures: tuple[FigureRange, ...]
    idle_destroy: Mapping[str, Any] | None

    @property
    def name(self) -> str:
        """The record's file, relative to the repository when it lies inside it."""
        return _display(self.path)


Record = (MultiGpuRecord | OffloadRecord | ScrubProbeRecord | AgreementRecord | DestroyWalkRecord | RebuildProbeRecord
          | NcclLogRecord | FigureRangesRecord)


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _num(raw: Mapping[str, Any], key: str, where: str, *, optional: bool = False, integer: bool = False) -> Any:
    if key not in raw or raw[key] is None:
        if optional:
            return None
        raise RecordError(f"{where}.{key}: required")
    v = raw[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (integer and int(v) != v):
        kind = "a non-negative integer" if integer else "a non-negative number"
        raise RecordError(f"{where}.{key}: expected {kind}, got {v!r}")
    return int(v) if integer else float(v)


def wake_proxies_setting(settings: Mapping[str, Any], date: str, where: str) -> bool:
    """Whether the record's runtime woke NCCL's proxy thread in its destroys ([Note: the runtime's proxy waker in a
    record]): its ``wake_proxies`` setting, else False for a record taken before :data:`PROXY_WAKER_SINCE`."""
    v = settings.get("wake_proxies")
    if v is not None:
        if not isinstance(v, bool):
            raise RecordError(f"{where}.wake_proxies: expected true or false, got {v!r}")
        return v
    day = str(date)[:10]
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day) and day < PROXY_WAKER_SINCE:
        return False
    raise RecordError(f"{where}.wake_proxies: required for a record dated {day or 'without a date'} (the runtime wakes "
                      f"NCCL's proxy thread by default since {PROXY_WAKER_SINCE}): say whether the destroys woke it "
                      "(TorchRuntime.wake_proxies)")


def _switch_window(raw: Any, where: str, date: str = "") -> SwitchWindow:
    if not isinstance(raw, Mapping):
        raise RecordError(f"{where}: expected an object with 'settings' and 'results'")
    settings = raw.get("settings")
    if not isinstance(settings, Mapping):
        raise RecordError(f"{where}.settings: required (an object with {list(SETTINGS)})")
    s = {k: _num(settings, k, f"{where}.settings", integer=k in ("dp", "tp", "steps", "warmup", "groups_per_rank"))
         for k in SETTINGS}
    for k in MESH_SETTINGS:
        if settings.get(k) is not None:
            s[k] = _num(settings, k, f"{where}.settings", integer=True)
    s["wake_proxies"] = wake_proxies_setting(settings, date, f"{where}.settings")
    if s["warmup"] >= s["steps"]:
        raise RecordError(f"{where}.settings.warmup: {s['warmup']} must be smaller than steps ({s['steps']})")
    results = raw.get("results")
    if not isinstance(results, list) or not results:
        raise RecordError(f"{where}.results: expected a non-empty list of per-policy results")
    by_policy: dict[str, Mapping[str, Any]] = {}
    for i, r in enumerate(results):
        w = f"{where}.results[{i}]"
        if not isinstance(r, Mapping) or not isinstance(r.get("policy"), str):
            raise RecordError(f"{w}.policy: required (DESTROY, DESTROY_DEFERRED, PAUSED_LIVE or SUSPEND)")
        vals = {k: _num(r, k, w, optional=True) for k in (*PHASES, "total", "held_in_rollout_gib",
                                                          "device_used_in_rollout_gib", *FIRST_USE)}
        if vals["total"] is None:
            raise RecordError(f"{w}.total: required")
        by_policy[r["policy"]] = {"policy": r["policy"], **vals, "states": list(r.get("states") or [])}
    return SwitchWindow(settings=s, results=by_policy, steps=_step_phases(raw.get("spans"), s["steps"]))


#: the training step's first collectives after the wake, and the same again on live groups (optional; what the
#: switch cost adds to the window: :mod:`sim.machine.switch_cost`)
FIRST_USE = ("first_use_after_wake", "steady_use_after_wake")

#: the lifecycle span that times each switch phase in ``bench/switch_window.py``'s ``run_steps``
PHASE_SPANS = {"sleep": "lifecycle.pause", "update_weights": "lifecycle.weight_sync", "wake_up": "lifecycle.resume"}


def _step_phases(spans: Any, steps: int) -> dict[str, dict[str, list[float]]]:
    """Per policy and phase, each step's span duration, slowest rank; a phase whose span is not there once per
    step on every rank is left out (older records have no spans at all)."""
    out: dict[str, dict[str, list[float]]] = {}
    if not isinstance(spans, Mapping):
        return out
    for policy, per_rank in spans.items():
        if not isinstance(per_rank, list) or not per_rank:
            continue
        for phase, span in PHASE_SPANS.items():
            try:
                durations = [[float(d) for n, _, d in sorted(rows, key=lambda r: float(r[1])) if n == span]
                             for rows in per_rank]
            except (TypeError, ValueError):
                continue
            if all(len(d) == steps for d in durations):
                out.setdefault(str(policy), {})[phase] = [max(d[i] for d in durations) for i in range(steps)]
    return out


def _comm_raw(raw: Any, where: str, world_size: int) -> CommRaw:
    if not isinstance(raw, Mapping):
        raise RecordError(f"{where}: expected an object")
    n = _num(raw, "n_comms", where, integer=True)
    if n < 1:
        raise RecordError(f"{where}.n_comms: must be >= 1")
    ranks = _num(raw, "ranks_per_comm", where, optional=True, integer=True) or world_size
    return CommRaw(
        n_comms=n, comm_ranks=ranks,
        suspendable_bytes=_num(raw, "suspendable_bytes", where, optional=True, integer=True),
        persistent_bytes=_num(raw, "persistent_bytes", where, optional=True, integer=True),
        **{k: _num(raw, k, where, optional=True) for k in (*COMM_RAW_TIMES, *COMM_RAW_OPTIONAL_TIMES)},
    )


def _multigpu(data: Mapping[str, Any], path: Path) -> MultiGpuRecord:
    where = _display(path)
    if data.get("schema") != 1:
        raise RecordError(f"{where}.schema: {data.get('schema')!r} is not a schema this code reads (1)")
    ws = _num(data, "world_size", where, integer=True)
    if data.get("dry_run"):
        raise RecordError(f"{where}.dry_run: a dry run (CPU, Gloo, tiny sizes) measures nothing to fit or validate")
    sw = data.get("switch_window")
    cr = data.get("comm_raw")
    if isinstance(cr, Mapping) and "skipped" in cr:
        log.info("%s.comm_raw was skipped when measured: %s", where, cr["skipped"])
        cr = None
    dedup = data.get("dedup") or []
    if not isinstance(dedup, list):
        raise RecordError(f"{where}.dedup: expected a list")
    return MultiGpuRecord(
        path=path, date=str(data.get("date", "")), device=str(data.get("device", "")), world_size=ws,
        command=str(data.get("command", "")),
        switch_window=None if sw is None else _switch_window(sw, f"{where}.switch_window", str(data.get("date", ""))),
        comm_raw=None if cr is None else _comm_raw(cr, f"{where}.comm_raw", ws),
        dedup=list(dedup),
        eager_init=(data.get("init_process_group") or {}).get("device_id_bound"),
    )


_HEADER = re.compile(r"(?P<groups>\d+) NCCL groups, cooldown (?P<cooldown>[\d.]+) s, rollout (?P<rollout>[\d.]+) s; "
                     r"mean of steps (?P<first>\d+)-(?P<last>\d+)")


def _comm_h200(data: Mapping[str, Any], path: Path) -> MultiGpuRecord:
    """bench/gpu/comm_h200.py's one-GPU record as a world-size-1 multigpu record."""
    where = _display(path)
    per_group = data.get("per_group") or []
    comm_raw = None
    if per_group:
        first = per_group[0]
        comm_raw = CommRaw(
            n_comms=len(per_group), comm_ranks=1,
            suspendable_bytes=sum(int(g["suspendable"]) for g in per_group) if "suspendable" in first else None,
            persistent_bytes=None,
            suspend_s=sum(float(g["suspend_s"]) for g in per_group),
            resume_s=sum(float(g["resume_s"]) for g in per_group),
            destroy_s=None, create_first_collective_s=None,
        )
        stats = data.get("mem_stats") or []
        if stats and "persistent" in stats[0]:
            comm_raw = CommRaw(**{**comm_raw.__dict__, "persistent_bytes": int(stats[0]["persistent"]) * len(per_group)})
    sw = None
    raw_sw = data.get("switch_window")
    if raw_sw:
        m = _HEADER.search(raw_sw.get("header", ""))
        if m is None:
            raise RecordError(f"{where}.switch_window.header: cannot read the settings from {raw_sw.get('header')!r}")
        settings = {"dp": 1, "tp": 1, "steps": int(m["last"]), "warmup": int(m["first"]) - 1, "train_s": 0.0,
                    "rollout_s": float(m["rollout"]), "cooldown_s": float(m["cooldown"]),
                    "groups_per_rank": int(m["groups"])}
        sw = _switch_window({"settings": settings, "results": raw_sw["results"]}, f"{where}.switch_window",
                            str(data.get("date", "")))
    return MultiGpuRecord(path=path, date=str(data.get("date", "")), device=str(data.get("device", "")),
                          world_size=1, command="bench/gpu/comm_h200.py", switch_window=sw, comm_raw=comm_raw)


def _rebuild_probe(data: Mapping[str, Any], path: Path) -> RebuildProbeRecord:
    where = _display(path)
    med = data.get("median_after_first")
    if not isinstance(med, Mapping):
        raise RecordError(f"{where}.median_after_first: required (the medians of the rounds after the first)")
    medians = {k: _num(med, k, f"{where}.median_after_first") for k in ("destroy_wake1_s", "destroy_wake0_s",
                                                                          "rebuild_wake1_s")}
    if data.get("device", "cpu") == "cpu":
        raise RecordError(f"{where}: a dry run (CPU, Gloo) measures nothing of NCCL")
    return RebuildProbeRecord(path=path, world_size=_num(data, "world_size", where, integer=True),
                              cumem=str(data.get("nccl_cumem_enable", "unset")), idle_s=_num(data, "idle_s", where),
                              medians=medians)


def _figure_ranges(data: Mapping[str, Any], path: Path) -> FigureRangesRecord:
    where = _display(path)
    sw = data.get("switch_window")
    if not isinstance(sw, Mapping) or not isinstance(sw.get("settings"), Mapping):
        raise RecordError(f"{where}.switch_window.settings: required")
    raw_settings = sw["settings"]
    settings = {k: _num(raw_settings, k, f"{where}.switch_window.settings",
                        integer=k in ("steps", "warmup", "groups_per_rank"))
                for k in SETTINGS if k not in ("dp", "tp")}
    if settings["warmup"] >= settings["steps"]:
        raise RecordError(f"{where}.switch_window.settings.warmup: must be smaller than steps")
    settings["wake_proxies"] = wake_proxies_setting(raw_settings, str(data.get("date", "")),
                                                    f"{where}.switch_window.settings")
    meshes = sw.get("meshes")
    if not isinstance(meshes, list) or not meshes or not all(isinstance(m, Mapping) for m in meshes):
        raise RecordError(f"{where}.switch_window.meshes: expected a list of meshes ({{\"dp\": 1, \"tp\": 2}}, ...)")
    mesh_keys = ("dp", "tp", *MESH_SETTINGS)
    parsed_meshes = []
    for i, m in enumerate(meshes):
        unknown = set(m) - set(mesh_keys)
        if unknown:
            raise RecordError(f"{where}.switch_window.meshes[{i}]: unknown keys {sorted(unknown)}; known: {list(mesh_keys)}")
        parsed_meshes.append({k: _num(m, k, f"{where}.switch_window.meshes[{i}]", integer=True) for k in m})
    figures = []
    for i, f in enumerate(sw.get("figures") or []):
        w = f"{where}.switch_window.figures[{i}]"
        if not isinstance(f, Mapping) or not isinstance(f.get("what"), str) or not isinstance(f.get("policies"), list):
            raise RecordError(f"{w}: expected what, policies, lo, hi")
        lo, hi = _num(f, "lo", w), _num(f, "hi", w)
        if hi < lo:
            raise RecordError(f"{w}: hi {hi} is below lo {lo}")
        figures.append(FigureRange(f["what"], tuple(map(str, f["policies"])), lo, hi, bool(f.get("scored", True))))
    idle = data.get("idle_destroy")
    if idle is not None:
        if not isinstance(idle, Mapping):
            raise RecordError(f"{where}.idle_destroy: expected an object")
        for k in ("groups", "idle_s", "mean_lo_s", "mean_hi_s"):
            _num(idle, k, f"{where}.idle_destroy", integer=k == "groups")
    return FigureRangesRecord(path=path, date=str(data.get("date", "")), world_size=_num(data, "world_size", where,
                                                                                        integer=True),
                              settings=settings, meshes=tuple(parsed_meshes), figures=tuple(figures), idle_destroy=idle)


def load_record(path: str | Path) -> Record:
    """Read one record (multigpu, one-GPU communicator, or offload report); RecordError names what is wrong."""
    path = Path(path)
    if path.name.endswith((".log", ".tgz", ".tar.gz")):
        if not path.is_file():
            raise RecordError(f"{path}: cannot read it (no such file)")
        return NcclLogRecord(path=path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise RecordError(f"{path}: cannot read it ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise RecordError(f"{path}: expected a JSON object")
    if data.get("kind") == "multigpu":
        return _multigpu(data, path)
    if data.get("kind") == "agreement_probe":
        where = _display(path)
        return AgreementRecord(path=path, world_size=_num(data, "world_size", where, integer=True),
                               per_agreement_s=_num(data, "per_agreement_s", where), host=str(data.get("host", "")))
    if data.get("kind") == "destroy_walk_probe":
        where = _display(path)
        if data.get("dry_run"):
            raise RecordError(f"{where}: dry_run: a dry run (CPU, Gloo) measures nothing of NCCL")
        if not isinstance(data.get("ranks"), list):
            raise RecordError(f"{where}: ranks: required, a list of every rank's events")
        return DestroyWalkRecord(path=path, world_size=_num(data, "world_size", where, integer=True),
                                 policy=str(data.get("policy", "")), data=data)
    if data.get("kind") == "rebuild_probe":
        return _rebuild_probe(data, path)
    if data.get("kind") == "figure_ranges":
        if data.get("schema") != 1:
            raise RecordError(f"{_display(path)}.schema: {data.get('schema')!r} is not a schema this code reads (1)")
        return _figure_ranges(data, path)
    if "per_group" in data and "switch_window" in data:
        return _comm_h200(data, path)
    if "shapes" in data and "variants" in data:
        return OffloadRecord(path=path, data=data)
    if "reused_gbps" in data and "cudamalloc_delay_0.0_gbps" in data:
        return ScrubProbeRecord(path=path, reused_gbps=_num(data, "reused_gbps", str(path)),
                                fresh_gbps_at_zero_delay=_num(data, "cudamalloc_delay_0.0_gbps", str(path)))
    raise RecordError(
        f"{path}: not a record this code reads: expected \"kind\": \"multigpu\" (bench/gpu/multigpu.py), "
        "a bench/gpu/comm_h200.py record (per_group, switch_window), an offload report (shapes, variants), "
        "a bench/gpu/h2d_scrub_probe.py record, \"kind\": \"agreement_probe\" (bench/agreement_probe.py), "
        "\"kind\": \"destroy_walk_probe\" (bench/gpu/destroy_walk_probe.py), \"kind\": \"rebuild_probe\" "
        "(bench/gpu/rebuild_probe.py), \"kind\": \"figure_ranges\" or an NCCL log (.log, .tgz)"
    )


__all__ = ["HELD_OUT", "VALIDATION_SET", "held_out", "AgreementRecord", "COMM_RAW_OPTIONAL_TIMES", "COMM_RAW_TIMES", "CommRaw",
           "DestroyWalkRecord", "FigureRange", "FigureRangesRecord", "MESH_SETTINGS", "MultiGpuRecord", "NcclLogRecord",
           "OffloadRecord", "PHASES", "PROXY_WAKER_SINCE", "Record", "RebuildProbeRecord", "RecordError",
           "ScrubProbeRecord", "SETTINGS", "SwitchWindow", "load_record", "wake_proxies_setting"]
