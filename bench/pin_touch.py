"""The touch part of pinning setup on this machine: how fast each prefault mode faults host memory in.

``cudaHostRegister`` of untouched memory faults every page itself; the modes of
:func:`refimpl.torch_runtime.pinning.mapped_buffer` fault the pages in first
(``touch``: one write per 4 KiB page; ``thp``: a 2 MiB-aligned mapping advised
``MADV_HUGEPAGE``, one write per huge page; ``populate``: ``MAP_POPULATE``).
Compared with a plain ``torch.empty`` touched the same way. Prints GB/s per mode
(best of ``--repeat``) and the kernel's THP setting; registration itself needs
CUDA (bench/gpu/pin_probe.py). Wall-clock: noisy on a shared machine.

    python -m bench.pin_touch [--gib 1] [--repeat 3] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from refimpl.torch_runtime.pinning import PREFAULT_MODES, anon_huge_pages_kb, mapped_buffer, thp_mode, touch_pages


def measure(nbytes: int, repeat: int = 3) -> dict:
    """GB/s of faulting ``nbytes`` in, per mode (``torch_empty_touch`` plus each prefault mode but ``none``)."""
    out: dict = {"bytes": nbytes, "thp_mode": thp_mode(), "gbps": {}, "huge_kb_seen": {}}
    variants = ["torch_empty_touch"] + [m for m in PREFAULT_MODES if m != "none"]
    for v in variants:
        best = float("inf")
        huge = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            if v == "torch_empty_touch":
                t = torch.empty(nbytes, dtype=torch.uint8)
                touch_pages(t)
            else:
                t = mapped_buffer(nbytes, torch.uint8, nbytes, v)
            dt = time.perf_counter() - t0
            huge = max(huge, anon_huge_pages_kb(0))
            del t
            best = min(best, dt)
        out["gbps"][v] = nbytes / best / 1e9
        out["huge_kb_seen"][v] = huge
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI: print (and optionally write) the touch GB/s per mode."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="buffer size in GiB (default 1)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the result as JSON here")
    a = ap.parse_args(argv)
    if a.gib <= 0 or a.repeat < 1:
        ap.error("--gib must be > 0 and --repeat >= 1")
    res = measure(int(a.gib * (1 << 30)), a.repeat)
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
