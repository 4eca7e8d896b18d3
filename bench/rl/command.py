"""The colocated RL step's command line: ``python -m bench.rl`` (or ``bench/gpu/rl_step.py`` under ``torchrun``)."""
from __future__ import annotations

import argparse
import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from bench.rl.config import StepConfig
from bench.rl.modes import MODES
from bench.rl.record import write_outputs
from bench.rl.step import run_step

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> StepConfig:
    """Command line -> :class:`StepConfig`."""
    ap = argparse.ArgumentParser(description="A colocated RL step (train, offload, rollout, weight sync, reload)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (CPU tests)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--rollout-batch", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--kv-gb", type=float, default=None, help="KV cache size (default: what the offload freed)")
    ap.add_argument("--free", choices=("driver", "allocator"), default="allocator",
                    help="how the roles hand memory over: the shared caching allocator (default) or the driver")
    ap.add_argument("--shard", type=int, default=2, help="HSDP shard-group size (mesh = (world/shard, shard))")
    ap.add_argument("--policy", default="auto", help="the lifecycle's PGPolicy name, or auto: the cheapest that holds "
                    "no NCCL memory in the rollout that the loaded NCCL allows")
    ap.add_argument("--mode", choices=MODES, default="sequential",
                    help="how the switch runs its memory moves beside the lifecycle (bench/rl/modes.py)")
    ap.add_argument("--mixed-precision", choices=("auto", "on", "off"), default="auto",
                    help="FSDP2 bf16 params and a bf16 rollout copy (auto: on CUDA only)")
    ap.add_argument("--stream-window-mib", type=int, default=None,
                    help="MiB of a streamed reload's copies queued on the device at once (StoreConfig."
                    "stream_window_bytes; 0: all at once; default: all at once, or 128 with --overlap-reload)")
    ap.add_argument("--stream-sm-ctas", type=int, default=None,
                    help="a streamed reload's host-to-device copies made by a kernel of this many programs reading "
                    "the pinned host buffers, leaving the copy engine to the training step (StoreConfig."
                    "stream_sm_ctas; default and 0: the copy engine)")
    ap.add_argument("--pacer-switch-interval-us", type=int, default=None,
                    help="the interpreter's switch interval while a paced reload (--stream-window-mib, "
                    "--overlap-reload) holds copies, in microseconds: the thread feeding each window needs the GIL "
                    "back from the step's (default: the runtime's, 200; 0: the interpreter's own, 5000 unless set)")
    ap.add_argument("--thread-switch-interval-us", type=int, default=None,
                    help="the interpreter's switch interval while the switch's background moves run (the offload "
                    "beside the pause's walk, the resume ahead beside the next step), in microseconds: each of their "
                    "returns from a call without the GIL waits for the step's Python that long at most (default: "
                    "the switch's, 200; 0: the interpreter's own, 5000 unless set)")
    ap.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                    help="freeze the cyclic collector's survivors of the setup before the first step (gc.freeze), so "
                    "a full collection, which holds the GIL throughout, walks only what the steps made (default on)")
    ap.add_argument("--nccl-max-ctas", type=int, default=None,
                    help="make the mesh's NCCL communicators with at most this many channels (NCCL's maxCTAs, "
                    "ProcessGroupNCCL's config.max_ctas; default: NCCL's choice): each creation connects every "
                    "channel's buffers, so fewer channels create faster, at less bandwidth per collective")
    ap.add_argument("--profile", action="store_true",
                    help="write torch.profiler traces of the last switch's weight sync, reload and the training "
                    "step after it, and of a plain training step (their times then hold the profiler's overhead: "
                    "take switch costs from a run without it)")
    ap.add_argument("--batch-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="copy the next training batch to the device at the rollout's end, before the switch's "
                    "reloads (default); --no-batch-ahead: at the training step's start, behind a streamed reload")
    ap.add_argument("--offload-in-backward", action="store_true",
                    help="step the optimizer per FSDP unit inside the backward and copy each unit's params and "
                    "optimizer state to host memory right after its step (OffloadStore.copy_early), under the rest "
                    "of the backward; the offload takes the copies over")
    ap.add_argument("--sync-first", action="store_true",
                    help="the weight sync before the offload, from the trainer's params where training left them "
                    "(verl's order: the rollout generates with the weights just trained); the reload then brings "
                    "everything back, streamed off the sequential mode")
    ap.add_argument("--managed-mesh", action=argparse.BooleanOptionalAction, default=True,
                    help="build the FSDP mesh on groups the lifecycle takes down at the pause and rebuilds in place "
                    "(DeviceMesh.from_group), the loss reduced over them and the weight check over the Gloo control "
                    "group, so no NCCL communicator of the trainer lives through the rollout (default); "
                    "--no-managed-mesh: init_device_mesh's groups, which the lifecycle does not manage")
    ap.add_argument("--flat-mesh", action=argparse.BooleanOptionalAction, default=True,
                    help="leave a replicate dimension of one rank out of the mesh: FSDP over the shard groups alone "
                    "instead of HSDP with a one-rank all-reduce per unit (default)")
    ap.add_argument("--rebuild-ahead", action=argparse.BooleanOptionalAction, default=True,
                    help="off the sequential mode, run the lifecycle's resume (cooldown, rebuild, warm-up) on a "
                    "thread from the rollout's end, beside the reload's copies, joined in the next training step before "
                    "its first collective: before its backward with --forward-from-rollout, else in a pre-hook of its "
                    "forward (default)")
    ap.add_argument("--sync-in-backward", action=argparse.BooleanOptionalAction, default=None,
                    help="with --sync-first and --offload-in-backward: gather each FSDP unit's params into the "
                    "rollout copy right after the unit's optimizer step in the backward (on a side stream on "
                    "CUDA), so no weight sync is left after the step (default: on exactly then)")
    ap.add_argument("--gather-in-rollout-dtype", action=argparse.BooleanOptionalAction, default=True,
                    help="the weight sync casts each sharded param to the rollout's dtype before gathering it "
                    "(half the bytes with bf16; the same bits) (default)")
    ap.add_argument("--forward-from-rollout", action=argparse.BooleanOptionalAction, default=None,
                    help="with the sync in the backward: the first training step after a switch fills FSDP2's "
                    "all-gathers from the rollout's copy of the weights (the same bits), so its forward runs no "
                    "collective and the rebuilt groups' creation runs beside it, joined before the backward "
                    "(default: on exactly then)")
    ap.add_argument("--overlap-reload", action=argparse.BooleanOptionalAction, default=False,
                    help="with --mode streamed: issue the reload in the order the next training step uses the state "
                    "(the model's buffers, the params in the order the forward's all-gathers read them, then each "
                    "unit's optimizer state in the order the backward steps the units) and never finish it on the "
                    "host before that step's optimizer steps: each one, and "
                    "each unit's early copies, waits on the device for its own pieces only, the copies to the host "
                    "running beside the reload's on the other copy engine; at most 128 MiB of its copies queued "
                    "(--stream-window-mib), since FSDP2's reduce in the backward makes a pinned copy that would wait "
                    "behind all of them; off (the default): the store's default order, finished on the host before "
                    "the first optimizer step")
    ap.add_argument("--logprob-pass", action=argparse.BooleanOptionalAction, default=False,
                    help="start every training step with a no-grad forward of its batch computing the old policy's "
                    "per-token log-probs, as a PPO/GRPO step does before its update (verl's compute_log_prob); "
                    "after a switch it is filled from the rollout's copy like the training forward, so the rebuilt "
                    "groups' creation runs beside both (off by default: the step as measured before)")
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    small = dict(batch=2, seq=16, rollout_batch=2, prompt_len=4, new_tokens=4) if a.tiny else {}
    kw = {k: getattr(a, k) for k in ("batch", "seq", "rollout_batch", "prompt_len", "new_tokens")
          if getattr(a, k) is not None}
    return StepConfig(device=a.device, tiny=a.tiny, steps=a.steps, kv_gb=a.kv_gb, free=a.free, shard=a.shard,
                      out=a.out, lifecycle_policy=a.policy, mode=a.mode, line_mib=(4 if a.tiny else 1024),
                      mixed_precision={"auto": None, "on": True, "off": False}[a.mixed_precision],
                      profile=a.profile, stream_window_mib=a.stream_window_mib, stream_sm_ctas=a.stream_sm_ctas,
                      batch_ahead=a.batch_ahead, offload_in_backward=a.offload_in_backward, sync_first=a.sync_first,
                      managed_mesh=a.managed_mesh, flat_mesh=a.flat_mesh, rebuild_ahead=a.rebuild_ahead,
                      sync_in_backward=a.sync_in_backward, gather_in_rollout_dtype=a.gather_in_rollout_dtype,
                      forward_from_rollout=a.forward_from_rollout, overlap_reload=a.overlap_reload,
                      logprob_pass=a.logprob_pass, nccl_max_ctas=a.nccl_max_ctas,
                      pacer_switch_interval_us=a.pacer_switch_interval_us,
                      thread_switch_interval_us=a.thread_switch_interval_us, gc_freeze=a.gc_freeze,
                      **{**small, **kw})


