"""The colocated RL step's switch on N GPUs, predicted from a one-GPU record: the earlier mechanism and the current one.

Theory of operation
-------------------
The prediction of one GPU (:func:`sim.calibrate.switch_modes.predict_modes`: the store's copies simulated at the
record's line rates, the real :class:`~refimpl.comm.PGLifecycle` on a simulated world, the record's measured compute
and host work) is made for one rank of N: :func:`per_rank_record` takes a one-GPU record of ``bench.rl`` (the step
with ``--offload-in-backward --sync-first --mode streamed``) and gives the record one rank of an N-rank mesh would
write, as far as the inputs of the prediction go: the state each rank offloads and copies early divided by the
mesh's shard size (FSDP2 shards every parameter and its AdamW moments over the shard dimension; an HSDP mesh
replicates them over the replicate dimension), the world size, the mesh. What it keeps from the one-GPU record, and
so assumes: each rank's training step and rollout last what one GPU's did (the same batch per rank, FSDP2's
collectives under its compute); each rank's host link copies at the one-GPU record's line rates (``link_share``
divides them where ranks share one host uplink); the store's host work per rank is the one-GPU figure (each rank
holds a shard of every parameter: as many tensors).

Each mechanism is then composed from the same parts (docs/comm.md, "The model of each term of the N-GPU step",
says each term's formula and source):

* ``old``: the RL step before the switch on N GPUs was reworked (``--no-managed-mesh --no-rebuild-ahead
  --no-sync-in-backward --no-gather-in-rollout-dtype``): the lifecycle manages one group of every rank
  (``trainer.dp``; the mesh's own groups stay up through the rollout), the weight sync gathers every parameter in
  fp32 after the step, and the reload phase issues the reload, then resumes inline: the rebuild and the warm-up
  (the communicator's creation) of ``trainer.dp``. This is exactly the one-GPU composition
  (:func:`sim.calibrate.switch_modes._compose`, mode ``streamed``, ``sync_first``) on the per-rank record.
* ``new`` (the defaults): the mesh's groups (one per subgroup of each dimension) are the lifecycle's; the pause
  destroys this rank's member groups; the resume (cooldown's rest, a rebuild per group, a warm-up collective per
  member group) starts on a thread at the reload phase's start and the next forward joins it; the reload phase is
  the issue of the copies alone; the weight sync runs per unit in the backward (each unit's params cast to the
  rollout's dtype and gathered on a side stream right after its optimizer step), so the sync phase pays only what
  of that chain outlasts the step. The join pays what of the thread outlasts the reload phase, plus one agreement
  on the control group; the streamed reload's copies run on from the reload phase's end, and what of them
  outlasts the join and the step's stretch before its first wait is paid too.
* ``forward_from_rollout`` (the defaults with ``--sync-in-backward``): as ``new``, but the first training step after
  a switch fills FSDP2's all-gathers from the rollout's unsharded copy, so its forward runs no collective and the
  resume thread is joined right before ``loss.backward()``: the join pays what of the thread outlasts the issue and
  the forward (``max(0, thread - issue - F x T)``, ``F`` = :data:`FORWARD_SHARE` of the step ``T``), plus one
  agreement. The streamed reload's copies are then needed only from the backward on (each unit's optimizer step);
  the stream's wait keeps ``new``'s rule (what of the copies outlasts the issue, the join and the step's stretch
  to its first wait): an upper bound, since the forward reads none of them. The fills themselves (device copies
  of each unit's full parameters in the rollout's dtype, forward and backward re-gather) are added whole
  (:func:`rollout_fill_s`), another upper bound.

In ``new`` and ``forward_from_rollout`` the step ``T`` the stretches are shares of is the record's plain step
(:func:`plain_step_s`: a training step after no switch), not the step after a switch, which already holds what
the switch left to it (before the seventh revision of the committed predictions it was that step: at one rank the
composition then fell from 0.89-0.96 x of an H200 at batch 32 to 0.70 x of an H100 at batch 16, where the stream's
wait is most of the cost; with the plain step 1.08-1.13 x and 0.97 x). ``old`` keeps the one-GPU composition.

``new`` and ``forward_from_rollout`` also pay the early copies' content check (:func:`content_check_s`: two digests
of every byte a rank copies early at the digest's measured rate, counted whole), which ``old`` predates.

Inputs only from records that are not the ones the predictions are checked against (:data:`CHECKED`):
:func:`check_inputs_blind` refuses such a record as input and any constant of the presets or
:data:`~sim.calibrate.colocated.LOOP_CONSTANTS` whose source names one.

    python -m sim.calibrate.switch_ngpu ONE_GPU_RECORD.json --ranks 2,4,8 [--meshes fsdp,hsdp] [--json]
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import statistics
from pathlib import Path
from typing import Any, Iterable

from sim.calibrate.records import HELD_OUT, VALIDATION_SET, RecordError
from sim.presets import SIZE_RULES

log = logging.getLogger(__name__)

#: the mechanisms a prediction covers (module docstring)
MECHANISMS = ("old", "new", "forward_from_rollout")
#: what a rank offloads on N GPUs: the one-GPU record's state sharded over the shard size (the same model), or the
#: one-GPU record's bytes per rank (a model as many times larger as the shard size: what users run on more GPUs)
BYTES_PER_RANK = ("sharded", "one-gpu")
#: the mesh kinds: FSDP2 over every rank (``--shard N``), HSDP replicate x shard (``--shard HSDP_SHARD``)
MESHES = ("fsdp", "hsdp")
#: the shard size of an HSDP mesh (the RL step's ``--shard`` default)
HSDP_SHARD = 2
#: the bytes of one parameter in the rollout's dtype (bf16) and in the trainer's (fp32)
ROLLOUT_PARAM_BYTES, TRAIN_PARAM_BYTES = 2, 4
#: bytes per parameter an early copy moves (fp32 params and two AdamW moments)
EARLY_BYTES_PER_PARAM = 12
#: the forward's share of a training step (the stretch before ``loss.backward()``, where the forward from the rollout's
#: copy joins the resume thread): FSDP2's first ``FSDP::pre_backward`` at 54.56 ms of the 200.3 ms plain step whose
#: first post-backward gives :data:`~sim.calibrate.switch_modes.FIRST_WAIT_SHARE` (H200, :data:`FORWARD_SHARE_TRACE`;
#: :func:`forward_share_of_trace` reads it). The same profile as that share, and the only one with the step's
#: phases on the device: the steady profile of 2026-12-01 times offloads and reloads, not the step's forward. It
#: is a plain step of one GPU (no all-gather waits); the join is on the host, which in that host-bound step runs
#: 1 ms ahead of the device (the forward's last kernel ends at 53.61 ms)
FORWARD_SHARE = 54.56 / 200.3
#: how many times the first training step after a switch fills a unit's all-gather from the rollout's copy, in
#: backward order (the head, each layer, the root): twice (its forward, and its backward's re-gather, FSDP2
#: resharding after the forward) but the root's once (FSDP2 keeps the root unsharded after its forward)
FILL_PASSES_NON_ROOT, FILL_PASSES_ROOT = 2, 1
#: the torch profiler trace :data:`FORWARD_SHARE` is read from
FORWARD_SHARE_TRACE = "bench/results/2026-12-02-h200-streamed-copy-engine/profile_unpaced/profile_train_plain_4.json.gz"
#: the records the N-GPU predictions are checked against, and the measurements of the same step on several GPUs to
#: come: none may feed an input (:func:`check_inputs_blind`). The first is the 2 x H200 step of 2026-12-04, its
#: figures transcribed; everything validation scores is scored too
CHECKED: tuple[str, ...] = (
    "bench/results/2026-12-04-h200x2-from-gpu-md/",
    *HELD_OUT,
    *VALIDATION_SET,
)
#: the measured 2-GPU switch of the earlier mechanism against the copies at line (the checked record)
CHECKED_FIGURE = "bench/results/2026-12-04-h200x2-from-gpu-md/rl-step-2026-12-04-h200x2.json"


def forward_share_of_trace(path: str | Path) -> float:
    """The forward's share of the training step a torch profiler trace (chrome JSON, gzipped or not) holds: the
    first ``FSDP::pre_backward`` annotation's start from the trace's first event, over the trace's span."""
    import gzip

    p = Path(path)
    with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
        events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
    if not events:
        raise RecordError(f"{p}: no complete events in the trace")
    t0 = min(e["ts"] for e in events)
    t1 = max(e["ts"] + e.get("dur", 0) for e in events)
    starts = [e["ts"] for e in events if e.get("name") == "FSDP::pre_backward" and e.get("cat") == "user_annotation"]
    if not starts or t1 <= t0:
        raise RecordError(f"{p}: no FSDP::pre_backward annotation (a torch.profiler "
                          "trace of one FSDP2 training step)")
    return (min(starts) - t0) / (t1 - t0)


