"""What the switch's communicator work costs on one GPU, alone and beside the copies (one process, NCCL).

    python3 bench/gpu/switch_probe.py [--gib 8] [--trials 6] [--out DIR]

Each figure is wall time on the host between a device synchronize before and after, for a one-rank
``torch.distributed`` group whose communicator was created by a first all-reduce:

* ``destroy``: ``ProcessGroup.shutdown()`` (``ncclCommDestroy``), without and with the
  :class:`refimpl.torch_runtime.proxy_wake.ProxyWaker` (which wakes the UDS proxy thread the destroy
  joins), after a random 0-0.3 s idle; device memory freed (``cudaMemGetInfo``) each time;
* ``destroy_beside_d2h``: the same beside a ``--gib`` device-to-host copy into registered host memory
  issued just before (the copy alone, and both: when the later of the two ended);
* ``suspend`` / ``resume`` (NCCL >= 2.29.7 only): ``ncclCommSuspend`` alone; suspend started first and the
  D2H copy issued 2 ms later from another thread; resume alone and beside a host-to-device copy;
* ``first_collective``: a new group's first all-reduce (lazy NCCL init) alone and on a worker thread
  beside a host-to-device copy.

Writes ``switch_probe.json`` into ``--out`` (default ``$OUT`` or the current directory) and prints a summary.
NCCL warnings go to ``nccl_warn.log`` there (``NCCL_DEBUG=WARN``) and are counted per part.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "."))
os.environ.setdefault("NCCL_DEBUG", "WARN")
os.environ.setdefault("NCCL_DEBUG_FILE", str(OUT / "nccl_warn.log"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from refimpl.torch_runtime import nccl as nccl_mod  # noqa: E402
from refimpl.torch_runtime.proxy_wake import ProxyWaker  # noqa: E402


def sync() -> None:
    """Wait for every stream of the current device."""
    torch.cuda.synchronize()


def free_bytes() -> int:
    """Free device memory by ``cudaMemGetInfo``."""
    return torch.cuda.mem_get_info()[0]


def warn_lines() -> int:
    """NCCL WARN lines written so far to ``NCCL_DEBUG_FILE``."""
    try:
        return sum("WARN" in line for line in Path(os.environ["NCCL_DEBUG_FILE"]).read_text().splitlines())
    except OSError:
        return 0


def used_group():
    """A new one-rank group whose communicator a first all-reduce created."""
    g = dist.new_group([0])
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x, group=g)
    sync()
    assert x.item() == 1.0
    return g


def destroy(g, wake: bool) -> tuple[float, int]:
    """Shut the group's communicator down (ncclCommDestroy) and forget the group; (seconds, woken)."""
    sync()
    t0 = time.perf_counter()
    if wake:
        with ProxyWaker() as w:
            g.shutdown()
        woken = w.woken
    else:
        g.shutdown()
        woken = 0
    dt = time.perf_counter() - t0
    dist.destroy_process_group(g)
    return dt, woken


def stats(xs: list[float]) -> dict:
    """Median, min, max and every value of ``xs``."""
    return {"n": len(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs), "all": xs}


def probe_destroy(trials: int) -> dict:
    """Destroys of used one-rank groups after a random idle, without and with the proxy waker."""
    out = {}
    for wake in (False, True):
        times, freed, woken = [], [], []
        w0 = warn_lines()
        for _ in range(trials):
            g = used_group()
            time.sleep(random.uniform(0.0, 0.3))
            f0 = free_bytes()
            dt, n = destroy(g, wake)
            times.append(dt), woken.append(n), freed.append(free_bytes() - f0)
        out["waker" if wake else "plain"] = {"s": stats(times), "freed_bytes": freed, "woken": woken,
                                            "nccl_warn_lines": warn_lines() - w0}
    return out


