"""The colocated RL step's switch per policy and per mode (sequential / overlapped / streamed), predicted.

Theory of operation
-------------------
:mod:`sim.calibrate.colocated` predicts each phase of a record of
``bench/gpu/rl_step.py`` from the store's code on a simulated rank (the copies
at the record's line rates, the preset's store host time) and the real
:class:`~refimpl.comm.PGLifecycle` on a simulated world (pause / weight sync /
resume). This module keeps those parts and composes them the way each mode of
``bench/rl/modes.py`` runs them:

* ``sequential``: offload = pause walk + store offload; weight sync = bring-up
  + params reload + gather + post-sync walk; reload = resume + reload of the rest.
* ``overlapped``: the store's moves run beside the lifecycle's: offload =
  max(pause walk, store offload); the weight sync's reloads are streamed
  (each gather waits for its own bytes): weight sync = max(params' copies,
  gather); the rest's copies follow the params' and run on: reload =
  max(resume, what is left of the rest).
* ``streamed``: as overlapped, but the reload of the rest streams into the
  next training step: reload = resume (in the reload phase, beside the
  copies). What the step pays for it depends on the copy engine
  (``copy_engine``):

  - ``"in_order"``: the engine serves the copies queued on a stream before
    another stream's, so the step's first pinned host-to-device copy waits for
    the rest's copies. The step's device work runs up to its first wait, and the
    step pays what is left of the rest after the resume and that stretch (an
    upper bound: a step bound by the host runs ahead of its device by a little
    before it blocks). Where the first wait comes depends on the order the store
    issues the reload in (``reload_order``): ``"category"`` (buffers after the
    optimizer state) puts it at the forward's first layer, which reads a buffer,
    so nothing of the rest runs under the step; ``"first_use"`` (params,
    buffers, grads, optimizer state) leaves nothing of the rest for the forward,
    and the first wait is FSDP2's post-backward of the last layer, which copies a
    pinned buffer (its ``_chunk_cat`` metadata) on the compute stream, at
    ``FIRST_WAIT_SHARE`` of a plain step; unless the step copies its batch at
    its start and the batch is larger than a pageable copy CUDA stages inline
    (``INLINE_COPY_BYTES``): then the batch's copy is the first wait, at the
    step's start. (The RL step copies its batch to the device at the rollout's
    end: ``batch_ahead`` in its config.)
  - ``"shared"``: the rest's copies run under the forward and backward
    (``fwd_bwd_share`` of the measured training step), and the step pays only
    what is left of them after those, at the optimizer.
  - ``"sms"`` (the store's ``stream_sm_ctas``: a kernel on a few SMs makes the
    streamed reloads' host-to-device copies, reading the pinned host buffers,
    and the engine serves the step's own copies at once): as ``"shared"``, with
    every streamed copy at the kernel's rate, ``SM_COPY_RATE`` of the engine's,
    and the step's own compute taken as not slowed by the kernel (a step bound
    by the host).

With the optimizer stepped per unit inside the backward and each unit's state
copied early (``early_units_bytes``, the RL step's ``--offload-in-backward``),
the offload's copies leave the switch: the first unit is final at the step's
first post-backward (``FIRST_WAIT_SHARE``), the others follow evenly to the
step's end, the root (embeddings, head; its gradients are reduced last) at the
end itself, where the optimizer's own time, at the step's end otherwise, moved
into the backward. The copies run one after another at the record's
device-to-host rate from the moment each unit is final, and what outlasts the
step is paid by it (:func:`early_copies_tail`; the step's phase ends on a
device synchronisation). The offload keeps the lifecycle's pause and the
store's host work, read from the record's own steady offload
(:func:`store_offload_host_s`; the preset's constant where the record has
none). The copies' effect on the step's compute is taken as nil.

With ``sync_first`` (the RL step's ``--sync-first``, verl's order) the weight
sync is the gather alone, reading the resident params before the offload
(not under the lifecycle: its groups are still up and unused), and the reload
brings everything back, params first: streamed, all of it runs into the next
step as the rest did, the reload phase issuing it (the host time the record's
streamed reloads took to issue, :func:`reload_issue_host_s`) before the
resume. With early copies the offload phase is the lifecycle's pause walk and
the store's host stages one after the other (both Python on one interpreter),
taken as measured where the record itself ran with early copies
(:func:`early_offload_phase_s`).

Where the constants come from and how the predictions fared against the runs
they preceded: docs/calibration.md, "The colocated switch by mode".

``switch_cost_s`` is the same rule and name as the benchmark's ([Note: switch cost] in :mod:`bench.rl.record`):
the window's phases plus what the first training step after the switch pays
beyond a plain one: the lazy initialisation of a rebuilt group at its first
collective (simulated: the training step's all-reduce after the wake, less the
same all-reduce in a steady step) and the streamed reload's wait. Beside it:
``copy_time_at_line_s`` (the bytes at the record's line rates, both ways) and
the step (plain training + rollout + switch cost).

    python -m sim.calibrate.switch_modes RECORD.json [--policies DESTROY_DEFERRED,SUSPEND_PLANNED,PAUSED_LIVE]

The same composition for one rank of an N-GPU step, from a one-GPU record, for the earlier mechanism and the
current one on FSDP2 and HSDP meshes: :mod:`sim.calibrate.switch_ngpu`.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sim.calibrate.colocated import predict_step

#: the switch modes (bench/rl/modes.py MODES)
MODES = ("sequential", "overlapped", "streamed")
#: policies a prediction covers by default: the two that free NCCL memory on NCCL >= 2.29.7 and the one that keeps it
POLICIES = ("DESTROY_DEFERRED", "SUSPEND_PLANNED", "PAUSED_LIVE")
#: how the copy engine shares itself between a streamed reload's copies and the next step's own (module docstring)
COPY_ENGINES = ("in_order", "shared", "sms")
#: host-to-device copies made on SMs against the copy engine's rate: 8 GB in 64 MiB pieces on one H200, 16 to 132
#: programs 50.7 GB/s, the engine 54.8 GB/s (bench/results/2026-12-02-h200-sm-copies/sm_copy_run1.json; the second
#: run: 51.0 and 55.2 GB/s)
SM_COPY_RATE = 50.7 / 54.8
#: the orders a reload may issue its flat buffers in (module docstring)
RELOAD_ORDERS = ("first_use", "category")
#: share of a training step before its first wait on a streamed reload issued in first-use order: FSDP2's first
#: post-backward pinned copy at 61.8 ms of a 200.3 ms plain step (H200, profile_train_plain_4 of
#: bench/results/2026-12-02-h200-streamed-copy-engine/profile_unpaced/)
FIRST_WAIT_SHARE = 61.8 / 200.3
#: a pageable host-to-device copy up to this size is staged inline and does not queue behind the engine's pinned
#: copies (CUDA's documented 64 KiB; on the H200 a 16 KiB batch did not wait, a 256 KiB one waited 128 ms)
INLINE_COPY_BYTES = 64 << 10


def early_copies_tail(units_bytes: list[int], d2h_bps: float, train_s: float, start_share: float = FIRST_WAIT_SHARE,
                      end_share: float = 1.0) -> float:
    """Seconds the early copies of a step that steps its optimizer per unit in the backward run past the step's
    end (see the module docstring): unit ``i`` of ``n`` (in backward order, the root last) is final at
    ``start + i / (n - 1) * (end - start)`` of the step (the root at ``end``: the step's end, where the optimizer's
    own time moved into the backward), its copy starts then or when the copy before it ends, at the line rate
    ``d2h_bps``."""
    return unit_chain_tail([b / d2h_bps for b in units_bytes], train_s, start_share, end_share)


def unit_chain_tail(units_s: list[float], train_s: float, start_share: float = FIRST_WAIT_SHARE,
                    end_share: float = 1.0) -> float:
    """Seconds a chain of per-unit works run past the end of a step of ``train_s`` that steps its optimizer per unit
    in the backward: unit ``i`` of ``n`` (backward order, the root last) is final as :func:`early_copies_tail`
    says, and its work (``units_s[i]`` seconds, on one stream) starts then or when the work before it ends."""
    if not units_s:
        return 0.0
    start, end = start_share * train_s, end_share * train_s
    n, t = len(units_s), 0.0
    for i, d in enumerate(units_s):
        ready = end if i == n - 1 or n == 1 else start + i / (n - 1) * (end - start)
        t = max(t, ready) + d
    return max(0.0, t - train_s)


def overlapped_reload_wait(rest_s: float, units_bytes: list[int], train_s: float, *, issue_s: float = 0.0,
                           join_s: float = 0.0, params_share: float = 1 / 3, forward_share: float = 0.0,
                           start_share: float = FIRST_WAIT_SHARE, pass_s: float = 0.0,
                           window_s: float | None = None) -> float:
    """Seconds a streamed reload issued in the step's use order (``--overlap-reload``) holds the next step's compute
    back: its copies take ``rest_s`` from the reload phase's start, in the order the step uses them (every unit's
    params, ``params_share`` of its bytes ``units_bytes[i]`` (backward order, the root last), in the forward's
    order, the root first; then each unit's optimizer state in the backward's order), and each use waits on the
    device for its own bytes only. The step starts ``issue_s`` after the phase's start; its forward reads unit ``k``
    of the forward's order at ``k / u`` of ``forward_share`` of the step; its backward, issued ``join_s`` later (the
    host's join), steps unit ``i`` where :func:`unit_chain_tail` says. With a log-prob pass of ``pass_s`` before the
    step (``--logprob-pass``) the pass reads unit ``k``'s params first, at ``k / u`` of it, and the step starts
    ``pass_s`` later. A sequence of uses that waits for arrivals ends late by its largest shortfall: the largest of
    (arrival - use) over every use, or 0.

    [Note: a pinned copy behind the queued reload] The copy engine serves the pieces queued before a pinned
    host-to-device copy of the step's own, and FSDP2's reduce of every unit in the backward makes one
    (``torch._chunk_cat``'s block; the profile of ``bench/results/2026-12-05-h100-logprob-overlap/``). ``window_s``:
    the seconds one window of the reload's pieces takes, where the store keeps at most a window queued
    (``StoreConfig.stream_window_bytes``): each unit whose reduce comes while the copies run waits for up to one window
    (counted whole, an upper bound). None: every piece queued at once, so the first reduce waits for the whole
    reload."""
    total = float(sum(units_bytes))
    if not units_bytes or total <= 0 or rest_s <= 0:
        return 0.0
    n = len(units_bytes)
    per_byte = rest_s / total
    late = 0.0
    landed = 0.0
    first_read = pass_s if pass_s > 0 else forward_share * train_s  # the params' first reader: the pass, or the forward
    for k, b in enumerate(reversed(units_bytes)):  # the root's params first
        landed += params_share * b
        late = max(late, landed * per_byte - (issue_s + k / n * first_read))
    start, end = start_share * train_s, train_s
    for i, b in enumerate(units_bytes):  # the backward: unit i's state, each after the one before
        landed += (1 - params_share) * b
        at = end if i == n - 1 or n == 1 else start + i / (n - 1) * (end - start)
        late = max(late, landed * per_byte - (issue_s + pass_s + join_s + at))
    if window_s is None:  # the first unit's reduce waits for every piece queued before its pinned copy
        return max(late, rest_s - (issue_s + pass_s + join_s + start), 0.0)
    queued = 0.0  # each unit's reduce waits for the window in flight while the copies run
    for i in range(n):
        at = end if i == n - 1 or n == 1 else start + i / (n - 1) * (end - start)
        if issue_s + pass_s + join_s + at < rest_s:
            queued += window_s
    return max(0.0, late) + queued


#: the host stages of a steady offload (``StoreStats.phases`` of a record): what is left of the offload once its
#: copies ran early
OFFLOAD_HOST_PHASES = ("offload.copy_ahead", "offload.collect", "offload.plan", "offload.issue", "offload.record",
                       "offload.release")
#: the names older records carry for a phase of :data:`OFFLOAD_HOST_PHASES` (the store called copy_ahead speculate)
OLD_PHASE_NAMES = {"offload.copy_ahead": "offload.speculate"}


def store_offload_host_s(rec: dict[str, Any]) -> float | None:
    """The store's host work in the record's last offload (its ``store_phases`` but the wait), or None where the
    record has none or its last offload was not steady (the first one collects everything)."""
    ph = dict(rec.get("store_phases") or {})
    ph.update({new: ph[old] for new, old in OLD_PHASE_NAMES.items() if new not in ph and old in ph})
    if not all(k in ph for k in OFFLOAD_HOST_PHASES) or len(rec.get("steps") or []) < 2:
        return None
    return float(sum(ph[k] for k in OFFLOAD_HOST_PHASES))


#: the content digest's rate (bytes/s) the early copies' content check runs at (:func:`content_digests_s`,
#: :func:`sim.calibrate.switch_ngpu.content_check_s`), with its source;
#: :func:`sim.calibrate.switch_ngpu.check_inputs_blind` reads the source like every other input's
CONTENT_DIGEST: dict[str, Any] = {
    "value": 2 * 2 ** 30 / 3.537e-3,
    "source": "measured: bench/results/2026-12-05-h200-pending/run4/digest_variants.log (1 x H200, python3 "
              "bench/gpu/digest_variants.py --repeats 3): content_digest of 2 GiB of bf16 in 24 ranges of one flat "
              "buffer (the early copies' shape: one range per copy) in 3.537 ms with the Triton row sums, 565 GiB/s "
              "(8 GiB in 64 fp32 tensors: 8.61 ms, 929 GiB/s); on one H100 the same was 4.196 ms (run3/)",
}


def content_digests_s(nbytes: float, digests: int = 1, rate_bps: float | None = None) -> float:
    """Seconds ``digests`` content digests of ``nbytes`` take on the device at ``rate_bps`` (default: the measured
    :data:`CONTENT_DIGEST`): the early copies' content check ([Note: early copies] in
    :mod:`refimpl.store.moves.early`)."""
    rate = CONTENT_DIGEST["value"] if rate_bps is None else rate_bps
    if not rate > 0:
        raise ValueError(f"the digest's rate must be positive (bytes/s), got {rate!r}")
    if digests < 0:
        raise ValueError(f"digests must be 0 or more, got {digests!r}")
    return digests * nbytes / rate


def early_offload_phase_s(rec: dict[str, Any]) -> float | None:
    """The record's steady offload phase (mean seconds) where it ran with early copies (its offload is then the
    pause's walk and the store's host work, which the prediction takes as measured), else None."""
    if not rec.get("offload_in_backward"):
        return None
    vals = [sp["end_s"] - sp["start_s"] for sp in rec.get("spans") or [] if sp["phase"] == "offload" and sp["step"] > 0]
    return sum(vals) / len(vals) if vals else None


def reload_issue_host_s(rec: dict[str, Any]) -> float | None:
    """Seconds the record's steady steps took to issue both streamed reloads (``reload_params_store_s``, off the
    sequential mode: the params' and the rest's, issued at once), or None where the record did not stream them."""
    cfg = rec.get("config") or {}
    steady = (rec.get("steps") or [])[1:]
    vals = [float(s["reload_params_store_s"]) for s in steady if s.get("reload_params_store_s")]
    if cfg.get("mode", "sequential") == "sequential" or cfg.get("sync_first") or not vals:
        return None
    return sum(vals) / len(vals)


def first_wait_share(rec: dict[str, Any], reload_order: str | None = None, batch_ahead: bool | None = None) -> float:
    """The share of the record's training step before its first wait on a streamed reload with the ``in_order``
    engine (module docstring): :data:`FIRST_WAIT_SHARE` where the reload is issued in first-use order and the step
    copies no batch larger than :data:`INLINE_COPY_BYTES` at its start, else 0. ``reload_order`` and ``batch_ahead``
    default to the record's."""
    cfg = rec.get("config") or {}
    order = rec.get("reload_order", "category") if reload_order is None else reload_order
    ahead = bool(cfg.get("batch_ahead", False)) if batch_ahead is None else batch_ahead
    batch_bytes = int(cfg.get("batch") or 0) * int(cfg.get("seq") or 0) * 8  # int64 token ids
    return FIRST_WAIT_SHARE if order == "first_use" and (ahead or batch_bytes <= INLINE_COPY_BYTES) else 0.0


