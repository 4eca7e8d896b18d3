"""The summary of ``bench/gpu/run_switch.sh`` and ``bench/gpu/run_rl_ngpu.sh``: one table of the RL step per
policy and mode, the terms of the switch on several GPUs per run, the steady offload per device-cache mode, the
peers side by side, and the simulator's rows for the same records.

    python bench/gpu/switch_summary.py WORKDIR
"""
from __future__ import annotations

import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"missing": f"{path}: {e}"}


def rl_rows(w: str) -> list[str]:
    """One row per RL-step record: the window's phases, switch_cost_s, copies at line, the step, bitwise."""
    out = ["| run | policy | mode | train | offload | weight sync | reload | first step extra | stream wait | "
           "switch_cost_s | copies at line | x copies | share of step | NCCL in rollout | bitwise | sim switch_cost_s |",
           "|---" * 16 + "|"]
    for path in sorted(glob.glob(os.path.join(w, "rl_*", "rl_step_*.json"))):
        name = os.path.basename(os.path.dirname(path))
        r = _load(path)
        sm = r.get("summary")
        if not sm:
            out.append(f"| {name} | {r.get('error') or r.get('missing')} |")
            continue
        ph, c = sm["phase_s"], sm.get("switch_costs") or {}
        waits = [s.get("stream_wait_s") for s in r["steps"][1:] + r.get("after_steps", [])[:1] if s.get("stream_wait_s")]
        try:
            cost, how = _sim(r)
            sim = f"{cost:.3f} (x{cost / sm['switch_cost_s']:.2f}{how})"
        except Exception as e:  # noqa: BLE001 - the summary still prints the measurement
            sim = f"failed: {type(e).__name__}: {str(e)[:80]}"
        out.append(
            f"| {name} | {r.get('policy')} | {r.get('mode')} | {ph['train']:.3f} | {ph['offload']:.3f} | "
            f"{ph['weight_sync']:.3f} | {ph['reload']:.3f} | {c.get('first_step_extra_s') or 0:.3f} | "
            f"{(sum(waits) / len(waits)) if waits else 0:.3f} | {sm['switch_cost_s']:.3f} | "
            f"{sm['copy_time_at_line_s']:.3f} | {sm['switch_cost_x_copy_time']:.2f} | "
            f"{sm['switch_cost_share_of_step']:.2f} | {_held(r)} | {sm['weights_bitwise_equal_every_sync']} | {sim} |")
        if r.get("policy_choice"):
            out.append(f"|  | auto: {r['policy_choice']['reason']} |")
    return out


#: the flags of the N-GPU mechanism; a one-GPU record with all of them on is composed as the N-GPU prediction is
_MECHANISM_FLAGS = ("managed_mesh", "rebuild_ahead", "sync_in_backward")


def _sim(r: dict) -> tuple[float, str]:
    """The simulator's switch cost for the run of record ``r``, composed from the record's own phases: a one-GPU
    run of the N-GPU mechanism (every flag of :data:`_MECHANISM_FLAGS` on, streamed, sync first, early copies) as the
    N-GPU prediction composes it at one rank (:func:`sim.calibrate.switch_ngpu.predict_ngpu`, mechanism
    ``forward_from_rollout`` or ``new``, named in the column); any other run by the one-GPU composition of the
    earlier mechanism (:func:`sim.calibrate.switch_modes.predict_modes`)."""
    cfg = r.get("config") or {}
    if (int(r.get("world_size", 1)) == 1 and all(cfg.get(k) for k in _MECHANISM_FLAGS) and cfg.get("sync_first")
            and r.get("mode") == "streamed" and r.get("offload_in_backward")):
        from sim.calibrate.switch_ngpu import predict_ngpu

        mech = "forward_from_rollout" if cfg.get("forward_from_rollout") else "new"
        row = predict_ngpu(r, 1, "fsdp", mechanisms=(mech,), policy=r["policy"])[0]
        return row["switch_cost_s"], f", {mech}"
    from sim.calibrate.switch_modes import predict_modes

    return predict_modes(r, policies=(r["policy"],), modes=(r["mode"],))[0]["switch_cost_s"], ""


def _held(r: dict) -> str:
    """What NCCL held in the rollouts of the steady steps, as measured (``nccl_in_rollout``): the lifecycle's
    groups and, where the record has it, every communicator of the process."""
    seen = [s.get("nccl_in_rollout") for s in r.get("steps", [])[1:]]
    if not seen or any(x is None for x in seen):
        return "not measured"
    if all(not x["live_groups"] for x in seen):
        own = f"none ({seen[-1]['state']})"
    else:
        sizes = [x["bytes"] for x in seen if x["bytes"] is not None]
        own = f"{len(seen[-1]['live_groups'])} live group(s)" + (f", {max(sizes) / 2**20:.0f} MiB" if sizes else "")
    process = [x["process"] for x in seen if "process" in x]
    if not process:
        return own
    comms = max(p["nccl_communicators"] for p in process)
    sizes = [p["nccl_bytes"] for p in process]
    return f"{own}; process: {comms} communicator(s)" + (
        f", {max(sizes) / 2**20:.0f} MiB" if sizes and None not in sizes else "")