def main(argv: list[str] | None = None) -> int:
    """Entry point under ``torchrun`` (or alone: a world of one): start the process group, run the steps, and on
    rank 0 write the record and print its summary line."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("refimpl").setLevel(logging.WARNING)
    cfg = parse_args(argv)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29517"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rec: dict[str, Any] = {"world_size": world}
    try:
        if cfg.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
    except Exception as e:  # noqa: BLE001 - no process group: record why and stop
        logger.exception("rank %d: could not start (%s)", rank, e)
        if rank == 0:
            rec["error"] = f"start: {type(e).__name__}: {e}"
            write_outputs(rec, cfg.out)
        return 1
    rc = 0
    try:
        rec = run_step(rank, world, cfg)
    except Exception as e:  # noqa: BLE001 - record what failed
        logger.exception("rank %d: the RL step failed", rank)
        rec["error"] = f"{type(e).__name__}: {e}"
        rc = 1
    if rank == 0:
        _report(rec, world, cfg.out)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return rc


def _report(rec: dict[str, Any], world: int, out: str) -> None:
    """Write the record and print the summary line and where it went (the command's output)."""
    jpath, png = write_outputs(rec, out)
    sm = rec.get("summary")
    if sm:
        ph = " ".join(f"{k}={v:.3f}s" for k, v in sm["phase_s"].items())
        print(f"rl_step world={world} policy={rec.get('policy')} mode={rec.get('mode')}: {ph} "
              f"switch_cost={sm.get('switch_cost_s') or 0:.3f}s switch_overhead={sm['switch_overhead_s']:.3f}s "
              f"copies_at_line={sm['copy_time_at_line_s']:.3f}s bitwise={sm['weights_bitwise_equal_every_sync']}",
              flush=True)
    print(f"rl_step wrote {jpath} {png}", flush=True)


__all__ = ["main", "parse_args"]
