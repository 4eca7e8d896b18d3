"""Scenario files: what to simulate, validated with errors that name the field.

A scenario (JSON; schema in ``sim/schema/scenario.schema.json``, which
:func:`parse_scenario` checks first with ``jsonschema``; documented in docs/scenario.md) says which machine (a topology preset or an inline graph),
how many ranks and how they are arranged (mesh and process-group families),
what state each rank holds (a model preset or explicit tensors), how it leaves
the GPU (offload store backend or a TMS-style pause), what the process-group
lifecycle does with the groups (``pg_policy``), the RL step's other phases
(``workload``), how many steps, which faults to inject, the seed and whether
payloads are real bytes or meta tensors.

:func:`load_scenario` / :func:`parse_scenario` return a frozen
:class:`Scenario`; :func:`sim.scenarios.runner.run_scenario` runs it. Every problem is
a :class:`ScenarioError` whose message starts with the field's path, e.g.
``"workload.rollout_s: expected a number >= 0, got -1"``.
"""
from __future__ import annotations

from refimpl.cli_errors import CliInputError  # bad input: the CLI answers it with one line and exit 2

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from sim.machine.faults import FaultPlan, FaultPlanError
from sim.presets import PresetError, list_presets, load_preset_data, preferred_preset
from sim.presets.models import ARCHITECTURES, CATEGORIES, DTYPES, ModelConfig, TensorSpec, build_state
from sim.presets.schemas import check, check_fields
from sim.machine.topology import Topology

#: process-group policies a scenario may name ("none": no lifecycle, groups stay as they are)
PG_POLICIES = ("none", "destroy", "destroy_deferred", "paused_live", "suspend", "suspend_planned")
BACKENDS = ("local", "local_dedup", "tms")
PAYLOADS = ("real", "meta")
#: largest real payload a scenario may allocate (all ranks together); meta payloads are free
REAL_PAYLOAD_LIMIT = 1 << 30
#: default ``comm.peer_loss_s``: how long after a rank's process dies its peers' collectives fail (the closed
#: connections' errors reaching them). An assumed figure, not a measured one: a TCP reset and the error
#: surfacing in the collective take about a network round trip and a poll of the library's progress thread
PEER_LOSS_S = 1e-3

_TOP = {"name", "description", "topology", "world_size", "mesh", "groups", "model", "offload", "pg_policy",
        "lifecycle", "workload", "steps", "faults", "seed", "payload", "transport", "comm"}


class ScenarioError(CliInputError):
    """A scenario is invalid; the message starts with the path of the offending field."""


@dataclass(frozen=True)
class GroupFamily:
    """Process groups over the ranks that vary along ``dims`` of the mesh (one group per other coordinate)."""

    name: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class OffloadConfig:
    """How trainer state leaves the GPU in ``sleep`` and comes back in ``wake_up``."""

    backend: str = "local"
    include: tuple[str, ...] = ("params", "grads", "optimizer")
    tms_pause_s: float = 0.0
    tms_resume_s: float = 0.0
    #: mesh dims over which every rank's state is replicated (``local_dedup`` stores it 1/N per rank)
    replicate_over: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExportConfig:
    """update_weights' export: bucketed all-gather of the params over a group family, then an IPC hand-off."""

    group: str
    bucket_bytes: int = 512 << 20
    ipc_s: float = 0.0
    #: families the export also runs a collective on (Relax broadcasts the expert weights over the expert-parallel
    #: group before its TP all-gather): on a rebuilt group that first collective pays the lazy NCCL init
    also_uses: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkloadConfig:
    """The RL step's phases other than offload/reload and the lifecycle."""

    train_s: float = 0.0
    rollout_s: float = 0.0
    rollout_memory_fraction: float = 0.0
    rollout_memory_gib: float = 0.0
    #: the training step runs a collective on every group (True), on none (False), or on the families named
    #: (the groups a job's training uses: only they have NCCL communicators, torch creating them lazily)
    touch_groups: bool | tuple[str, ...] = True
    export: ExportConfig | None = None


@dataclass(frozen=True)
class LifecycleSettings:
    """Settings of the process-group lifecycle (see refimpl.comm.lifecycle.LifecycleConfig)."""

    cooldown_s: float = 2.0
    two_phase: bool = True
    #: groups of fewer ranks stay outside the lifecycle, created once and never destroyed (Relax's
    #: ReloadableProcessGroup wraps only the NCCL groups of two or more ranks); 1: every group goes through it
    min_ranks: int = 1