def predict_modes(rec: dict[str, Any], *, preset: str = "calibrated/h200-1x", policies=POLICIES, modes=MODES,
                  fwd_bwd_share: float = 0.8, wake_proxies: bool | None = None,
                  copy_engine: str = "in_order", reload_order: str | None = None,
                  batch_ahead: bool | None = None, early_units_bytes: list[int] | None = None,
                  sync_first: bool | None = None) -> list[dict[str, Any]]:
    """One predicted row per policy and mode for the step of ``rec`` (train and rollout from the record).

    The lifecycle runs as the record's RL step drives it (:func:`sim.calibrate.colocated.lifecycle_settings`);
    for a record of the current step (``sync_needs_no_group``) each mode gets the warm-up of rebuilt groups it
    runs with (off the sequential mode). ``wake_proxies`` overrides whether destroys wake the NCCL proxy
    (default: the record's). ``copy_engine``: ``"in_order"`` or ``"shared"`` (see the module docstring).
    ``reload_order``: the order the store issued the reload in, ``"first_use"`` or ``"category"`` (default: the
    record's ``reload_order``, ``"category"`` where the record predates it); with the ``in_order`` engine and
    ``"first_use"`` the streamed reload's rest runs under the step's forward (:data:`FIRST_WAIT_SHARE`) unless
    the step copies a batch larger than :data:`INLINE_COPY_BYTES` at its start. ``batch_ahead``: whether the step's
    batch is on the device before the switch's reloads (default: the record's ``config.batch_ahead``, False where
    the record predates it). ``early_units_bytes``: the step steps its optimizer per unit inside the backward and
    copies each unit's state early (``--offload-in-backward``), these bytes per unit in backward order (default:
    the record's ``early_units_bytes`` where it ran so, else None: no early copies). ``sync_first``: the weight
    sync reads the resident params before the offload and the reload brings everything back (default: the
    record's ``config.sync_first``). A record whose store checked its early copies' content
    (``early_content_check``) pays the backward's digests (:func:`content_digests_s`; the offload's are in its
    offload phase, or a second digest where it has none); a record from before the check pays none.
    """
    if copy_engine not in COPY_ENGINES:
        raise ValueError(f"copy_engine must be one of {COPY_ENGINES}, got {copy_engine!r}")
    if not 0 <= fwd_bwd_share <= 1:
        raise ValueError(f"fwd_bwd_share must be in [0, 1], got {fwd_bwd_share}")
    rows = []
    line = rec.get("line") or {}
    order = rec.get("reload_order", "category") if reload_order is None else reload_order
    if order not in RELOAD_ORDERS:
        raise ValueError(f"reload_order must be one of {RELOAD_ORDERS}, got {order!r}")
    cfg = rec.get("config") or {}
    first_wait = first_wait_share(rec, order, batch_ahead)
    if early_units_bytes is None and rec.get("offload_in_backward"):
        early_units_bytes = rec.get("early_units_bytes")
    first = bool(cfg.get("sync_first", False)) if sync_first is None else sync_first
    for policy in policies:
        for mode in modes:
            r = json.loads(json.dumps(rec))
            r.setdefault("config", {}).update(lifecycle_policy=policy, mode=mode)
            if r.get("sync_needs_no_group"):
                r["warm_rebuilt"] = mode != "sequential"
            if wake_proxies is not None:
                r["wake_proxies"] = wake_proxies
            p = predict_step(r, preset=preset, free=r["config"].get("free") or "allocator")
            p["store_offload_host_s"] = store_offload_host_s(rec)
            p["reload_issue_host_s"] = reload_issue_host_s(rec)
            p["early_offload_phase_s"] = early_offload_phase_s(rec)
            check = 0.0
            if early_units_bytes and rec.get("early_content_check"):  # the record's store checked its early copies:
                # the backward's digests lengthen the step before the offload; the offload's is in the record's phase
                check = content_digests_s(sum(early_units_bytes), 1 if p["early_offload_phase_s"] else 2)
            rows.append({**_compose(p, policy, mode, fwd_bwd_share, line, copy_engine, first_wait, early_units_bytes,
                                    first, check),
                         "reload_order": order, "offload_in_backward": bool(early_units_bytes), "sync_first": first})
    return rows