def mesh_shape(kind: str, ranks: int, hsdp_shard: int = HSDP_SHARD) -> tuple[int, int]:
    """(replicate, shard) of a mesh of ``kind`` over ``ranks`` ranks; refuses a shape the RL step cannot make."""
    if kind not in MESHES:
        raise ValueError(f"mesh must be one of {MESHES}, got {kind!r}")
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if kind == "fsdp":
        return 1, ranks
    if hsdp_shard < 1 or ranks % hsdp_shard or ranks == hsdp_shard:
        raise ValueError(f"an HSDP mesh of {ranks} ranks needs a shard size that divides it and leaves a replicate "
                         f"dimension of 2 or more (got shard {hsdp_shard}); on {ranks} ranks use mesh 'fsdp'")
    return ranks // hsdp_shard, hsdp_shard


def mesh_groups(replicate: int, shard: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The mesh's groups as the RL step makes them (``build_mesh_groups``): one per subgroup of each dimension of
    more than one rank, every rank making all of them; rank ``r * shard + s`` is replicate ``r``, shard ``s``. On one
    rank the mesh is one dimension of one rank (``mesh_layout``) and its one group has one rank."""
    if replicate == shard == 1:
        return (("trainer.mesh.shard0", (0,)),)
    out = []
    if replicate > 1:
        out += [(f"trainer.mesh.replicate{s}", tuple(r * shard + s for r in range(replicate))) for s in range(shard)]
    if shard > 1:
        out += [(f"trainer.mesh.shard{r}", tuple(r * shard + s for s in range(shard))) for r in range(replicate)]
    return tuple(out)


_SCALED_STEP_KEYS = ("offload_bytes", "params_bytes", "reload_bytes_last", "early_copy_bytes", "early_reused_bytes")


def per_rank_record(rec: dict[str, Any], ranks: int, shard: int, *, link_share: int = 1,
                    bytes_per_rank: str = "sharded") -> dict[str, Any]:
    """The one-GPU record ``rec`` as one rank of ``ranks`` (the state sharded over ``shard`` ranks) would give the
    prediction's inputs: bytes per rank divided by ``shard`` (``bytes_per_rank="one-gpu"``: not divided, a model
    ``shard`` times larger), ``world_size`` and ``mesh`` set, the line rates divided by ``link_share`` (ranks
    copying at once through one host uplink); everything else as the record has it."""
    if int(rec.get("world_size", 1)) != 1:
        raise RecordError(f"the input must be a one-GPU record (world_size 1), got world_size {rec.get('world_size')}")
    if not rec.get("offload_in_backward") or not rec.get("early_units_bytes"):
        raise RecordError("the input record must have run with --offload-in-backward (its early_units_bytes)")
    if ranks % shard:
        raise ValueError(f"shard {shard} must divide ranks {ranks}")
    if link_share < 1:
        raise ValueError(f"link_share must be >= 1, got {link_share}")
    if bytes_per_rank not in BYTES_PER_RANK:
        raise ValueError(f"bytes_per_rank must be one of {BYTES_PER_RANK}, got {bytes_per_rank!r}")
    div = shard if bytes_per_rank == "sharded" else 1
    r = json.loads(json.dumps(rec))
    r["world_size"] = ranks
    r["mesh"] = [ranks // shard, shard]
    for s in r.get("steps") or []:
        for k in _SCALED_STEP_KEYS:
            if s.get(k) is not None:
                s[k] = s[k] / div
    r["early_units_bytes"] = [b / div for b in rec["early_units_bytes"]]
    r["line"] = {k: v / link_share for k, v in (rec.get("line") or {}).items()}
    return r


def unit_tensors(rec: dict[str, Any]) -> list[int]:
    """Parameters (tensors) per FSDP unit in backward order, for the record's model: the head one, each decoder layer
    the same share, the root (embeddings, final norm) two; read from ``initial_sync.tensors`` and the unit count."""
    n = len(rec["early_units_bytes"])
    tensors = int(rec.get("initial_sync", {}).get("tensors", 0))
    layers = n - 2
    if layers < 1 or (tensors - 3) % layers:
        raise RecordError(f"cannot split {tensors} parameters over {n} units (a head, {layers} layers, a root)")
    return [1, *[(tensors - 3) // layers] * layers, 2]


def sync_in_backward_units_s(rec_rank: dict[str, Any], shard: int, per_tensor_s: float,
                             preset: str | None = None) -> list[float]:
    """Seconds each unit's weight sync takes on the side stream, in backward order: its parameters x the per-tensor
    gather time plus the bytes this rank receives (``(shard - 1) / shard`` of the unit's full params in the rollout's
    dtype) at the NVLink rate of ``preset`` (default :data:`~sim.calibrate.colocated.MULTI_PRESET`)."""
    from sim.calibrate.colocated import MULTI_PRESET, gather_bytes_s

    out = []
    for b, t in zip(rec_rank["early_units_bytes"], unit_tensors(rec_rank)):
        params_rank = b / EARLY_BYTES_PER_PARAM * ROLLOUT_PARAM_BYTES  # this rank's shard, in the rollout's dtype
        out.append(t * per_tensor_s + gather_bytes_s(params_rank, shard, preset or MULTI_PRESET))
    return out


def rollout_fill_s(rec_rank: dict[str, Any], shard: int, preset: str | None = None, logprob_pass: bool = False) -> float:
    """Seconds the first training step after a switch spends filling its all-gathers from the rollout's copy: each
    fill copies the unit's full parameters in the rollout's dtype (every rank's chunk, ``shard`` x this rank's
    shard) device to device at the GPU's copy rate of ``preset`` (default
    :data:`~sim.calibrate.colocated.MULTI_PRESET`), :data:`FILL_PASSES_NON_ROOT` times a unit and
    :data:`FILL_PASSES_ROOT` for the root (the last unit in backward order), each once more with a log-prob pass
    before the step (``logprob_pass``). Counted whole on the step's path: an upper bound, since FSDP2 issues them on
    its all-gather stream ahead of the compute that needs them."""
    from sim.calibrate.colocated import MULTI_PRESET
    from sim.machine.topology import Topology

    units = rec_rank["early_units_bytes"]
    more = 1 if logprob_pass else 0
    passes = [FILL_PASSES_NON_ROOT + more] * (len(units) - 1) + [FILL_PASSES_ROOT + more]
    full = sum(k * b / EARLY_BYTES_PER_PARAM * ROLLOUT_PARAM_BYTES * shard for k, b in zip(passes, units))
    return full / Topology.from_preset(preset or MULTI_PRESET).device_copy_bandwidth()


def step_collectives_s(rec_rank: dict[str, Any], replicate: int, shard: int, preset: str | None = None, *,
                       logprob_pass: bool = False, channel_cap: int | None = None) -> float:
    """Seconds one rank's FSDP2 collectives of a plain training step take for their bytes alone: each unit's
    all-gather in bf16 (:data:`FILL_PASSES_NON_ROOT` times, the root's :data:`FILL_PASSES_ROOT`, once more each with a
    log-prob pass), its reduce-scatter and, on an HSDP mesh of ``replicate`` > 1, its all-reduce over the replicas,
    in fp32, at the NVLink rate of ``preset`` (default :data:`~sim.calibrate.colocated.MULTI_PRESET`) times the
    channels kept of the log's, ``min(channel_cap, C) / C`` ([Note: a communicator's channels] in :mod:`sim.presets`:
    a ring collective's bandwidth taken as proportional to its channels below the ``C`` that fill the links, an
    assumption the channel probe measures). The prediction keeps these under the step's compute, as FSDP2 overlaps
    them; what passes the step is the ``capped_collectives`` term."""
    from sim.calibrate.colocated import MULTI_PRESET, gather_bytes_s
    from sim.calibrate.nccl_init_log import RING_CHANNELS_2X_H200

    preset = preset or MULTI_PRESET
    units = rec_rank["early_units_bytes"]
    more = 1 if logprob_pass else 0
    passes = [FILL_PASSES_NON_ROOT + more] * (len(units) - 1) + [FILL_PASSES_ROOT + more]
    params = [b / EARLY_BYTES_PER_PARAM for b in units]  # this rank's shard of each unit, parameters
    # FSDP2's mixed precision: all-gathers in the params' dtype, the rollout's (bf16); reduces in fp32, the trainer's
    gathers = sum(k * p * ROLLOUT_PARAM_BYTES for k, p in zip(passes, params))
    reduces = sum(params) * TRAIN_PARAM_BYTES
    s = gather_bytes_s(gathers, shard, preset) + gather_bytes_s(reduces, shard, preset)
    if replicate > 1:  # a ring all-reduce moves 2 (R - 1) / R of the shard's bytes
        s += 2 * gather_bytes_s(reduces / replicate, replicate, preset)
    if channel_cap is not None:
        s *= RING_CHANNELS_2X_H200 / min(channel_cap, RING_CHANNELS_2X_H200)
    return s


def content_check_s(rec_rank: dict[str, Any], rate_bps: float | None = None, digests: int = 2) -> float:
    """Seconds the early copies' content check adds to one rank's switch: ``digests`` digests of every byte the rank
    copies early at ``rate_bps`` (default: the measured :data:`~sim.calibrate.switch_modes.CONTENT_DIGEST`). Two
    for an input record that predates the check (one at each ``copy_early``, queued on the compute stream in the
    backward; one at the offload, whose comparison the offload waits for); one where the record ran it
    (``early_content_check``: its offload phase holds the offload's digest). Counted whole on the switch's path: an
    upper bound, since the backward's digests can run while the device would otherwise wait on the host."""
    from sim.calibrate.switch_modes import content_digests_s

    return content_digests_s(sum(rec_rank["early_units_bytes"]), digests, rate_bps)


def sync_first_issue_host_s(rec: dict[str, Any]) -> float:
    """Seconds a sync-first streamed record's reload phase spent issuing the reload: the phase's mean over the steady
    steps less the lifecycle's resume measured inside it (``runtime_spans``' ``lifecycle.resume``)."""
    steady = {s["step"] for s in (rec.get("steps") or [])[1:]}
    phases = [sp for sp in rec.get("spans") or [] if sp["phase"] == "reload" and sp["step"] in steady]
    if not phases:
        raise RecordError("the record has no steady reload phase")
    spans = [sp for sp in rec.get("runtime_spans") or [] if sp.get("name") == "lifecycle.resume"]
    vals = []
    for ph in phases:
        inside = sum(sp["end_s"] - sp["start_s"] for sp in spans
                     if sp["start_s"] >= ph["start_s"] and sp["end_s"] <= ph["end_s"])
        vals.append(max(0.0, ph["end_s"] - ph["start_s"] - inside))
    return statistics.fmean(vals)


#: the reload's pieces the RL step keeps queued with ``--overlap-reload`` unless told otherwise (MiB; its
#: ``OVERLAP_WINDOW_MIB``, which a test holds equal)
OVERLAP_WINDOW_MIB = 128


def overlap_window_bytes(rec: dict[str, Any]) -> int | None:
    """The bytes of the reload's pieces queued at once in the overlapped reload of ``rec``'s step: its
    ``config.stream_window_mib`` where it ran the overlap with one (0: None, every piece at once); for a record that
    did not run the overlap, what the RL step's ``--overlap-reload`` queues by default (:data:`OVERLAP_WINDOW_MIB`)."""
    cfg = rec.get("config") or {}
    mib = cfg.get("stream_window_mib") if rec.get("overlap_reload") else OVERLAP_WINDOW_MIB
    if rec.get("overlap_reload") and mib is None:  # run before the step set a window for it: every piece at once
        return None
    return int(mib) << 20 if mib else None


def plain_step_s(rec: dict[str, Any]) -> float:
    """Seconds of a training step that follows no switch in the record (``summary.switch_costs.train_plain_s``,
    else the mean of its ``train_plain`` spans): the step whose stretches the current mechanism's terms are shares
    of. A switch's cost is what the step after it takes beyond this one, so the work the switch leaves to that step
    (the resume's join, the stream's wait, the chains of early copies and per-unit syncs) hides under the plain
    step's forward and backward, not under a step already lengthened by it. Raises :class:`RecordError` for a
    record without plain steps (``bench.rl`` writes two after the last switch)."""
    plain = ((rec.get("summary") or {}).get("switch_costs") or {}).get("train_plain_s")
    if plain:
        return float(plain)
    spans = [sp["end_s"] - sp["start_s"] for sp in rec.get("spans") or [] if sp.get("phase") == "train_plain"]
    if not spans:
        raise RecordError("the record has no plain training step (summary.switch_costs.train_plain_s or "
                          "train_plain spans): the current mechanism's terms are shares of it")
    return statistics.fmean(spans)


def _agreement_s(preset: str, ranks: int) -> float:
    """One agreement on the Gloo control group of ``ranks`` ranks at the preset's cost."""
    from sim.machine.topology import Topology

    return Topology.from_preset(preset).comm.agreement_s * max(0, ranks - 1)


def predict_ngpu(rec: dict[str, Any], ranks: int, mesh: str = "fsdp", *, mechanisms: Iterable[str] = MECHANISMS,
                 policy: str = "DESTROY_DEFERRED", hsdp_shard: int = HSDP_SHARD, link_share: int = 1,
                 preset: str = "calibrated/h200-1x", multi_preset: str | None = None, comm_rule: str = "log2",
                 bytes_per_rank: str = "sharded", forward_share: float = FORWARD_SHARE, content_check: bool = True,
                 check_rate: float | None = None, overlap_reload: bool | None = None,
                 init_measured: dict[int, float] | None = None,
                 logprob_pass: bool | None = None, nccl_max_ctas: int | None = None) -> list[dict[str, Any]]:
    """One predicted row per mechanism for the step of the one-GPU record ``rec`` on ``ranks`` ranks of ``mesh``
    (see the module docstring); each row's ``terms`` are the parts its ``switch_cost_s`` adds up. ``preset``: the
    one-GPU preset (the store's host costs, the lifecycle the record's offload phase held); ``multi_preset``: the
    preset of the N-rank lifecycle and NVLink (default :data:`~sim.calibrate.colocated.MULTI_PRESET`);
    ``comm_rule``: how its communicator costs grow past two ranks (:data:`sim.presets.SIZE_RULES`);
    ``bytes_per_rank``: :data:`BYTES_PER_RANK`; ``forward_share``: the forward's share of the step, under which
    ``forward_from_rollout`` hides the resume thread (:data:`FORWARD_SHARE`); ``content_check``: whether ``new`` and
    ``forward_from_rollout`` pay the early copies' content check (:func:`content_check_s` at ``check_rate``, the
    measured digest rate by default, two digests or one where ``rec`` ran the check; ``old`` is the mechanism as
    measured before the check existed and never pays it); ``overlap_reload``: ``new`` and ``forward_from_rollout``
    stream the reload in the step's use order and wait for each unit's own bytes
    (:func:`~sim.calibrate.switch_modes.overlapped_reload_wait`) instead of the whole reload at the first optimizer
    step (default: the record's ``overlap_reload``, off where it predates it); ``init_measured``: a communicator's
    creation measured past two ranks, ``{ranks: seconds}`` (:func:`sim.calibrate.creation_measured.creations_from`),
    in place of ``comm_rule``'s at those sizes and, extended by log2 of the ranks, past them; ``logprob_pass``: every
    training step starts with the old policy's log-prob pass (:func:`sim.calibrate.logprob_pass.logprob_pass`:
    default as the record ran; the record's measured pass, else one as long as the training forward): ``new`` joins
    the resume in it, ``forward_from_rollout`` fills it from the rollout's copy and hides the creation under it
    too; ``nccl_max_ctas``: ``new`` and ``forward_from_rollout`` make the mesh's communicators with at most this many
    channels (the RL step's ``--nccl-max-ctas``): their creation's connection scales by the channels kept
    (:meth:`sim.presets.CommParams.with_channel_cap`), and what the step's FSDP2 collectives, slowed as much, take
    beyond the step is paid (:func:`step_collectives_s`, term ``capped_collectives``)."""
    from sim.calibrate.colocated import LOOP_CONSTANTS, MULTI_PRESET, predict_step, simulate_lifecycle
    from sim.calibrate.logprob_pass import logprob_pass as pass_for
    from sim.calibrate.switch_modes import (_compose, early_offload_phase_s, first_wait_share,
                                            overlapped_reload_wait, store_offload_host_s, unit_chain_tail)

    mechanisms = tuple(mechanisms)
    if not 0.0 <= forward_share < 1.0:
        raise ValueError(f"forward_share must be in [0, 1) (the forward's share of the training step), "
                         f"got {forward_share!r}")
    for m in mechanisms:
        if m not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {m!r}")
    cfg = rec.get("config") or {}
    if not cfg.get("sync_first") or cfg.get("mode") != "streamed":
        raise RecordError("the input record must be of the streamed step with --sync-first (config.sync_first, "
                          "config.mode 'streamed')")
    overlap = bool(rec.get("overlap_reload", False)) if overlap_reload is None else bool(overlap_reload)
    multi = MULTI_PRESET if multi_preset is None else multi_preset
    replicate, shard = mesh_shape(mesh, ranks, hsdp_shard)
    r = per_rank_record(rec, ranks, shard, link_share=link_share, bytes_per_rank=bytes_per_rank)
    r["config"].update(lifecycle_policy=policy, mode="streamed")
    r["warm_rebuilt"] = True
    p = predict_step(r, preset=preset, free=r["config"].get("free") or "allocator", gather_ranks=shard)
    settings = p["lifecycle_settings"]
    train, rollout = p["inputs"]["train"], p["inputs"]["rollout"]
    plain = plain_step_s(rec)  # the stretches the switch's work hides under are a plain step's (its extra is the cost)
    lp = pass_for(rec, plain, forward_share, logprob_pass)
    step = lp.train_s  # the training step after the pass (its stretches are shares of it)
    cooldown = float(cfg.get("cooldown_s", 0.2))
    measured = tuple(sorted((init_measured or {}).items()))
    if nccl_max_ctas is not None and (not isinstance(nccl_max_ctas, int) or nccl_max_ctas < 1):
        raise ValueError(f"nccl_max_ctas must be a channel count >= 1, got {nccl_max_ctas!r}")
    if nccl_max_ctas is not None and measured:
        raise ValueError("a creation measured past two ranks was made with its run's channels: it cannot be combined "
                         "with a channel cap (--nccl-max-ctas)")

    def lifecycle(world: int, lc_preset: str, groups=None, cap: int | None = None) -> dict[str, float]:
        return simulate_lifecycle(lc_preset, world, policy, cooldown, round(train, 4), round(rollout, 4),
                                  sync_needs_groups=False, warm_rebuilt=True, proxy_wake=settings["proxy_wake"],
                                  groups=groups, comm_rule=comm_rule if world > 1 else "log2",
                                  init_measured=measured if world > 1 else (),
                                  channel_cap=cap if world > 1 else None)

    one = lifecycle(1, preset)  # the lifecycle the one-GPU record's offload phase holds (trainer.dp of one rank)
    phase_1 = early_offload_phase_s(rec)
    if phase_1 is None:
        raise RecordError("the input record has no steady offload phase with early copies")
    p["store_offload_host_s"] = store_offload_host_s(rec)
    p["reload_issue_host_s"] = sync_first_issue_host_s(rec)
    rows = []
    for mech in mechanisms:
        if mech == "old":
            lc = lifecycle(ranks, multi)
            q = {**p, "lifecycle_s": lc, "first_use_extra_s": lc["first_use_extra"],
                 "early_offload_phase_s": phase_1 - one["offload"] + lc["offload"]}
            row = _compose(q, policy, "streamed", 0.8, p["line"], "in_order", first_wait_share(r),
                           r["early_units_bytes"], True)
            terms = {"offload": row["offload_s"], "weight_sync": row["weight_sync_s"], "reload": row["reload_s"],
                     "first_use_extra": row["first_use_extra_s"], "join_wait": 0.0,
                     "stream_wait": row["stream_wait_s"], "early_copies_tail": row["early_copies_tail_s"],
                     "rollout_fill": 0.0, "content_check": 0.0}
            detail = {"resume_inline_s": lc["reload"], "gather_s": p["parts"]["weight_sync"]["gather_s"],
                      "pause_s": lc["offload"], "lifecycle_groups": [["trainer.dp", ranks]]}
        else:
            groups = mesh_groups(replicate, shard)
            lc = lifecycle(ranks, multi, groups, nccl_max_ctas)
            off = phase_1 - one["offload"] + lc["offload"]
            per_tensor = LOOP_CONSTANTS["gather_per_tensor_multi_s"]["value"]
            sync_units = sync_in_backward_units_s(r, shard, per_tensor, multi)
            ws = unit_chain_tail(sync_units, step)
            issue = p["reload_issue_host_s"]
            rel = issue
            thread = lc["reload"]  # cooldown's rest, rebuild per group, warm-up per member group, agreements
            # the forward from the rollout's copy runs no collective: the join is right before loss.backward(), so the
            # thread hides under the issue and the forward (FORWARD_SHARE of the step, not the first post-backward:
            # the host blocks at the join before it issues the backward)
            # with the log-prob pass first: new joins in the pass's first all-gather; the rollout's copy serves the
            # pass too, so the thread hides under the issue, the pass and the forward
            forward = lp.seconds + forward_share * step if mech == "forward_from_rollout" else 0.0
            join = max(0.0, thread - rel - forward) + _agreement_s(multi, ranks)
            ws_parts, rest = p["parts"]["weight_sync"], p["parts"]["reload"]
            rest_left = (ws_parts["sim_copies_s"] + ws_parts["store_host_s"] + ws_parts["scrub_s"]
                         + rest["sim_copies_s"] + rest["store_host_s"])
            if overlap:  # each use waits for its own bytes (the forward after the join without the rollout's copy)
                served = mech == "forward_from_rollout"
                window = overlap_window_bytes(rec)
                wait = overlapped_reload_wait(rest_left, r["early_units_bytes"], step,
                                              issue_s=rel if served else rel + join, join_s=join if served else 0.0,
                                              forward_share=forward_share, pass_s=lp.seconds,
                                              window_s=None if window is None
                                              else window / (p["line"]["h2d_gbps"] * 1e9))
            else:  # the host finishes the whole reload before the first optimizer step
                wait = max(0.0, rest_left - rel - join - lp.seconds - first_wait_share(r) * step)
            tail = unit_chain_tail([b / (p["line"]["d2h_gbps"] * 1e9) for b in r["early_units_bytes"]], step)
            fill = rollout_fill_s(r, shard, multi, lp.seconds > 0) if mech == "forward_from_rollout" else 0.0
            check = (content_check_s(r, check_rate, 1 if rec.get("early_content_check") else 2)
                     if content_check else 0.0)
            coll_full = step_collectives_s(r, replicate, shard, multi, logprob_pass=lp.seconds > 0)
            coll_capped = step_collectives_s(r, replicate, shard, multi, logprob_pass=lp.seconds > 0,
                                             channel_cap=nccl_max_ctas)
            whole = step + lp.seconds
            capped = max(0.0, coll_capped - whole) - max(0.0, coll_full - whole)
            terms = {"offload": off, "weight_sync": ws, "reload": rel, "first_use_extra": lc["first_use_extra"],
                     "join_wait": join, "stream_wait": wait, "early_copies_tail": tail, "rollout_fill": fill,
                     "content_check": check}
            if nccl_max_ctas is not None:  # the term exists only with a cap (rows without one as before it)
                terms["capped_collectives"] = capped
            detail = {"resume_thread_s": thread, "sync_units_s": sum(sync_units), "pause_s": lc["offload"],
                      "hidden_creation_s": rel + forward, "lifecycle_groups": [[n, len(g)] for n, g in groups],
                      "step_collectives_s": coll_capped, "step_collectives_uncapped_s": coll_full}
        cost = sum(terms.values())
        copies = p["offload_bytes"] / (p["line"]["d2h_gbps"] * 1e9) + p["offload_bytes"] / (p["line"]["h2d_gbps"] * 1e9)
        rows.append({"mechanism": mech, "ranks": ranks, "mesh": mesh, "mesh_shape": [replicate, shard],
                     "policy": policy, "link_share": link_share, "comm_rule": comm_rule,
                     "init_measured": [list(m) for m in measured],
                     "logprob_pass_s": lp.seconds if mech != "old" else 0.0,
                     "logprob_pass_measured": lp.measured,
                     "bytes_scaling": bytes_per_rank, "overlap_reload": overlap and mech != "old",
                     "nccl_max_ctas": nccl_max_ctas if mech != "old" else None,
                     "terms": terms, "detail": detail,
                     "switch_cost_s": cost, "copy_time_at_line_s": copies, "switch_cost_x_copy_time": cost / copies,
                     "bytes_per_rank": p["offload_bytes"], "train_s": train, "plain_step_s": plain,
                     "rollout_s": rollout})
    return rows


def check_inputs_blind(record_path: str | Path, presets: Iterable[str] = ("calibrated/h200-1x",
                                                                          "calibrated/hgx-h200-8x"),
                       comm_rule: str = "log2", creation_records: Iterable[str | Path] = (),
                       channel_cap: int | None = None) -> list[str]:
    """Every input the prediction reads, as the sources it names (the record, each preset constant's source, each
    loop constant's source, the first post-backward's and the forward's shares of the step, the digest's rate, and
    with the "ring" ``comm_rule`` or a ``channel_cap`` the NCCL logs of the connection share and the channels, and the
    records of ``creation_records``, a communicator's creation measured past two ranks); raises :class:`RecordError` naming the
    first that is, or comes from, a record the predictions are checked against (:data:`CHECKED`)."""
    from sim.calibrate import switch_modes
    from sim.calibrate.colocated import LOOP_CONSTANTS
    from sim.presets import load_preset_data

    rel = _repo_relative(record_path)
    sources = [rel]
    for name in presets:
        data = load_preset_data(name)
        sources += [f"{name}:{k}: {c.get('source', '')}" for k, c in data.get("constants", {}).items()]
        sources += [f"{name}:fitted_on: {x}" for x in (data.get("fitted_on") or {}).get("records", [])]
    sources += [f"LOOP_CONSTANTS:{k}: {c['source']}" for k, c in LOOP_CONSTANTS.items()]
    sources.append("FIRST_WAIT_SHARE: bench/results/2026-12-02-h200-streamed-copy-engine/profile_unpaced/")
    sources.append(f"FORWARD_SHARE: {FORWARD_SHARE_TRACE}")
    sources.append(f"CONTENT_DIGEST: {switch_modes.CONTENT_DIGEST['source']}")
    if comm_rule == "ring" or channel_cap is not None:
        from sim.calibrate.nccl_init_log import WALK_PROBE_LOGS

        sources += [f"CONNECT_SHARE_2X_H200: {p}" for p in WALK_PROBE_LOGS]
        if channel_cap is not None:
            sources += [f"RING_CHANNELS_2X_H200: {p}" for p in WALK_PROBE_LOGS]
    sources += [f"creation measured: {_repo_relative(p)}" for p in creation_records]
    for s in sources:
        for path in _RECORD_PATH.findall(s):
            for checked in CHECKED:
                if _names(path, checked):
                    raise RecordError(f"an input of the N-GPU prediction comes from a record it is checked against "
                                      f"({checked}): {s[:200]}; take that input from another record")
    return sources


#: a path under bench/results named in a source text
_RECORD_PATH = re.compile(r"bench/results/[^\s:#,;()'\"]+")


def _names(path: str, checked: str) -> bool:
    """True if ``path`` (a record or a directory a source names) is ``checked``, inside it (a directory of checked
    records), or a directory holding it."""
    path, c = path.rstrip("/."), checked.rstrip("/")
    return path == c or c.startswith(path + "/") or (checked.endswith("/") and path.startswith(c + "/"))


def _repo_relative(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it, as the records' lists name them."""
    p = Path(path).resolve()
    root = Path(__file__).resolve().parents[2]
    try:
        return p.relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()


def checked_ratio() -> dict[str, Any]:
    """The checked 2-GPU figure (:data:`CHECKED_FIGURE`): the earlier mechanism's measured switch against the copies;
    read only to score the prediction, never as an input."""
    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / CHECKED_FIGURE).read_text())
    return data["rl_step"]