@dataclass(frozen=True)
class Scenario:
    """A validated scenario; build with :func:`parse_scenario` or :func:`load_scenario`."""

    name: str
    description: str
    topology: Mapping[str, Any]
    topology_name: str
    nodes: int | None
    world_size: int
    mesh: tuple[tuple[str, int], ...]
    groups: tuple[GroupFamily, ...]
    model: ModelConfig
    offload: OffloadConfig
    pg_policy: str
    lifecycle: LifecycleSettings
    workload: WorkloadConfig
    steps: int
    faults: FaultPlan
    seed: int
    payload: str
    streams: str = "per_rank"
    lazy_init: bool = True
    #: the runtime wakes NCCL's proxy thread in a destroy (TorchRuntime's default); False: each destroy of an
    #: initialised communicator waits for the proxy's next poll, as a framework's own destroy_process_group does
    wake_proxies: bool = True
    #: collectives and group creation time out after the group's timeout_s, as torch's watchdog does (False: a hang
    #: stops the run as a deadlock with its waits-for cycle)
    watchdog: bool = True
    #: seconds after a rank crashes at which its peers' collectives on its groups fail, its connections closed
    #: (None: never, a crashed rank is waited for as a hung one; see sim.rendezvous)
    peer_loss_s: float | None = PEER_LOSS_S
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    topo: Topology | None = field(default=None, compare=False, repr=False)


# --------------------------------------------------------------------------- field readers


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _obj(raw: Any, where: str, allowed: set[str]) -> Mapping[str, Any]:
    # the schema already refused unknown fields; this keeps the reader honest if the two drift apart
    return check_fields(raw, where, (), sorted(allowed), ScenarioError)