def copy_pair(nbytes: int):
    """A device buffer and a pinned host buffer of ``nbytes`` each."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev.fill_(7)
    sync()
    return dev, host


def timed_copy(dst, src, stream) -> float:
    """Seconds of one copy on ``stream``, from a device synchronize to its end."""
    sync()
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
    stream.synchronize()
    return time.perf_counter() - t0


def probe_destroy_beside_copy(dev, host, stream, trials: int) -> dict:
    """A destroy with the waker issued right after a D2H copy: both together against the copy alone."""
    alone = [timed_copy(host, dev, stream) for _ in range(3)]
    both, destroy_s = [], []
    for _ in range(trials):
        g = used_group()
        time.sleep(random.uniform(0.0, 0.3))
        sync()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            host.copy_(dev, non_blocking=True)
        t1 = time.perf_counter()
        with ProxyWaker():
            g.shutdown()
        destroy_s.append(time.perf_counter() - t1)
        stream.synchronize()
        both.append(time.perf_counter() - t0)
        dist.destroy_process_group(g)
    return {"d2h_alone_s": stats(alone), "both_s": stats(both), "destroy_s": stats(destroy_s),
            "d2h_gbps": dev.numel() / min(alone) / 1e9}


def probe_suspend(dev, host, stream, trials: int) -> dict:
    """ncclCommSuspend / ncclCommResume alone and beside copies (NCCL >= 2.29.7; skipped otherwise)."""
    lib = nccl_mod.NcclLibrary.load()
    out: dict = {"nccl": lib.version_string}
    if not lib.has_suspend_resume:
        out["skipped"] = "the loaded NCCL has no ncclCommSuspend"
        return out
    g = used_group()
    h = nccl_mod.pg_comm_handles(g)
    sus, res, sus_beside, copy_beside, res_beside, h2d_beside, freed = [], [], [], [], [], [], []
    for _ in range(trials):
        sync()
        f0 = free_bytes()
        t0 = time.perf_counter()
        nccl_mod.suspend_comms(h)
        sus.append(time.perf_counter() - t0)
        freed.append(free_bytes() - f0)
        t0 = time.perf_counter()
        nccl_mod.resume_comms(h)
        sync()
        res.append(time.perf_counter() - t0)
        x = torch.ones(1, device="cuda")
        dist.all_reduce(x, group=g)
        sync()
        assert x.item() == 1.0
        # suspend first, the D2H issued 2 ms later from another thread
        done = {}

        def issue_copy() -> None:
            time.sleep(0.002)
            t = time.perf_counter()
            with torch.cuda.stream(stream):
                host.copy_(dev, non_blocking=True)
            stream.synchronize()
            done["copy"] = time.perf_counter() - t

        th = threading.Thread(target=issue_copy)
        sync()
        t0 = time.perf_counter()
        th.start()
        nccl_mod.suspend_comms(h)
        sus_beside.append(time.perf_counter() - t0)
        th.join()
        copy_beside.append(done["copy"])
        # resume beside an H2D copy issued just before
        sync()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            dev.copy_(host, non_blocking=True)
        nccl_mod.resume_comms(h)
        res_beside.append(time.perf_counter() - t0)
        stream.synchronize()
        h2d_beside.append(time.perf_counter() - t0)
        dist.all_reduce(x, group=g)
        sync()
    out.update(suspend_s=stats(sus), resume_s=stats(res), freed_bytes=freed, suspend_beside_d2h_s=stats(sus_beside),
               d2h_beside_suspend_s=stats(copy_beside), resume_beside_h2d_s=stats(res_beside),
               h2d_with_resume_s=stats(h2d_beside))
    destroy(g, True)
    return out


def probe_first_collective(dev, host, stream, trials: int) -> dict:
    """A new group's first all-reduce (lazy init) alone and on a thread beside an H2D copy."""
    alone, beside, h2d_alone, h2d_beside = [], [], [], []
    for _ in range(3):
        h2d_alone.append(timed_copy(dev, host, stream))
    for _ in range(trials):
        g = dist.new_group([0])
        x = torch.ones(1, device="cuda")
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(x, group=g)
        sync()
        alone.append(time.perf_counter() - t0)
        destroy(g, True)
        g = dist.new_group([0])
        res = {}

        def init() -> None:
            torch.cuda.set_device(0)
            t = time.perf_counter()
            y = torch.ones(1, device="cuda")
            dist.all_reduce(y, group=g)
            torch.cuda.current_stream().synchronize()
            res["init"] = time.perf_counter() - t

        sync()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            dev.copy_(host, non_blocking=True)
        th = threading.Thread(target=init)
        th.start()
        th.join()
        stream.synchronize()
        h2d_beside.append(time.perf_counter() - t0)
        beside.append(res["init"])
        destroy(g, True)
    return {"first_collective_s": stats(alone), "first_collective_beside_h2d_s": stats(beside),
            "h2d_alone_s": stats(h2d_alone), "h2d_with_init_s": stats(h2d_beside)}


