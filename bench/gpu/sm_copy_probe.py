"""Host-to-device copies made by SMs reading pinned host memory: rate, and what they leave the copy engine for.

    python3 bench/gpu/sm_copy_probe.py [--gb 8] [--piece-mib 64] [--out DIR]     # one GPU, triton; ~60 s

A streamed reload's copies queued on the copy engine make every host-to-device or device-to-device memcpy the
next training step issues wait for all of them (the engine serves one stream's queue before another's:
``bench/gpu/copy_queue_probe.py``). With unified addressing, pinned host memory (``cudaHostAlloc``, and
``cudaHostRegister``-ed memory where the device can use host pointers) is readable from kernels at its host
address, so a kernel on a few SMs can make the copy instead, leaving the engines to the step. Measured here:

* ``rate``: the bulk (``--gb`` in ``--piece-mib`` pieces, one launch per piece) copied by a Triton kernel of
  ``ctas`` programs reading pinned host memory, for two host buffers: ``pin_memory()`` (cudaHostAlloc) and a
  ``cudaHostRegister``-ed one (the store's pinning, ``refimpl.torch_runtime.pinning.HostPinner``); the copy engine
  (``copy_``) beside it; every copy compared bitwise with the source;
* ``queue``: small operations issued on the compute stream right after the bulk was queued, with the bulk on the
  copy engine or on the SMs: a 716 KiB pinned host-to-device copy, a 716 KiB device-to-device ``copy_`` (a
  memcpy on the engine), a 16 KiB pageable ``.to(device)``, a small kernel; the time until each is done;
* ``compute``: a bf16 matmul loop's device time alone and with the bulk running beside it (its slowdown).

Writes ``sm_copy.json`` into ``--out`` and prints a line per measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class SmCopyRig:
    """The probe's buffers on the GPU: the bulk (``n`` pieces of ``words`` int32) in pinned host buffers, its
    destination and reference on the device, the side stream the bulk is issued on, and the rows measured."""

    def __init__(self, n: int, words: int, rows: list) -> None:
        from refimpl.torch_runtime.sm_copy import SmCopier

        self.copier = SmCopier()  # the kernel the store's copies on SMs run
        self.dev = torch.device("cuda")
        self.n, self.words, self.rows = n, words, rows
        self.hosts = self._host_buffers()
        self.dst = torch.empty(n * words, dtype=torch.int32, device=self.dev)
        self.ref = self.hosts["pin_memory"].to(self.dev)
        self.side = torch.cuda.Stream()

    def out(self, row: dict) -> None:
        """Keep ``row`` for the record and print it."""
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def _host_buffers(self) -> dict[str, torch.Tensor]:
        """The same random bulk in a ``pin_memory()`` buffer and in a ``cudaHostRegister``-ed one (where it pins)."""
        hosts: dict[str, torch.Tensor] = {}
        g = torch.Generator().manual_seed(0)
        src_cpu = torch.randint(-2**31, 2**31 - 1, (self.n * self.words,), dtype=torch.int32, generator=g)
        hosts["pin_memory"] = src_cpu.pin_memory()
        try:
            from refimpl.torch_runtime.pinning import HostPinner

            pool = HostPinner(True)
            reg = pool.alloc(self.n * self.words, torch.int32, pinned=True, tag="sm_copy_probe")
            reg.copy_(src_cpu)
            hosts["registered"] = reg
        except Exception as e:  # noqa: BLE001 - report and go on with the other buffer
            self.out({"case": "registered_alloc", "error": f"{type(e).__name__}: {e}"})
        return hosts

    def sm_bulk(self, host: torch.Tensor, ctas: int) -> None:
        """The bulk issued on the side stream as copies made by a kernel of ``ctas`` programs, one per piece."""
        w = self.words
        with torch.cuda.stream(self.side):
            for i in range(self.n):
                if not self.copier.copy(self.dst[i * w:(i + 1) * w], host[i * w:(i + 1) * w], ctas):
                    raise RuntimeError("this device cannot make copies on SMs (see the log)")

    def ce_bulk(self, host: torch.Tensor) -> None:
        """The bulk issued on the side stream as copy-engine copies, one per piece."""
        w = self.words
        with torch.cuda.stream(self.side):
            for i in range(self.n):
                self.dst[i * w:(i + 1) * w].copy_(host[i * w:(i + 1) * w], non_blocking=True)

    def bulk(self, how: str, host: torch.Tensor) -> None:
        """The bulk by ``how``: ``"copy engine"``, ``"sm <ctas>"`` or ``"none"``."""
        if how == "copy engine":
            self.ce_bulk(host)
        elif how.startswith("sm"):
            self.sm_bulk(host, int(how.split()[1]))


def measure_rates(rig: SmCopyRig) -> None:
    """``rate`` rows: each host buffer's bulk by the engine and by kernels of 4-132 programs, the second of two
    repetitions, compared bitwise with the source."""
    piece = rig.words * 4
    for name, host in rig.hosts.items():
        for ctas in ([0] + [4, 8, 16, 32, 66, 132]):
            for rep in range(2):
                rig.dst.zero_()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                try:
                    rig.bulk(f"sm {ctas}" if ctas else "copy engine", host)
                    t1 = time.perf_counter()
                    rig.side.synchronize()
                    t2 = time.perf_counter()
                except Exception as e:  # noqa: BLE001
                    rig.out({"case": "rate", "host": name, "ctas": ctas, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                    break
                if rep == 1:
                    rig.out({"case": "rate", "host": name, "ctas": ctas, "engine": "copy engine" if not ctas else "sm",
                             "issue_s": t1 - t0, "done_s": t2 - t0, "gbps": rig.n * piece / (t2 - t0) / 1e9,
                             "bitwise": bool(torch.equal(rig.dst, rig.ref))})


def measure_queue(rig: SmCopyRig) -> None:
    """``queue`` rows: what a small operation issued on the compute stream right after the bulk waits for."""
    dev = rig.dev
    pinned = torch.zeros(731816 // 4, dtype=torch.float32).pin_memory()
    dd_src = torch.ones(731816 // 4, device=dev)
    dd_dst = torch.empty_like(dd_src)
    pageable = torch.arange(4096, dtype=torch.int32)
    y = torch.ones(1024, device=dev)

    def small(case: str) -> None:
        if case == "pinned_h2d":
            pinned.to(dev, non_blocking=True)
        elif case == "d2d_copy":
            dd_dst.copy_(dd_src)
        elif case == "kernel":
            (y * 2).sum()
        else:
            pageable.to(dev)
        torch.cuda.current_stream().synchronize()

    host = rig.hosts["pin_memory"]
    for bulk in ("none", "copy engine", "sm 16", "sm 32"):
        for case in ("pinned_h2d", "d2d_copy", "pageable_h2d", "kernel"):
            for rep in range(2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                rig.bulk(bulk, host)
                t1 = time.perf_counter()
                small(case)
                t2 = time.perf_counter()
                rig.side.synchronize()
                t3 = time.perf_counter()
                if rep == 1:
                    rig.out({"case": "queue", "bulk": bulk, "small": case, "small_done_ms": 1e3 * (t2 - t1),
                             "bulk_done_ms": 1e3 * (t3 - t0)})


def measure_compute(rig: SmCopyRig) -> None:
    """``compute`` rows: a bf16 matmul loop's device time alone and with the bulk beside it (its slowdown)."""
    x = torch.randn(4096, 4096, device=rig.dev, dtype=torch.bfloat16)

    def mm_loop(reps: int = 60) -> None:
        for _ in range(reps):
            x @ x

    def timed_mm() -> float:
        """The loop's device time on the compute stream (events: the bulk on the side stream is not waited for)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        mm_loop()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    mm_loop(5)
    torch.cuda.synchronize()
    alone = timed_mm()
    rig.out({"case": "compute", "beside": "nothing", "mm_s": alone})
    host = rig.hosts["pin_memory"]
    for bulk in ("copy engine", "sm 16", "sm 32", "sm 66"):
        torch.cuda.synchronize()
        rig.bulk(bulk, host)
        t = timed_mm()
        rig.side.synchronize()
        rig.out({"case": "compute", "beside": bulk, "mm_s": t, "slowdown": t / alone})


def main(argv: list[str] | None = None) -> int:
    """Entry point: the rates, the queue and the compute measurements; ``sm_copy.json`` into ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=8.0)
    ap.add_argument("--piece-mib", type=int, default=64)
    ap.add_argument("--out", default=".")
    a = ap.parse_args(argv)
    import triton

    piece = a.piece_mib << 20
    n = max(1, int(a.gb * 1e9) // piece)
    rec: dict = {"kind": "sm_copy_probe", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "triton": triton.__version__, "piece_bytes": piece, "pieces": n, "rows": [],
                 "command": "python3 bench/gpu/sm_copy_probe.py " + " ".join(argv or [])}
    rig = SmCopyRig(n, piece // 4, rec["rows"])
    measure_rates(rig)
    measure_queue(rig)
    measure_compute(rig)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sm_copy.json"), "w") as f:
        json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