def _int(raw: Mapping[str, Any], key: str, where: str, default: int | None = None, *, lo: int = 0) -> int:
    if key not in raw:
        if default is None:
            raise ScenarioError(f"{_path(where, key)}: required")
        return default
    v = raw[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ScenarioError(f"{_path(where, key)}: expected an integer >= {lo}, got {v!r}")
    return v


def _num(raw: Mapping[str, Any], key: str, where: str, default: float, *, lo: float = 0.0, hi: float = math.inf) -> float:
    if key not in raw:
        return default
    v = raw[key]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or not lo <= v <= hi:
        bound = f"between {lo} and {hi}" if math.isfinite(hi) else f">= {lo}"
        raise ScenarioError(f"{_path(where, key)}: expected a number {bound}, got {v!r}")
    return float(v)


def _choice(raw: Mapping[str, Any], key: str, where: str, options: tuple[str, ...], default: str) -> str:
    v = raw.get(key, default)
    if v not in options:
        raise ScenarioError(f"{_path(where, key)}: {v!r} is not one of {list(options)}")
    return v


def _bool(raw: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = raw.get(key, default)
    if not isinstance(v, bool):
        raise ScenarioError(f"{_path(where, key)}: expected true or false, got {v!r}")
    return v


# --------------------------------------------------------------------------- sections


def _topology(raw: Any) -> tuple[Mapping[str, Any], str, int | None]:
    if isinstance(raw, str):
        raw = {"preset": raw}
    if not isinstance(raw, Mapping):
        raise ScenarioError("topology: expected a preset name, {\"preset\": name, \"nodes\": n} or a topology object")
    if "preset" in raw:
        _obj(raw, "topology", {"preset", "nodes", "calibrated"})
        calibrated = raw.get("calibrated", True)
        # a machine's calibrated variant where one is shipped (measured constants beat datasheet ones), unless
        # the scenario asks for the datasheet preset itself
        name = preferred_preset(raw["preset"]) if calibrated else raw["preset"]
        try:
            data = load_preset_data(name)
        except PresetError:
            raise ScenarioError(f"topology.preset: unknown preset {raw['preset']!r}; built-in: {list_presets()}") from None
        nodes = _int(raw, "nodes", "topology", 1, lo=1) if "nodes" in raw else None
        return data, str(name), nodes
    if "constants" not in raw:
        raise ScenarioError("topology: an inline topology needs 'constants', 'node', 'copy', 'collective' and 'comm'")
    return raw, str(raw.get("name", "inline")), None


def _build_topology(data: Mapping[str, Any], name: str, nodes: int | None, world_size: int) -> Topology:
    """Build (and so validate) the topology; a multi-node preset without ``nodes`` grows to fit the ranks."""
    data = dict(data)
    if nodes is not None:
        data["nodes"] = nodes
    try:
        topo = Topology.from_dict(data, where="topology")
        if topo.num_gpus < world_size and nodes is None and data.get("fabric") is not None:
            data["nodes"] = math.ceil(world_size / topo.gpus_per_node)
            topo = Topology.from_dict(data, where="topology")
    except PresetError as exc:
        raise ScenarioError(str(exc)) from None
    if topo.nodes > 1 and data.get("fabric") is None and world_size > topo.gpus_per_node:
        raise ScenarioError(
            f"topology.nodes: {topo.nodes} nodes of {name!r} have no NICs, so ranks on different nodes cannot "
            f"communicate; use a preset with a network fabric such as hgx-h200-8x-ib, or world_size <= "
            f"{topo.gpus_per_node}"
        )
    if topo.num_gpus < world_size:
        hint = (f"set \"nodes\": {math.ceil(world_size / topo.gpus_per_node)}" if data.get("fabric") is not None
                else "use a multi-node preset such as hgx-h200-8x-ib")
        raise ScenarioError(f"world_size: {world_size} ranks do not fit topology {name!r} with {topo.num_gpus} GPUs; {hint}")
    return topo


def _mesh(raw: Any, world_size: int) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return (("dp", world_size),)
    if not isinstance(raw, Mapping) or not raw:
        raise ScenarioError("mesh: expected an object of dimension name -> size, outermost first, e.g. {\"dp\": 2, \"tp\": 2}")
    dims = []
    for k, v in raw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ScenarioError(f"mesh.{k}: expected a size >= 1, got {v!r}")
        dims.append((str(k), v))
    if math.prod(v for _, v in dims) != world_size:
        raise ScenarioError(f"mesh: sizes {dict(dims)} multiply to {math.prod(v for _, v in dims)}, not world_size {world_size}")
    return tuple(dims)


def _groups(raw: Any, mesh: tuple[tuple[str, int], ...]) -> tuple[GroupFamily, ...]:
    names = [d for d, _ in mesh]
    if raw is None:
        return tuple(GroupFamily(d, (d,)) for d, n in mesh if n > 1)
    if not isinstance(raw, list):
        raise ScenarioError("groups: expected a list of {name, dims}")
    out, seen = [], set()
    for i, g in enumerate(raw):
        w = f"groups[{i}]"
        g = _obj(g, w, {"name", "dims"})
        name = g.get("name")
        if not isinstance(name, str) or not name.isidentifier():
            raise ScenarioError(f"{w}.name: expected an identifier-like name, got {name!r}")
        if name in seen:
            raise ScenarioError(f"{w}.name: duplicate group family {name!r}")
        seen.add(name)
        dims = g.get("dims")
        if not isinstance(dims, list) or not all(d in names for d in dims):
            raise ScenarioError(f"{w}.dims: expected a list of mesh dimensions {names}, got {dims!r}")
        out.append(GroupFamily(name, tuple(dims)))
    return tuple(out)


def _model(raw: Any, world_size: int) -> ModelConfig:
    raw = _obj(raw, "model", {"preset", "tensors", "state", "fsdp", "tp", "ep", "scale"})
    state = raw.get("state", ["params", "grads", "optimizer"])
    if not isinstance(state, list) or not all(s in ("params", "grads", "optimizer") for s in state):
        raise ScenarioError(f"model.state: expected a list drawn from ['params', 'grads', 'optimizer'], got {state!r}")
    kw: dict[str, Any] = {
        "state": tuple(state),
        "fsdp": _int(raw, "fsdp", "model", 1, lo=1),
        "tp": _int(raw, "tp", "model", 1, lo=1),
        "ep": _int(raw, "ep", "model", 1, lo=1),
        "scale": _num(raw, "scale", "model", 1.0, lo=1e-12, hi=1.0),
    }
    if ("preset" in raw) == ("tensors" in raw):
        raise ScenarioError("model: give exactly one of 'preset' (a named model) or 'tensors' (an explicit list)")
    if "preset" in raw:
        if raw["preset"] not in ARCHITECTURES:
            raise ScenarioError(f"model.preset: {raw['preset']!r} is not one of {sorted(ARCHITECTURES)}")
        return ModelConfig(preset=raw["preset"], **kw)
    tensors = raw["tensors"]
    if not isinstance(tensors, list) or not tensors:
        raise ScenarioError("model.tensors: expected a non-empty list of {name, shape, dtype, category}")
    specs, names = [], set()
    for i, t in enumerate(tensors):
        w = f"model.tensors[{i}]"
        t = _obj(t, w, {"name", "shape", "dtype", "category"})
        name, shape = t.get("name"), t.get("shape")
        if not isinstance(name, str) or not name or name in names:
            raise ScenarioError(f"{w}.name: expected a unique non-empty name, got {name!r}")
        names.add(name)
        if not isinstance(shape, list) or not shape or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in shape):
            raise ScenarioError(f"{w}.shape: expected a list of positive integers, got {shape!r}")
        dtype = t.get("dtype", "bfloat16")
        if dtype not in DTYPES:
            raise ScenarioError(f"{w}.dtype: {dtype!r} is not one of {sorted(DTYPES)}")
        cat = t.get("category", "params")
        if cat not in CATEGORIES:
            raise ScenarioError(f"{w}.category: {cat!r} is not one of {list(CATEGORIES)}")
        specs.append(TensorSpec(name, tuple(shape), DTYPES[dtype], cat))
    return ModelConfig(tensors=tuple(specs), **kw)


#: mesh dim names read as data-parallel replicas when ``offload.replicate_over`` is not given
REPLICA_DIM_NAMES = ("dp", "ddp", "hsdp", "replicate", "replica")


def _offload(raw: Any, mesh: tuple[tuple[str, int], ...], model: ModelConfig, world_size: int) -> OffloadConfig:
    raw = _obj(raw if raw is not None else {}, "offload",
               {"backend", "include", "tms_pause_s", "tms_resume_s", "replicate_over"})
    include = raw.get("include", ["params", "grads", "optimizer"])
    if not isinstance(include, list) or not include or not all(c in CATEGORIES for c in include):
        raise ScenarioError(f"offload.include: expected a non-empty list drawn from {list(CATEGORIES)}, got {include!r}")
    backend = _choice(raw, "backend", "offload", BACKENDS, "local")
    replicate = _replicate_over(raw, backend, mesh, model, world_size)
    return OffloadConfig(
        backend=backend,
        include=tuple(include),
        tms_pause_s=_num(raw, "tms_pause_s", "offload", 0.0),
        tms_resume_s=_num(raw, "tms_resume_s", "offload", 0.0),
        replicate_over=replicate,
    )


def _replicate_over(raw: Mapping[str, Any], backend: str, mesh: tuple[tuple[str, int], ...], model: ModelConfig,
                    world_size: int) -> tuple[str, ...]:
    """The mesh dims the state is replicated over: declared, or inferred from the model's parallelism.

    The model shards its state over ``fsdp x tp x ep`` ranks, so ``world_size / that`` ranks hold each
    shard; those replicas lie along the mesh dims named like data parallelism (:data:`REPLICA_DIM_NAMES`)
    whose sizes multiply to that count. Anything else must be declared.
    """
    names = [d for d, _ in mesh]
    sizes = dict(mesh)
    if "replicate_over" in raw:
        dims = raw["replicate_over"]
        if not isinstance(dims, list) or not all(d in names for d in dims) or len(set(dims)) != len(dims):
            raise ScenarioError(f"offload.replicate_over: expected a list of distinct mesh dimensions {names}, "
                                f"got {dims!r}")
        if backend != "local_dedup":
            raise ScenarioError(f"offload.replicate_over: only the local_dedup backend deduplicates replicas; "
                                f"the backend is {backend!r}")
        if dims and math.prod(sizes[d] for d in dims) * model.fsdp * model.tp * model.ep > world_size:
            raise ScenarioError(
                f"offload.replicate_over: {dims} ({math.prod(sizes[d] for d in dims)} replicas) times the model's "
                f"sharding fsdp x tp x ep = {model.fsdp * model.tp * model.ep} is more than world_size {world_size}"
            )
        return tuple(dims)
    if backend != "local_dedup":
        return ()
    shards = model.fsdp * model.tp * model.ep
    replicas, rem = divmod(world_size, shards)
    if rem or replicas <= 1:
        raise ScenarioError(
            f"offload.backend: 'local_dedup' needs state held by several ranks, but the model is sharded over "
            f"fsdp x tp x ep = {shards} of {world_size} ranks, so no rank's state has a replica; declare "
            f"offload.replicate_over (mesh dims {names}) or use backend 'local'"
        )
    dims = [d for d in names if d in REPLICA_DIM_NAMES]
    if math.prod(sizes[d] for d in dims) != replicas:
        raise ScenarioError(
            f"offload.replicate_over: the model's sharding (fsdp x tp x ep = {shards}) leaves {replicas} replicas "
            f"of each rank's state, but the mesh dims named like data parallelism ({dims or 'none'}, sizes "
            f"{[sizes[d] for d in dims]}) do not multiply to {replicas}; declare the dims to replicate over"
        )
    return tuple(dims)


def _touch(raw: Mapping[str, Any], w: str, families: tuple[GroupFamily, ...]) -> bool | tuple[str, ...]:
    """``workload.touch_groups``: true, false, or a list of group family names."""
    v = raw.get("touch_groups", True)
    if isinstance(v, list):
        names = {f.name for f in families}
        bad = [x for x in v if x not in names]
        if bad or not v:
            raise ScenarioError(f"{w}.touch_groups: {bad or v!r} not group families {sorted(names)} (true, false, or "
                                "a non-empty list of families)")
        return tuple(v)
    return _bool(raw, "touch_groups", w, True)


def _workload(raw: Any, families: tuple[GroupFamily, ...]) -> WorkloadConfig:
    w = "workload"
    raw = _obj(raw if raw is not None else {}, w, {"train_s", "rollout_s", "rollout_memory_fraction",
                                                  "rollout_memory_gib", "touch_groups", "export"})
    if "rollout_memory_fraction" in raw and "rollout_memory_gib" in raw:
        raise ScenarioError(f"{w}: give rollout_memory_fraction or rollout_memory_gib, not both")
    export = None
    if raw.get("export") is not None:
        e = _obj(raw["export"], f"{w}.export", {"group", "bucket_bytes", "ipc_s", "also_uses"})
        names = [f.name for f in families]
        also = tuple(e.get("also_uses", ()))
        for key, got in (("group", [e.get("group")]), ("also_uses", also)):
            for g in got:
                if g not in names:
                    raise ScenarioError(f"{w}.export.{key}: {g!r} is not a group family {names}")
        export = ExportConfig(e["group"], _int(e, "bucket_bytes", f"{w}.export", 512 << 20, lo=1),
                              _num(e, "ipc_s", f"{w}.export", 0.0), also)
    return WorkloadConfig(
        train_s=_num(raw, "train_s", w, 0.0),
        rollout_s=_num(raw, "rollout_s", w, 0.0),
        rollout_memory_fraction=_num(raw, "rollout_memory_fraction", w, 0.0, hi=1.0),
        rollout_memory_gib=_num(raw, "rollout_memory_gib", w, 0.0),
        touch_groups=_touch(raw, w, families),
        export=export,
    )


def _check_fault_links(faults: FaultPlan, topo: Topology) -> None:
    """A slow_link fault must name a link or element of the scenario's topology (``faults[i].link``)."""
    if not any(f.link for f in faults.faults):
        return
    from sim.machine.faults import check_link
    from sim.machine.flows import FlowTransport

    transport = FlowTransport(topo)
    for i, f in enumerate(faults.faults):
        if f.link:
            try:
                check_link(f.link, transport, f"faults[{i}].link")
            except FaultPlanError as exc:
                raise ScenarioError(str(exc)) from None


def parse_scenario(raw: Any) -> Scenario:
    """Validate a parsed scenario object; raises :class:`ScenarioError` naming the bad field.

    First against ``sim/schema/scenario.schema.json`` (types, ranges, choices, required and unknown
    fields; :func:`sim.presets.schemas.check`), then in code for what a schema cannot express (a preset that
    exists, a mesh that multiplies to the world size, groups over mesh dims, faults on ranks and links
    that exist, a real payload that fits, replicas for local_dedup).
    """
    check(raw, "scenario", ScenarioError)
    raw = _obj(raw, "", _TOP)
    world_size = _int(raw, "world_size", "", None, lo=1)
    topology, topo_name, nodes = _topology(raw.get("topology", "hgx-h200-8x"))
    mesh = _mesh(raw.get("mesh"), world_size)
    families = _groups(raw.get("groups"), mesh)
    model = _model(raw.get("model", {"preset": "dense-7b", "fsdp": world_size}), world_size)
    payload = _choice(raw, "payload", "", PAYLOADS, "meta")
    if payload == "real":
        total = sum(t.nbytes for t in build_state(model)) * world_size
        if total > REAL_PAYLOAD_LIMIT:
            raise ScenarioError(
                f"payload: 'real' would allocate {total / 2**30:.1f} GiB of CPU tensors over {world_size} ranks "
                f"(limit {REAL_PAYLOAD_LIMIT / 2**30:.0f} GiB); use payload 'meta' or shrink with model.scale"
            )
    pg_policy = _choice(raw, "pg_policy", "", PG_POLICIES, "none")
    lc = _obj(raw.get("lifecycle", {}), "lifecycle", {"cooldown_s", "two_phase", "min_ranks"})
    lifecycle = LifecycleSettings(_num(lc, "cooldown_s", "lifecycle", 2.0), _bool(lc, "two_phase", "lifecycle", True),
                                  _int(lc, "min_ranks", "lifecycle", 1, lo=1))
    transport = _obj(raw.get("transport", {}), "transport", {"streams"})
    comm = _obj(raw.get("comm", {}), "comm", {"lazy_init", "watchdog", "wake_proxies", "peer_loss_s"})
    peer_loss_s = comm.get("peer_loss_s", PEER_LOSS_S)
    if peer_loss_s is not None:
        peer_loss_s = _num(comm, "peer_loss_s", "comm", PEER_LOSS_S)
    try:
        faults = FaultPlan.from_json(raw.get("faults", []), "faults")
    except FaultPlanError as exc:
        raise ScenarioError(str(exc)) from None
    for i, f in enumerate(faults.faults):
        if f.ranks is not None and any(r >= world_size for r in f.ranks):
            raise ScenarioError(f"faults[{i}].ranks: {list(f.ranks)} names ranks outside world_size {world_size}")
    name = raw.get("name", "unnamed")
    if not isinstance(name, str) or not name:
        raise ScenarioError(f"name: expected a non-empty string, got {name!r}")
    topo = _build_topology(topology, topo_name, nodes, world_size)
    _check_fault_links(faults, topo)
    return Scenario(
        name=name,
        description=str(raw.get("description", "")),
        topology=topology,
        topology_name=topo_name,
        nodes=nodes,
        world_size=world_size,
        mesh=mesh,
        groups=families,
        model=model,
        offload=_offload(raw.get("offload"), mesh, model, world_size),
        pg_policy=pg_policy,
        lifecycle=lifecycle,
        workload=_workload(raw.get("workload"), families),
        steps=_int(raw, "steps", "", 1, lo=1),
        faults=faults,
        seed=_int(raw, "seed", "", 0),
        payload=payload,
        streams=_choice(transport, "streams", "transport", ("per_rank", "per_kind"), "per_rank"),
        lazy_init=_bool(comm, "lazy_init", "comm", True),
        wake_proxies=_bool(comm, "wake_proxies", "comm", True),
        watchdog=_bool(comm, "watchdog", "comm", True),
        peer_loss_s=peer_loss_s,
        raw=raw,
        topo=topo,
    )


def load_scenario(path_or_name: str | Path) -> Scenario:
    """Load a scenario from a JSON or YAML file, or a shipped example by name (``"default"``)."""
    from sim.scenarios.scenario_files import ScenarioFileError, read_document  # JSON/YAML, UTF-8 checked, one-line errors

    try:
        raw = read_document(path_or_name)
    except ScenarioFileError as exc:
        raise ScenarioError(str(exc)) from None
    return parse_scenario(raw)


__all__ = [
    "BACKENDS",
    "ExportConfig",
    "GroupFamily",
    "LifecycleSettings",
    "OffloadConfig",
    "PEER_LOSS_S",
    "PG_POLICIES",
    "REAL_PAYLOAD_LIMIT",
    "REPLICA_DIM_NAMES",
    "Scenario",
    "ScenarioError",
    "WorkloadConfig",
    "load_scenario",
    "parse_scenario",
]