def ngpu_rows(w: str) -> list[str]:
    """One row per RL-step record: the terms of the switch on several GPUs (``summary.ngpu``: the resume ahead,
    the sync in the backward, the communicators in the rollout) and the world group's collectives."""
    out = ["| run | world | mesh | resume ahead: thread / rebuild / warm s | join wait / agree s (at) | "
           "forward from the rollout's copy: all-gathers / GB / host s | "
           "sync in backward: GB / host / device s | NCCL comms in rollout | other groups | world collectives | "
           "full collections: n / s (longest) |",
           "|---" * 11 + "|"]
    for path in sorted(glob.glob(os.path.join(w, "rl_*", "rl_step_*.json"))):
        r = _load(path)
        t = (r.get("summary") or {}).get("ngpu")
        if t is None:
            continue
        ra, es, held = t.get("resume_ahead"), t.get("early_sync"), t.get("nccl_in_rollout") or {}
        fr, at = t.get("forward_from_rollout"), (t.get("resume_ahead") or {}).get("join_at") or []
        f = (lambda d, k: f"{d[k]:.3f}" if d and d.get(k) is not None else "-")
        wc = r.get("world_collectives") or {}
        out.append(f"| {os.path.basename(os.path.dirname(path))} | {r.get('world_size')} | {r.get('mesh')} | "
                   f"{f(ra, 'thread_s')} / {f(ra, 'rebuild_s')} / {f(ra, 'warm_s')} | "
                   f"{f(ra, 'join_wait_s')} / {f(ra, 'join_agree_s')} ({','.join(at) or '-'}) | "
                   f"{(fr['units'] if fr else '-')} / {(fr['bytes'] / 1e9 if fr else 0):.2f} / {f(fr, 'fill_s')} | "
                   f"{(es['bytes'] / 1e9 if es else 0):.2f} / {f(es, 'issue_s')} / {f(es, 'device_s')} | "
                   f"{held.get('communicators')} | {', '.join(held.get('others') or []) or 'none'} | "
                   f"{wc.get('start')} -> {wc.get('end')} | {_full_collections(r)} |")
    return out


def _full_collections(r: dict) -> str:
    """The steps' full (generation 2) collections of the cyclic collector: how many, their seconds, the longest
    ([Note: the collector in the switch] in bench/rl/gc_watch.py); ``-`` for a record from before they were timed."""
    g = r.get("gc")
    if not g:
        return "-"
    full = [c["s"] for c in r.get("gc_collections") or [] if c["generation"] == 2]
    frozen = "" if (r.get("gc_freeze") or {}).get("on") else ", not frozen"
    return f"{g['count'][2]} / {g['s'][2]:.3f} ({max(full, default=0.0):.3f}){frozen}"


def steady_rows(w: str) -> list[str]:
    """Per device-cache mode: steady offload / reload seconds and x line, bitwise."""
    r = _load(os.path.join(w, "steady", "steady_profile.json"))
    if "cache_modes" not in r:
        return [f"steady: {r.get('missing') or 'no cache_modes'}"]
    out = [f"steady offload of a real model ({r.get('params', 0) / 1e9:.3f} B params), line d2h "
           f"{r['line']['d2h_gbps']:.2f} / h2d {r['line']['h2d_gbps']:.2f} GB/s:",
           "| device cache | offload s | x line | reload s | x line | empty_cache s | bitwise |", "|---" * 7 + "|"]
    for mode, m in r["cache_modes"].items():
        st = m["rows"][1:] or m["rows"]
        rng = (lambda k: f"{min(x[k] for x in st):.3f}-{max(x[k] for x in st):.3f}")
        ec = [x["empty_cache_s"] for x in st if x.get("empty_cache_s") is not None]
        out.append(f"| {mode} | {rng('offload_s')} | {rng('offload_x_line')} | {rng('reload_s')} | "
                   f"{rng('reload_x_line')} | {(max(ec) if ec else 0):.4f} | {m['bitwise_every_cycle']} |")
    return out


def peer_rows(w: str) -> list[str]:
    """The peers' table (bench.model_offload.format_report)."""
    paths = glob.glob(os.path.join(w, "peers", "model_offload_*.json"))
    if not paths:
        return ["peers: no record"]
    from bench.model_offload import format_report

    return format_report(_load(paths[0])).splitlines()


def main() -> int:
    """Print the tables (the steady offload's and the peers' where the run made them)."""
    w = sys.argv[1]
    blocks = [rl_rows(w), ngpu_rows(w)]
    if os.path.isdir(os.path.join(w, "steady")) or os.path.isdir(os.path.join(w, "peers")):
        blocks += [steady_rows(w), peer_rows(w)]
    for block in blocks:
        print("\n".join(block))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