def _compose(p: dict[str, Any], policy: str, mode: str, fwd_bwd_share: float, line: dict[str, Any],
             copy_engine: str = "in_order", first_wait_share: float = 0.0,
             early_units_bytes: list[int] | None = None, sync_first: bool = False,
             content_check_s: float = 0.0) -> dict[str, Any]:
    """One mode's row from a step prediction: the parts composed the way bench/rl/modes.py runs them;
    ``content_check_s``: what the early copies' content check adds beyond the record's own phases."""
    parts, lc = p["parts"], p["lifecycle_s"]
    off_store = sum(parts["offload"].values())
    early_tail = 0.0
    if early_units_bytes:  # the copies ran in the step before; what outlasts it is paid there (its device sync)
        off_store = p.get("store_offload_host_s") or parts["offload"]["store_host_s"]
        # the optimizer's time moved into the backward: the root (stepped last) is final at the step's end
        early_tail = early_copies_tail(list(early_units_bytes), line["d2h_gbps"] * 1e9, p["inputs"]["train"])
    slow = 1.0 / SM_COPY_RATE if copy_engine == "sms" and mode != "sequential" else 1.0  # streamed copies on SMs
    ws_parts = parts["weight_sync"]
    params = ws_parts["sim_copies_s"] * slow + ws_parts["store_host_s"] + ws_parts["scrub_s"]
    gather = ws_parts["gather_s"]
    rest = parts["reload"]["sim_copies_s"] * slow + parts["reload"]["store_host_s"]
    train, rollout = p["inputs"]["train"], p["inputs"]["rollout"]
    extra = p["first_use_extra_s"]
    copy_line = p["offload_bytes"] / (line["d2h_gbps"] * 1e9) + p["offload_bytes"] / (line["h2d_gbps"] * 1e9)
    wait = 0.0
    if sync_first:  # the gather reads the resident params before the offload; the reload brings all back
        ws = gather
        rest = rest_left = params + rest
    elif mode == "sequential":
        ws = lc["weight_sync"] + params + gather
        rest_left = rest
    else:  # streamed reloads issued at once: each gather waits for its own bytes, the rest's copies follow; the
        # gather starts once the host has issued both (the record's issue time, where it streamed them)
        ws = lc["weight_sync"] + max(params, (p.get("reload_issue_host_s") or 0.0) + gather)
        rest_left = max(0.0, rest - max(0.0, gather - params))
    if mode == "sequential":
        off, rel = lc["offload"] + off_store, lc["reload"] + rest
    else:
        # with the copies gone early the offload is host work on both sides (the pause's walk, the store's
        # stages), one interpreter: they add up; otherwise the store's copies outlast the walk beside them
        off = lc["offload"] + off_store if early_units_bytes else max(lc["offload"], off_store)
        if early_units_bytes and p.get("early_offload_phase_s"):  # the record ran early copies: its own phase
            off = p["early_offload_phase_s"]
        # sync first: the reload phase issues every reload (the host work the record's streamed reloads took to
        # issue, its reload_params_store_s) before the resume
        issue = (p.get("reload_issue_host_s") or 0.0) if sync_first else 0.0
        if mode == "overlapped":
            rel = max(lc["reload"] + issue, rest_left)
        else:
            rel = lc["reload"] + issue
            under = (first_wait_share if copy_engine == "in_order" else fwd_bwd_share) * train  # shared, sms
            wait = max(0.0, rest_left - rel - under)
    cost = off + ws + rel + extra + wait + early_tail + content_check_s
    step = train + rollout + cost
    return {"policy": policy, "mode": mode, "offload_s": off, "weight_sync_s": ws, "reload_s": rel,
            "first_use_extra_s": extra, "stream_wait_s": wait, "early_copies_tail_s": early_tail,
            "content_check_s": content_check_s, "switch_cost_s": cost,
            "copy_time_at_line_s": copy_line, "switch_cost_x_copy_time": cost / copy_line,
            "step_s": step, "switch_cost_share_of_step": cost / step}


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    head = ("| policy | mode | offload | weight sync | reload | first use extra | stream wait | early copies tail | "
            "switch_cost_s | copies at line | x copies | share of step |\n" + "|---" * 12 + "|")
    body = [f"| {r['policy']} | {r['mode']} | {r['offload_s']:.3f} | {r['weight_sync_s']:.3f} | {r['reload_s']:.3f} | "
            f"{r['first_use_extra_s']:.3f} | {r['stream_wait_s']:.3f} | {r.get('early_copies_tail_s', 0.0):.3f} | "
            f"{r['switch_cost_s']:.3f} | "
            f"{r['copy_time_at_line_s']:.3f} | {r['switch_cost_x_copy_time']:.2f} | {r['switch_cost_share_of_step']:.2f} |"
            for r in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    """CLI: print the predicted rows for a record's step (its model, line rates, train and rollout)."""
    ap = argparse.ArgumentParser(description="Predicted switch cost per policy and mode of a colocated RL step")
    ap.add_argument("record", help="an rl_step_<world>.json of bench.rl (its model, line rates, phases)")
    ap.add_argument("--preset", default="calibrated/h200-1x")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--fwd-bwd-share", type=float, default=0.8,
                    help="share of the training step that is forward and backward (the streamed reload runs under it)")
    ap.add_argument("--copy-engine", choices=COPY_ENGINES, default="in_order",
                    help="in_order: the next step's copies wait behind a streamed reload's (measured on the H200); "
                    "shared: the reload's copies run under the forward and backward; sms: as shared, the streamed "
                    "copies made on SMs at their measured rate (StoreConfig.stream_sm_ctas)")
    ap.add_argument("--reload-order", choices=RELOAD_ORDERS, default=None,
                    help="the order the store issues a reload in (default: the record's; category where the record "
                    "predates first_use)")
    ap.add_argument("--batch-ahead", action=argparse.BooleanOptionalAction, default=None,
                    help="the step's batch on the device before the switch's reloads (default: as the record ran)")
    ap.add_argument("--early-units-bytes", default=None,
                    help="comma-separated bytes per unit in backward order: the step steps its optimizer per unit in "
                    "the backward and copies each unit's state early (default: the record's, where it ran so)")
    ap.add_argument("--sync-first", action=argparse.BooleanOptionalAction, default=None,
                    help="the weight sync before the offload from the resident params, everything reloaded after "
                    "(default: as the record ran)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        with open(a.record) as f:
            rec = json.load(f)
        rows = predict_modes(rec, preset=a.preset, policies=tuple(a.policies.split(",")),
                             modes=tuple(a.modes.split(",")), fwd_bwd_share=a.fwd_bwd_share,
                             copy_engine=a.copy_engine, reload_order=a.reload_order, batch_ahead=a.batch_ahead,
                             early_units_bytes=[int(x) for x in a.early_units_bytes.split(",")]
                             if a.early_units_bytes else None, sync_first=a.sync_first)
    except (OSError, ValueError, KeyError) as e:  # RecordError is a ValueError
        print(f"sim.calibrate.switch_modes: {a.record}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if a.json else format_rows(rows))
    return 0


__all__ = ["COPY_ENGINES", "FIRST_WAIT_SHARE", "OFFLOAD_HOST_PHASES", "early_copies_tail", "first_wait_share",
           "overlapped_reload_wait",
           "unit_chain_tail", "early_offload_phase_s", "CONTENT_DIGEST", "content_digests_s",
           "reload_issue_host_s",
           "store_offload_host_s", "INLINE_COPY_BYTES", "MODES", "RELOAD_ORDERS", "SM_COPY_RATE", "POLICIES", "format_rows", "main", "predict_modes"]

if __name__ == "__main__":
    raise SystemExit(main())