def format_ngpu(rows: list[dict[str, Any]], measured: dict[str, Any] | None = None) -> str:
    """The rows as a markdown table (seconds; x copies), with the checked figure beside the 2-GPU old rows; with a
    channel cap in any row, a column of what the capped collectives add and one of the step's collectives."""
    capped = any(r.get("nccl_max_ctas") for r in rows)
    extra = "capped collectives | step's collectives | " if capped else ""
    head = ("| ranks | mesh | mechanism | offload | weight sync | reload | join wait | stream wait | "
            "early copies tail | fill from the rollout's copy | content check | " + extra + "switch cost | "
            "copies at line | x copies |\n" + "|---" * (16 if capped else 14) + "|")
    body = []
    for r in rows:
        t = r["terms"]
        mesh = f"{r['mesh']} {r['mesh_shape'][0]}x{r['mesh_shape'][1]}"
        x = f"{r['switch_cost_x_copy_time']:.2f}"
        if (measured and r["mechanism"] == "old" and r["ranks"] == measured.get("world_size")
                and r.get("bytes_scaling", "sharded") == "sharded"):
            x += f" (measured {measured['switch_cost_x_copy_time']:.2f})"
        more = (f"{t.get('capped_collectives', 0.0):.3f} | "
                f"{r['detail'].get('step_collectives_s', 0.0):.3f} | ") if capped else ""
        body.append(f"| {r['ranks']} | {mesh} | {r['mechanism']} | {t['offload']:.3f} | {t['weight_sync']:.3f} | "
                    f"{t['reload']:.3f} | {t['join_wait'] + t['first_use_extra']:.3f} | {t['stream_wait']:.3f} | "
                    f"{t['early_copies_tail']:.3f} | {t.get('rollout_fill', 0.0):.3f} | "
                    f"{t.get('content_check', 0.0):.3f} | {more}"
                    f"{r['switch_cost_s']:.3f} | {r['copy_time_at_line_s']:.3f} | {x} |")
    return "\n".join([head, *body])


