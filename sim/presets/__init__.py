"""Built-in presets: machine descriptions and example scenarios, and how their numbers are read.

A preset's physical numbers live in its ``constants`` table, each with a
``value``, a ``unit`` and a ``source`` that says where it came from (measured on
the H200 test machine, a datasheet, a paper, NCCL's own tuning tables, or an
assumption said as such). The rest of the preset names constants instead of
writing numbers, so :class:`ConstantTable.ref` is the only way a figure gets in,
and it refuses a bare number.

This module reads those tables and the three parameter sections of a preset
(``copy``, ``collective``, ``comm``); :mod:`sim.machine.topology` reads the graph part.
"""
from __future__ import annotations

from refimpl.cli_errors import CliInputError  # bad input: the CLI answers it with one line and exit 2

import dataclasses
import enum
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

PRESET_DIR = Path(__file__).parent
SCENARIO_DIR = PRESET_DIR / "scenarios"


class PresetError(CliInputError):
    """A preset (or a topology given inline) is invalid; the message names the field."""


class LinkKind(enum.Enum):
    """What an edge of the topology graph is; collective efficiencies are per kind."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    MEMORY_BUS = "memory_bus"
    INTER_SOCKET = "inter_socket"
    NETWORK = "network"


# unit -> (dimension, factor to SI base: bytes, bytes/s, seconds, seconds per byte, 1)
UNITS: dict[str, tuple[str, float]] = {
    "B": ("bytes", 1.0),
    "KiB": ("bytes", 2.0**10),
    "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30),
    "TiB": ("bytes", 2.0**40),
    "KB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12),
    "MB/s": ("bandwidth", 1e6),
    "GB/s": ("bandwidth", 1e9),
    "TB/s": ("bandwidth", 1e12),
    "Gb/s": ("bandwidth", 1e9 / 8),
    "s": ("time", 1.0),
    "ms": ("time", 1e-3),
    "us": ("time", 1e-6),
    "s/GiB": ("time_per_byte", 1.0 / 2.0**30),
    "1": ("ratio", 1.0),
}


@dataclass(frozen=True)
class Constant:
    """A physical number with its unit and where it came from. ``value`` is in SI base units."""

    name: str
    value: float
    unit: str
    source: str

    @property
    def dimension(self) -> str:
        """What the unit measures: bytes, bandwidth, time, time_per_byte or ratio."""
        return UNITS[self.unit][0]

    @property
    def as_written(self) -> float:
        """The value in the unit the preset wrote it in."""
        return self.value / UNITS[self.unit][1]


class ConstantTable:
    """The ``constants`` of a preset, validated: every entry has a value, a unit and a source."""

    def __init__(self, raw: Any, where: str):
        if not isinstance(raw, Mapping) or not raw:
            raise PresetError(f"{where}: expected an object of named constants")
        self.where = where
        self.by_name: dict[str, Constant] = {}
        for name, c in raw.items():
            w = f"{where}.{name}"
            section(c, w, (), ("value", "unit", "source", "records"))
            val, unit, source = c.get("value"), c.get("unit"), c.get("source")
            if not isinstance(val, (int, float)) or isinstance(val, bool) or not math.isfinite(val) or val < 0:
                raise PresetError(f"{w}.value: expected a finite non-negative number, got {val!r}")
            if unit not in UNITS:
                raise PresetError(f"{w}.unit: {unit!r} is not one of {sorted(UNITS)}")
            if not isinstance(source, str) or len(source.strip()) < 8:
                raise PresetError(
                    f"{w}.source: every constant must say where it came from (measured, datasheet, paper, assumption)"
                )
            self.by_name[name] = Constant(name, float(val) * UNITS[unit][1], unit, source)

    def ref(self, val: Any, where: str, dimension: str) -> float:
        """The SI value of the constant named ``val``; refuses bare numbers and wrong dimensions."""
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            raise PresetError(f"{where}: bare number {val!r}; name a constant instead, so the figure has a unit and a source")
        if not isinstance(val, str) or val not in self.by_name:
            raise PresetError(f"{where}: {val!r} is not a constant of this topology (known: {sorted(self.by_name)})")
        c = self.by_name[val]
        if c.dimension != dimension:
            raise PresetError(f"{where}: constant {val!r} is in {c.unit} ({c.dimension}), expected a {dimension}")
        return c.value

    def per_kind(self, raw: Any, where: str, dimension: str) -> dict[LinkKind, float]:
        """A table of link kind -> constant name, resolved."""
        if not isinstance(raw, Mapping):
            raise PresetError(f"{where}: expected an object of link kind -> constant name")
        out: dict[LinkKind, float] = {}
        for k, v in raw.items():
            try:
                lk = LinkKind(k)
            except ValueError:
                raise PresetError(f"{where}.{k}: not a link kind {[x.value for x in LinkKind]}") from None
            out[lk] = self.ref(v, f"{where}.{k}", dimension)
        return out


def section(raw: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> Mapping[str, Any]:
    """Check that ``raw`` is an object with every ``required`` key and no key outside ``required`` + ``optional``."""
    from sim.presets.schemas import check_fields

    return check_fields(raw, where, required, optional, PresetError)


# --------------------------------------------------------------------------- parameter sections


@dataclass(frozen=True)
class CopyParams:
    """Costs of copies and pinning on one GPU (the preset's ``copy`` section).

    ``scrub_bps``: how fast the driver zero-fills device memory given back to it
    (bytes/s); host-to-device copies issued while it does so wait for it
    (``bench/results/2026-11-29-h200-run7``). 0: not simulated.
    """

    latency_s: float
    pin_s_per_byte: float
    scrub_bps: float = 0.0


def parse_copy(raw: Any, where: str, table: ConstantTable) -> CopyParams:
    """Read a ``copy`` section: ``latency`` per copy, ``pin_rate`` (cudaHostRegister time per byte) and,
    optionally, ``scrub_bandwidth`` (the driver's zero-fill rate of freed device memory)."""
    raw = section(raw, where, ("latency", "pin_rate"), optional=("scrub_bandwidth",))
    scrub = raw.get("scrub_bandwidth")
    return CopyParams(
        latency_s=table.ref(raw["latency"], f"{where}.latency", "time"),
        pin_s_per_byte=table.ref(raw["pin_rate"], f"{where}.pin_rate", "time_per_byte"),
        scrub_bps=0.0 if scrub is None else table.ref(scrub, f"{where}.scrub_bandwidth", "bandwidth"),
    )


@dataclass(frozen=True)
class CollectiveParams:
    """Collective cost parameters (the preset's ``collective`` section).

    ``efficiency[kind]`` is the fraction of a link's line rate that NCCL reaches
    as bus bandwidth on it (nccl-tests convention). ``ring_base_s`` and
    ``tree_base_s`` are the fixed latencies of one collective,
    ``ring_step_s[kind]`` and ``tree_step_s[kind]`` the latency of one algorithm
    step over a link of that kind (NCCL's own tuning tables).
    """

    efficiency: Mapping[LinkKind, float]
    ring_base_s: float
    tree_base_s: float
    ring_step_s: Mapping[LinkKind, float]
    tree_step_s: Mapping[LinkKind, float]


def parse_collective(raw: Any, where: str, table: ConstantTable, kinds_used: set[LinkKind]) -> CollectiveParams:
    """Read a ``collective`` section; every link kind a collective can cross needs an entry."""
    raw = section(raw, where, ("efficiency", "ring_base", "tree_base", "ring_step", "tree_step"))
    eff = table.per_kind(raw["efficiency"], f"{where}.efficiency", "ratio")
    for k, v in eff.items():
        if not 0 < v <= 1:
            raise PresetError(f"{where}.efficiency.{k.value}: must be in (0, 1], got {v}")
    ring = table.per_kind(raw["ring_step"], f"{where}.ring_step", "time")
    tree = table.per_kind(raw["tree_step"], f"{where}.tree_step", "time")
    needed = kinds_used - {LinkKind.MEMORY_BUS, LinkKind.INTER_SOCKET}
    for tab, name in ((eff, "efficiency"), (ring, "ring_step"), (tree, "tree_step")):
        missing = needed - set(tab)
        if missing:
            raise PresetError(f"{where}.{name}: no entry for link kinds {sorted(k.value for k in missing)} used by this topology")
    return CollectiveParams(
        efficiency=eff,
        ring_base_s=table.ref(raw["ring_base"], f"{where}.ring_base", "time"),
        tree_base_s=table.ref(raw["tree_base"], f"{where}.tree_base", "time"),
        ring_step_s=ring,
        tree_step_s=tree,
    )


@dataclass(frozen=True)
class CommParams:
    """NCCL communicator costs on this machine (the preset's ``comm`` section).

    ``init_s`` is paid at the first collective of a (re)built group (torch
    creates NCCL communicators lazily); ``destroy_s`` when a group whose
    communicator was initialised is destroyed, ``destroy_uninitialized_s``
    otherwise; ``create_group_s`` is the process-group object itself.

    [Note: one-rank and multi-rank communicators] A one-rank communicator has no
    peer: no bootstrap barrier in suspend/resume/destroy, no peer buffers. What
    one costs was measured on one GPU; what a communicator of two or more ranks
    costs was measured across GPUs (``ncclCommMemStats`` gives a two-rank
    communicator on 2 x H200 half the suspendable memory of a one-rank one, and
    a different suspend time). The optional ``*_multi`` keys of the section hold
    the multi-rank figures; a preset without them uses the one-rank figures for
    every communicator. :meth:`for_size` picks the set for a group size.
    ``resume_first_collective_s`` is what the first collective after a resume
    costs beyond the collective itself (0 where not measured).

    [Note: the proxy's 500 ms poll] ``proxy_poll_s`` (optional key
    ``proxy_poll``; 0: not simulated) is the poll timeout of NCCL's UDS proxy
    thread (``ncclProxyServiceUDS`` in NCCL's ``src/proxy.cc``: ``poll(pollfds,
    1, 500)``, and it reads its stop flag only when the poll returns). Each
    initialised communicator has that thread (cuMem, the default on Hopper),
    and ``ncclCommDestroy`` joins it (``commFree``). So destroying an
    initialised communicator waits for its thread's next poll timeout, which
    falls ``proxy_poll_s`` apart from the end of its initialisation (the
    thread's last request): ``destroy_s`` is what is left beyond that wait.

    ``poll_phase_spread_s`` (optional key ``poll_phase_spread``; 0: not
    simulated) is how far the proxy threads' poll phases move against one another
    from one training step to the next on real hardware: the range, over steps,
    of the time from the first to the last lazy NCCL init of the training step's
    groups (``bench/gpu/destroy_walk_probe.py`` records, :mod:`sim.calibrate.fit`). A
    destroy whose simulated wait for its poll timeout is shorter than that can
    find the timeout just passed and wait a whole period more, and every later
    destroy of its walk with it ([Note: one poll period more] in
    :mod:`sim.calibrate.destroy_walks`): the simulator marks such a phase as ending either
    when it says or ``proxy_poll_s`` later (:attr:`sim.machine.collectives.NcclComm.poll_late`).

    ``agreement_s`` (optional key ``agreement``; 0: not simulated) is what one
    collective on a two-rank Gloo group takes on this host (the lifecycle's
    agreements on its control group): a collective on a Gloo group takes at least
    that, ``n - 1`` times over ``n`` ranks, or what the links give if more
    (:meth:`sim.machine.collectives.NcclComm.gloo_collective_time`).
    """

    memory_bytes: int
    persistent_bytes: int
    suspend_s: float
    resume_s: float
    init_s: float
    destroy_s: float
    destroy_uninitialized_s: float
    create_group_s: float
    resume_first_collective_s: float = 0.0
    #: NCCL's UDS proxy thread's poll timeout, which a destroy of an initialised communicator waits out (0: none)
    proxy_poll_s: float = 0.0
    #: how far the poll phases of a training step's communicators move against one another between steps (0: none)
    poll_phase_spread_s: float = 0.0
    #: one collective on a Gloo group (a lifecycle agreement) on this host (0: timed like NCCL)
    agreement_s: float = 0.0
    #: the fraction of walks over just-initialised groups that end one poll period late (fitted on probe records;
    #: a marked phase's expected figure is its simulated one plus this many periods)
    poll_late_rate: float = 0.0
    #: the same costs for communicators of two or more ranks (None: as one-rank)
    multi: "CommParams | None" = None
    #: how the costs grow past two ranks ([Note: communicator costs by size]): "log2" (every cost of
    #: :data:`SIZE_SCALED`), or "ring" (the init's connection part, ``init_connect_share`` of the two-rank init,
    #: the same at any size; the rest of every cost as "log2")
    size_rule: str = "log2"
    #: the share of a two-rank communicator's lazy init that is the connection made at its first collective
    #: (NCCL's runtime connect; used by the "ring" rule)
    init_connect_share: float = 0.0
    #: a communicator's lazy init (its creation at the first collective) measured at sizes past two ranks,
    #: ``((ranks, seconds), ...)`` ascending; it replaces :attr:`size_rule`'s ``init_s`` at those sizes, between
    #: them and beyond (:func:`_measured_init`); empty: none measured
    init_measured: tuple[tuple[int, float], ...] = ()
    #: the most channels a communicator of two or more ranks is made with (NCCL's ``maxCTAs``; 0: NCCL's choice):
    #: its connection, ``connect_share`` of the lazy init at ``connect_channels`` channels, scales by
    #: ``min(channel_cap, connect_channels) / connect_channels`` ([Note: a communicator's channels])
    channel_cap: int = 0
    #: the ring channels the connection share was measured at (NCCL's log of the two-rank creations)
    connect_channels: int = 0
    #: the connection's share of the lazy init at :attr:`connect_channels` (used with :attr:`channel_cap`)
    connect_share: float = 0.0
    #: the share of that connection that goes one channel at a time (the rest kept whole under a cap)
    per_channel_share: float = 1.0

    def for_size(self, ranks: int) -> "CommParams":
        """The cost set of a communicator over ``ranks`` ranks ([Note: communicator costs by size]): one-rank; the
        multi-rank figures at two ranks; beyond, scaled by :attr:`size_rule` (the init from :attr:`init_measured`
        where that has sizes); the connection capped by :attr:`channel_cap` from two ranks on."""
        if ranks <= 1 or self.multi is None:
            return self
        base = self.multi if ranks == 2 else _scaled(self, ranks)
        return _capped(self, base) if self.channel_cap else base

    def with_channel_cap(self, cap: int, channels: int, connect_share: float,
                         per_channel_share: float = 1.0) -> "CommParams":
        """These costs for communicators made with at most ``cap`` channels, the connection being
        ``connect_share`` (in (0, 1)) of a lazy init at ``channels`` channels and ``per_channel_share`` (in (0, 1])
        of that connection going one channel at a time ([Note: a communicator's channels])."""
        if not isinstance(cap, int) or cap < 1:
            raise ValueError(f"a channel cap is a channel count >= 1, got {cap!r}")
        if not isinstance(channels, int) or channels < 1:
            raise ValueError(f"the channels the connection was measured at must be >= 1, got {channels!r}")
        if not 0.0 < connect_share < 1.0:
            raise ValueError(f"the connection's share of the init must be in (0, 1), got {connect_share!r}")
        if not 0.0 < per_channel_share <= 1.0:
            raise ValueError(f"the connection's per-channel share must be in (0, 1], got {per_channel_share!r}")
        if self.init_measured:
            raise ValueError("a creation measured past two ranks was made with its run's channels: a channel cap "
                             "cannot be applied to it")
        if self.multi is None:
            raise ValueError("a channel cap needs the preset's two-rank figures (its *_multi keys)")
        return dataclasses.replace(self, channel_cap=cap, connect_channels=channels, connect_share=connect_share,
                                   per_channel_share=per_channel_share)

    def with_measured_init(self, measured: "Mapping[int, float] | Iterable[tuple[int, float]]") -> "CommParams":
        """These costs with the lazy init measured at sizes past two ranks (``{ranks: seconds}``, each ranks > 2 and
        seconds > 0): see :func:`_measured_init`."""
        items = sorted(dict(measured).items())
        for n, s in items:
            if not isinstance(n, int) or n <= 2:
                raise ValueError(f"a measured init is for a communicator of more than two ranks (two and one are "
                                 f"the preset's), got {n!r} ranks")
            if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
                raise ValueError(f"a measured init must be a positive number of seconds, got {s!r} at {n} ranks")
        if self.multi is None:
            raise ValueError("a measured init past two ranks needs the preset's two-rank figures (its *_multi keys)")
        if self.channel_cap:
            raise ValueError("a creation measured past two ranks was made with its run's channels: it cannot be "
                             "combined with a channel cap")
        return dataclasses.replace(self, init_measured=tuple((n, float(s)) for n, s in items))

    def with_size_rule(self, rule: str, init_connect_share: float = 0.0) -> "CommParams":
        """These costs with another rule past two ranks (:data:`SIZE_RULES`); ``init_connect_share`` in [0, 1) for
        "ring"."""
        if rule not in SIZE_RULES:
            raise ValueError(f"size rule must be one of {SIZE_RULES}, got {rule!r}")
        if rule == "ring" and not 0.0 < init_connect_share < 1.0:
            raise ValueError(f"the ring rule needs the init's connection share in (0, 1), got {init_connect_share!r}")
        return dataclasses.replace(self, size_rule=rule, init_connect_share=init_connect_share)


#: the rules a communicator's costs grow by past two ranks (:attr:`CommParams.size_rule`)
SIZE_RULES = ("log2", "ring")
#: the times of a communicator that grow with its size ([Note: communicator costs by size])
SIZE_SCALED = ("suspend_s", "resume_s", "init_s", "destroy_s", "destroy_uninitialized_s", "create_group_s",
               "resume_first_collective_s")


@functools.lru_cache(maxsize=256)
def _scaled(params: CommParams, ranks: int) -> CommParams:
    """[Note: communicator costs by size] A communicator of ``ranks`` ranks: each of :data:`SIZE_SCALED` is
    ``t1 + (t2 - t1) * log2(ranks)``, ``t1`` the one-rank figure and ``t2`` the two-rank one (never below 0);
    memory and the poll figures stay the two-rank ones.

    The records have communicators of one and two ranks only (the commsplit probe times both in one run; H200
    run 1 and the 2 x H200 records the suspend and resume), which fit the two parameters and no more. The shape
    beyond two ranks, one more step of (t2 - t1) per doubling (NCCL's bootstrap and connection setup add a level
    of its rings' and trees' exchanges per doubling), is an assumption no record tests; nodes enter only through
    the ranks (no record spans nodes). ``python -m sim.calibrate.comm_scaling`` checks the fit against every record with a
    communicator of either size.

    The "ring" rule (``size_rule``) splits the lazy init as NCCL's own log of a two-rank run does
    (:mod:`sim.calibrate.nccl_init_log`): ``ncclCommInitRankConfig`` (bootstrap, topology, graphs) and the
    connection NCCL makes at the first collective (every channel's buffers registered with its ring neighbours).
    On one node a ring's connections per rank are as many at any size (a send to the next rank and a receive from
    the previous, per channel; at two ranks next and previous are the same rank), so the connection part,
    ``init_connect_share`` of the two-rank init, stays as it is and only the rest grows by the log2 step. Neither
    rule is tested past two ranks."""
    k = math.log2(ranks)
    multi = params.multi
    values = {f: max(0.0, getattr(params, f) + (getattr(multi, f) - getattr(params, f)) * k) for f in SIZE_SCALED}
    if params.size_rule == "ring":
        connect = params.init_connect_share * multi.init_s
        values["init_s"] = max(0.0, params.init_s + (multi.init_s - connect - params.init_s) * k) + connect
    if params.init_measured:
        values["init_s"] = _measured_init(((2, multi.init_s), *params.init_measured), ranks)
    return dataclasses.replace(multi, **values)


@functools.lru_cache(maxsize=256)
def _capped(params: CommParams, base: CommParams) -> CommParams:
    """[Note: a communicator's channels] ``base`` (a communicator of two or more ranks) made with at most
    ``params.channel_cap`` channels.

    NCCL's log of the two-rank creations on two H200s (:mod:`sim.calibrate.nccl_init_log`) puts most of a creation in
    the connection its first collective makes (``connect_share``), and most of that connection in one exchange of a
    cuMem buffer's handle through the proxy after another, one per ring channel and direction: 48 for 24 channels,
    2.86 ms apart (median), 0.889 of the connection from the first exchange to the last (``per_channel_share``); the
    rest, the proxy connections before the first exchange and the rings' completion after the last, is kept whole.
    NCCL's ``maxCTAs`` caps the channels (``ncclTopoPostset`` takes the smaller of it and the channels its search
    found), so the model scales the per-channel part by the channels kept, ``min(cap, C) / C``, ``C`` the log's
    channels. The connection is ``connect_share`` of the init the size rule gives at this size (the "ring" rule
    keeps it at the two-rank figure, the "log2" rule grows it with the rest). Assumed, not measured: that the
    exchanges a cap removes take what the log's took, and that a communicator of more ranks has at least ``cap``
    channels. ``python bench/gpu/channels_probe.py`` on two or more GPUs measures both. Only the lazy init scales;
    a suspend, resume and destroy keep their figures."""
    cap, chans = params.channel_cap, params.connect_channels
    connect = params.connect_share * (params.multi.init_s if params.size_rule == "ring" else base.init_s)
    keep = min(cap, chans) / chans
    return dataclasses.replace(base, init_s=max(0.0, base.init_s - connect * params.per_channel_share * (1.0 - keep)))


def _measured_init(points: tuple[tuple[int, float], ...], ranks: int) -> float:
    """The lazy init of ``ranks`` ranks from measured ``(ranks, seconds)`` points (the preset's two-rank figure
    first, then those of :attr:`CommParams.init_measured`, ascending): the point's own figure at a measured size;
    between two, the line through them in log2 of the ranks; past the largest, the line through the last two (one
    more step of their difference per doubling, the log2 rule's shape from measured figures). Never below 0."""
    for n, s in points:
        if n == ranks:
            return s
    lo, hi = points[-2], points[-1]
    for a, b in zip(points, points[1:]):
        if a[0] < ranks < b[0]:
            lo, hi = a, b
            break
    (n0, s0), (n1, s1) = lo, hi
    return max(0.0, s0 + (s1 - s0) * (math.log2(ranks) - math.log2(n0)) / (math.log2(n1) - math.log2(n0)))


_COMM_FIELDS = {
    "memory": "bytes",
    "persistent": "bytes",
    "suspend": "time",
    "resume": "time",
    "init": "time",
    "destroy": "time",
    "destroy_uninitialized": "time",
    "create_group": "time",
}
#: optional keys: the first collective after a resume, and the multi-rank figures (``<key>_multi``)
_COMM_OPTIONAL = {"resume_first_collective": "time", **{f"{k}_multi": d for k, d in _COMM_FIELDS.items()},
                  "resume_first_collective_multi": "time", "proxy_poll": "time",
                  "poll_phase_spread": "time", "agreement": "time", "poll_late_rate": "ratio"}


def parse_comm(raw: Any, where: str, table: ConstantTable) -> CommParams:
    """Read a ``comm`` section (communicator memory and lifecycle costs; see :class:`CommParams`)."""
    raw = section(raw, where, _COMM_FIELDS, optional=_COMM_OPTIONAL)
    v = {k: table.ref(raw[k], f"{where}.{k}", d) for k, d in _COMM_FIELDS.items()}
    opt = {k: table.ref(raw[k], f"{where}.{k}", d) for k, d in _COMM_OPTIONAL.items() if k in raw}

    poll = opt.get("proxy_poll", 0.0)
    spread = opt.get("poll_phase_spread", 0.0)
    agreement = opt.get("agreement", 0.0)
    late_rate = opt.get("poll_late_rate", 0.0)

    def build(values: Mapping[str, float], first_after_resume: float) -> CommParams:
        return CommParams(
            memory_bytes=int(values["memory"]),
            persistent_bytes=int(values["persistent"]),
            suspend_s=values["suspend"],
            resume_s=values["resume"],
            init_s=values["init"],
            destroy_s=values["destroy"],
            destroy_uninitialized_s=values["destroy_uninitialized"],
            create_group_s=values["create_group"],
            resume_first_collective_s=first_after_resume,
            proxy_poll_s=poll,
            poll_phase_spread_s=spread,
            agreement_s=agreement,
            poll_late_rate=late_rate,
        )

    one_rank_first = opt.get("resume_first_collective", 0.0)
    multi = None
    if any(k.endswith("_multi") for k in opt):
        mv = {k: opt.get(f"{k}_multi", v[k]) for k in _COMM_FIELDS}
        multi = build(mv, opt.get("resume_first_collective_multi", one_rank_first))
    return dataclasses.replace(build(v, one_rank_first), multi=multi)


# --------------------------------------------------------------------------- files


def list_presets() -> list[str]:
    """Names of the built-in topology presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def list_calibrated() -> list[str]:
    """Names of the shipped calibrated presets (``calibrated/NAME``: a built-in preset with the constants
    ``timeshare sim calibrate`` fitted on measurements)."""
    return sorted(f"calibrated/{p.stem}" for p in (PRESET_DIR / "calibrated").glob("*.json"))


def preferred_preset(name: str) -> str:
    """The preset a user gets for machine ``name``: its calibrated variant where one is shipped (measured constants
    beat datasheet ones), else ``name`` itself (a preset file, a calibrated name, or a machine without one)."""
    if isinstance(name, str) and not name.endswith(".json") and f"calibrated/{name}" in list_calibrated():
        return f"calibrated/{name}"
    return name


def load_preset_data(name: str) -> dict[str, Any]:
    """The raw JSON of a built-in topology preset, or of a preset file (a path ending in ``.json``,
    such as one written by ``timeshare sim calibrate``)."""
    path = PRESET_DIR / f"{name}.json"
    if str(name).endswith(".json"):
        path = Path(name)
        if not path.is_file():
            raise PresetError(f"preset file {name!r} does not exist; built-in presets: {list_presets()}")
    if not path.is_file():
        raise PresetError(f"unknown topology preset {name!r}; built-in presets: {list_presets()}")
    return json.loads(path.read_text())


def first_gpus(data: Mapping[str, Any], gpus: int) -> dict[str, Any]:
    """A copy of preset ``data`` whose node keeps only its first ``gpus`` GPUs (and the links that do not touch the
    others): e.g. the 2 x H200 host measured in bench/results/2026-11-30-h200x2-multigpu from ``hgx-h200-8x``."""
    out = json.loads(json.dumps(dict(data)))
    names = [e["name"] for e in out["node"]["elements"] if e.get("kind") == "gpu"]
    if not isinstance(gpus, int) or not 1 <= gpus <= len(names):
        raise PresetError(f"GPUs per node: expected an integer from 1 to the preset's {len(names)}, got {gpus!r}")
    drop = set(names[gpus:])
    out["node"]["elements"] = [e for e in out["node"]["elements"] if e["name"] not in drop]
    out["node"]["links"] = [lk for lk in out["node"]["links"] if not set(lk["ends"]) & drop]
    return out


def list_scenarios() -> list[str]:
    """Names of the example scenarios shipped under ``sim/presets/scenarios``."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.json"))


def scenario_path(name: str) -> Path:
    """Path of a shipped example scenario."""
    path = SCENARIO_DIR / f"{name}.json"
    if not path.is_file():
        raise PresetError(f"unknown example scenario {name!r}; shipped scenarios: {list_scenarios()}")
    return path


__all__ = [
    "SIZE_RULES",
    "CollectiveParams",
    "CommParams",
    "Constant",
    "ConstantTable",
    "CopyParams",
    "LinkKind",
    "PRESET_DIR",
    "PresetError",
    "SCENARIO_DIR",
    "SIZE_SCALED",
    "UNITS",
    "first_gpus",
    "list_calibrated",
    "list_presets",
    "preferred_preset",
    "list_scenarios",
    "load_preset_data",
    "parse_collective",
    "parse_comm",
    "parse_copy",
    "scenario_path",
]