def main() -> int:
    """Run every probe, write ``switch_probe.json`` and print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args()
    random.seed(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)  # lazy communicators, as the RL step has them
    lib = nccl_mod.NcclLibrary.load()
    rec: dict = {"kind": "switch_probe", "date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                 "torch": torch.__version__, "nccl_loaded": lib.version_string, "gib": a.gib}
    used_group()  # warm-up
    print("destroy ...", flush=True)
    rec["destroy"] = probe_destroy(a.trials)
    dev, host = copy_pair(int(a.gib * (1 << 30)))
    stream = torch.cuda.Stream()
    print("destroy beside d2h ...", flush=True)
    rec["destroy_beside_d2h"] = probe_destroy_beside_copy(dev, host, stream, a.trials)
    print("suspend ...", flush=True)
    rec["suspend"] = probe_suspend(dev, host, stream, a.trials)
    print("first collective ...", flush=True)
    rec["first_collective"] = probe_first_collective(dev, host, stream, a.trials)
    rec["nccl_warn_lines_total"] = warn_lines()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "switch_probe.json").write_text(json.dumps(rec, indent=1))

    def med(d, *keys):
        for k in keys:
            d = d[k]
        return f"{d['median']:.4f} s (min {d['min']:.4f}, max {d['max']:.4f})"

    print(f"NCCL {rec['nccl_loaded']} on {rec['gpu']}")
    print("destroy plain:", med(rec, "destroy", "plain", "s"), "freed", rec["destroy"]["plain"]["freed_bytes"])
    print("destroy waker:", med(rec, "destroy", "waker", "s"), "woken", rec["destroy"]["waker"]["woken"],
          "freed", rec["destroy"]["waker"]["freed_bytes"], "warn lines", rec["destroy"]["waker"]["nccl_warn_lines"])
    d = rec["destroy_beside_d2h"]
    print(f"d2h alone {med(d, 'd2h_alone_s')} ({d['d2h_gbps']:.1f} GB/s); destroy+waker beside it: both "
          f"{med(d, 'both_s')}, destroy {med(d, 'destroy_s')}")
    s = rec["suspend"]
    if "skipped" in s:
        print("suspend:", s["skipped"])
    else:
        print("suspend", med(s, "suspend_s"), "resume", med(s, "resume_s"), "freed", s["freed_bytes"])
        print("suspend beside d2h", med(s, "suspend_beside_d2h_s"), "d2h", med(s, "d2h_beside_suspend_s"))
        print("resume beside h2d", med(s, "resume_beside_h2d_s"), "h2d+resume", med(s, "h2d_with_resume_s"))
    f = rec["first_collective"]
    print("first collective alone", med(f, "first_collective_s"), "beside h2d", med(f, "first_collective_beside_h2d_s"),
          "h2d alone", med(f, "h2d_alone_s"), "h2d with init", med(f, "h2d_with_init_s"))
    print("NCCL WARN lines:", rec["nccl_warn_lines_total"])
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