def predict_table(rec: dict[str, Any], ranks: Iterable[int], meshes: Iterable[str] = MESHES, **kw) -> list[dict]:
    """:func:`predict_ngpu` for every rank count and mesh (a mesh the rank count cannot make is left out)."""
    rows = []
    for n in ranks:
        for m in meshes:
            try:
                mesh_shape(m, n, kw.get("hsdp_shard", HSDP_SHARD))
            except ValueError:
                log.info("no %s mesh on %d ranks", m, n)
                continue
            rows += predict_ngpu(rec, n, m, **kw)
    return rows


def main(argv: list[str] | None = None) -> int:
    """CLI: print the predicted N-GPU rows for a one-GPU record (the checked 2-GPU figure beside its row)."""
    from sim.calibrate.switch_modes import POLICIES

    ap = argparse.ArgumentParser(description="Predicted switch cost of the colocated RL step on N GPUs, from a "
                                 "one-GPU record of the sync-first streamed step with early copies")
    ap.add_argument("record", help="an rl_step_1.json of bench.rl (--offload-in-backward --sync-first --mode streamed)")
    ap.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts (each 1 or more; 1: today's "
                    "mechanism on one GPU, composed as on N)")
    ap.add_argument("--meshes", default="fsdp,hsdp",
                    help="fsdp (FSDP2 over every rank) and/or hsdp (replicate x shard)")
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS),
                    help="old (trainer.dp rebuilt inline, the gather after the step), new (the mesh's groups, the "
                    "resume ahead joined in the first forward) and/or forward_from_rollout (the defaults: the first "
                    "forward's all-gathers from the rollout's copy, the resume joined before the backward)")
    ap.add_argument("--comm-rule", default="log2", choices=SIZE_RULES,
                    help="how a communicator's costs grow past two ranks: log2 (every cost one step per doubling) or "
                    "ring (the connection at the first collective, its share from NCCL's log, the same at any size)")
    ap.add_argument("--creation-from", action="append", default=[], metavar="RECORD",
                    help="an RL step record of more than two ranks (bench.rl, --rebuild-ahead): the creation of its "
                    "communicator past two ranks, as its resume's warm-up timed it, in place of the rule's at that "
                    "size and, by log2 of the ranks, past it (repeatable)")
    ap.add_argument("--bytes-per-rank", default="sharded", choices=BYTES_PER_RANK,
                    help="sharded (the one-GPU model's state over the shard size) or one-gpu (a model as many times "
                    "larger: each rank offloads what the one GPU did)")
    ap.add_argument("--policy", default="DESTROY_DEFERRED", choices=POLICIES)
    ap.add_argument("--hsdp-shard", type=int, default=HSDP_SHARD, help="the shard size of an HSDP mesh")
    ap.add_argument("--link-share", type=int, default=1,
                    help="ranks copying at once through one host uplink (their line rates divided)")
    ap.add_argument("--preset", default="calibrated/h200-1x", help="the one-GPU preset")
    ap.add_argument("--no-content-check", action="store_true",
                    help="leave out the early copies' content check (two digests of every byte copied early), as "
                    "for a record of the step before the check existed")
    ap.add_argument("--overlap-reload", action=argparse.BooleanOptionalAction, default=None,
                    help="new and forward_from_rollout with the reload streamed in the step's use order, each use "
                    "waiting for its own bytes (the RL step's --overlap-reload); --no-overlap-reload: the whole "
                    "reload finished before the first optimizer step (default: as the record ran)")
    ap.add_argument("--logprob-pass", action=argparse.BooleanOptionalAction, default=None,
                    help="every training step starts with the old policy's log-prob pass (the RL step's "
                    "--logprob-pass): the record's measured pass, else one as long as the training forward "
                    "(default: as the record ran)")
    ap.add_argument("--nccl-max-ctas", type=int, default=None, metavar="CHANNELS",
                    help="new and forward_from_rollout with the mesh's communicators made with at most this many "
                    "channels (the RL step's --nccl-max-ctas): the creation's connection scaled by the channels kept, "
                    "the step's collectives slowed as much (default: NCCL's choice)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        ranks = [int(x) for x in a.ranks.split(",")]
        check_inputs_blind(a.record, presets=(a.preset, "calibrated/hgx-h200-8x"), comm_rule=a.comm_rule,
                           creation_records=a.creation_from, channel_cap=a.nccl_max_ctas)
        measured = None
        if a.creation_from:  # the module above this one (it predicts with predict_ngpu) reads the records
            from sim.calibrate.creation_measured import creations_from

            measured = creations_from(a.creation_from)
        with open(a.record) as f:
            rec = json.load(f)
        rows = predict_table(rec, ranks, tuple(a.meshes.split(",")), mechanisms=tuple(a.mechanisms.split(",")),
                             policy=a.policy, hsdp_shard=a.hsdp_shard, link_share=a.link_share, preset=a.preset,
                             comm_rule=a.comm_rule, bytes_per_rank=a.bytes_per_rank,
                             content_check=not a.no_content_check, overlap_reload=a.overlap_reload,
                             init_measured=measured, logprob_pass=a.logprob_pass, nccl_max_ctas=a.nccl_max_ctas)
    except (OSError, ValueError, KeyError) as e:  # RecordError is a ValueError
        print(f"sim.calibrate.switch_ngpu: {a.record}: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        from sim.calibrate import switch_modes

        check = ("left out" if a.no_content_check else "two digests of every byte copied early at "
                 f"{switch_modes.CONTENT_DIGEST['value'] / 1e9:.0f} GB/s (not in old)")
        overlap = "; the reload overlapped with the step (each use waits for its own bytes)" if any(
            r.get("overlap_reload") for r in rows) else ""
        lp = next((r for r in rows if r.get("logprob_pass_s")), None)
        if lp is not None:
            overlap += (f"; a log-prob pass of {lp['logprob_pass_s'] * 1e3:.0f} ms before each step ("
                        + ("measured" if lp["logprob_pass_measured"] else "as long as the training forward, assumed")
                        + ")")
        if a.nccl_max_ctas is not None:
            overlap += f"; the mesh's communicators capped at {a.nccl_max_ctas} channels"
        rule = f"the {a.comm_rule} rule" + ("; creation measured at " + ", ".join(
            f"{n} ranks {v * 1e3:.0f} ms" for n, v in measured.items()) + " (log2 of the ranks past it)"
            if measured else "")
        print(f"communicator costs past two ranks: {rule}; bytes per rank: {a.bytes_per_rank}; "
              f"content check: {check}{overlap}\n")
        print(format_ngpu(rows, checked_ratio()))
    return 0


__all__ = ["BYTES_PER_RANK", "CHECKED", "CHECKED_FIGURE", "FILL_PASSES_NON_ROOT", "FILL_PASSES_ROOT",
           "FORWARD_SHARE", "FORWARD_SHARE_TRACE", "HSDP_SHARD", "MECHANISMS", "MESHES", "check_inputs_blind",
           "checked_ratio", "content_check_s", "format_ngpu", "forward_share_of_trace",
           "OVERLAP_WINDOW_MIB", "mesh_groups", "mesh_shape", "overlap_window_bytes", "per_rank_record",
           "plain_step_s", "predict_ngpu", "predict_table",
           "rollout_fill_s",
           "step_collectives_s", "sync_first_issue_host_s", "sync_in_backward_units_s", "unit_tensors", "main"]

if __name__ == "__main__":
    raise SystemExit(main())

