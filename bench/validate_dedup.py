"""The ``local_dedup`` reload of a multigpu record's ``dedup`` section, replayed in the simulator.

``bench/gpu/multigpu.py``'s ``dedup`` part reloads the same replicated bf16 state on every rank at once
(``state_bytes_per_rank`` in ``--tensors`` tensors, 64 by default), after a barrier and a ``gap_s`` pause
that follows the offload: with the ``local`` store, with ``local_dedup`` over replica groups of
``group_size`` consecutive ranks (pipelined: each piece is all-gathered once its H2D has landed), and
with ``local_dedup`` gathering once per layout (``segment_bytes`` larger than the slice). The slowest
rank's reload, median over the repeats, is recorded for each. :func:`predict_dedup` runs the same
store code on a simulated world with meta payloads and returns the same three figures.

What the simulated host is made of, and where each part comes from:

* the record's GPUs are the first ``world_size`` GPUs of the machine's preset as it is (``calibrated/h200-2x``
  for the two-H200 machine: NVLink 4 and NCCL's model of it, the driver's scrub, and each GPU on its own
  PCIe link, as ``nvidia-smi`` shows that machine), PCIe layout included: it comes from the topology, never
  from the record replayed (a preset whose GPUs share a PCIe switch, ``hgx-h200-8x``, predicts the shared
  uplink);
* the PCIe rate is the offload preset's host-to-device one (``pcie_gen5_x16_h2d_run1``, H200 run 1),
  as :mod:`sim.calibrate.calibration` simulates reloads;
* the store's host time of a reload (allocating its flat device buffers, ``store_reload_alloc`` per byte,
  H200 run 8) is added, as :func:`sim.calibrate.calibration.host_overheads` does.

Nothing here is fitted on the ``dedup`` section it is compared with (:func:`bench.validate.validate_dedup` refuses
a preset whose constants name it).
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: ``bench/gpu/multigpu.py --tensors`` default (a dedup row does not record it)
DEFAULT_TENSORS = 64
#: the figures compared: (label in :func:`predict_dedup`, field of the record's dedup row)
FIGURES = (("local", "local_reload_s"), ("dedup", "dedup_reload_s"), ("one_gather", "dedup_reload_one_gather_s"))


def predict_dedup(world_size: int, group_size: int, state_bytes: int, *, preset: str, offload_preset: str,
                  gap_s: float, tensors: int = DEFAULT_TENSORS, cycles: int = 2) -> dict[str, float]:
    """Predicted reload seconds (slowest rank, last cycle) of ``local``, ``dedup`` and ``one_gather``, and the
    pinned host bytes per rank of ``local`` and ``dedup`` (``host_bytes_local``, ``host_bytes_dedup``).

    ``preset``: the GPUs, NVLink and scrub; ``offload_preset``: the H2D rate and the store's reload host time.
    """
    import torch

    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy
    from sim.calibrate.calibration import host_overheads
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.machine.flows import FlowTransport
    from sim.machine.memory import TopologyMemory
    from sim.presets import first_gpus, load_preset_data
    from sim.machine.topology import Topology
    from sim.world import SimWorld

    if world_size % group_size:
        raise ValueError(f"group_size {group_size} does not divide world_size {world_size}")
    h2d = Topology.from_preset(offload_preset).constants.get("pcie_gen5_x16_h2d_run1")
    data = first_gpus(load_preset_data(preset), world_size)  # the machine as its preset describes it
    if h2d is not None:  # reloads at the measured host-to-device rate, as sim.calibrate.calibration simulates them
        for name in {lk["bandwidth"] for lk in data["node"]["links"] if lk["kind"] == "pcie"}:
            data["constants"][name] = dict(data["constants"][name], value=h2d.value / 1e9, unit="GB/s")
    topo = Topology(data, where=f"preset {preset!r}, its first {world_size} GPUs")
    dtype = torch.bfloat16
    per = state_bytes // dtype.itemsize // tensors
    host_s = host_overheads(offload_preset, tensors, per * tensors * dtype.itemsize)["reload_host_s"]
    mesh = MeshTopology((world_size // group_size, group_size), ("rep", "ddp"))
    out = {}
    for label in ("local", "dedup", "one_gather"):
        world = SimWorld(world_size, payload="meta", transport=FlowTransport(topo),
                         collective_cost=TopologyCollectiveCost(topo), memory=TopologyMemory(topo, record=False),
                         comm=NcclComm(topo), trace=False)

        async def run(rt, label=label):
            state = {f"w{i}": rt.alloc_device(per, dtype) for i in range(tensors)}
            if label == "local":
                store = OffloadStore(rt, backend="local")
            else:
                config = StoreConfig(segment_bytes=state_bytes + (1 << 20)) if label == "one_gather" else StoreConfig()
                store = OffloadStore(rt, backend="local_dedup", config=config, dedup=DedupConfig(
                    policy=ReplicaPolicy(overrides={"*": MeshReplica(mesh, ("ddp",))}),
                    groups=tuple(mesh.groups_over(["ddp"]))))
            store.attach_tensors("params", state, name="p")
            times: list = []
            for _ in range(cycles + 1):  # the first cycle pins and plans; the record leaves it out too
                await store.offload_async()
                await rt.synchronize()
                await rt.sleep(gap_s)
                t0 = rt.now()
                await store.reload_async()
                await rt.synchronize()
                times.append(rt.now() - t0)
            host = store.stats().host_pinned_bytes if label == "local" else store.backend.host_bytes()
            return times, host

        per_rank = world.run(run)
        out[label] = max(t[-1] for t, _ in per_rank) + host_s
        if label != "one_gather":
            out[f"host_bytes_{label}"] = max(h for _, h in per_rank)
    return out


def compare_dedup(record: Any, preset: str, offload_preset: str) -> list[tuple[str, float, float]]:
    """``(what, measured s, predicted s)`` for every figure of every row of ``record.dedup``
    (:func:`bench.validate.validate_dedup` checks the fit set and makes the rows)."""
    from sim.calibrate.records import RecordError

    out = []
    for i, row in enumerate(record.dedup):
        where = f"{record.name}.dedup[{i}]"
        try:
            g, state, gap = int(row["group_size"]), int(row["state_bytes_per_rank"]), float(row["gap_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: needs group_size, state_bytes_per_rank and gap_s ({exc})") from None
        if g < 1 or record.world_size % g:
            raise RecordError(f"{where}.group_size: {g} does not divide the record's world size {record.world_size}")
        pred = predict_dedup(record.world_size, g, state, preset=preset, offload_preset=offload_preset, gap_s=gap)
        for label, field in FIGURES:
            if row.get(field) is not None:
                out.append((f"dedup g={g} {label} reload", float(row[field]), pred[label]))
    return out


__all__ = ["DEFAULT_TENSORS", "FIGURES", "compare_dedup", "predict_dedup"]
