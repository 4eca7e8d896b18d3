"""Where the content digest's time goes on one GPU, and what its parts cost apart (one call, about a minute):

    python bench/gpu/digest_variants.py [--mib 8192] [--tensors 64] [--repeats 5]

Times, best of ``--repeats`` after a warm-up, each with the device synchronised at the end:

* ``digest``: :func:`~refimpl.store.backends.digest.content_digest` as it is (fused row sums where built), and with
  the eager row sums;
* ``digest, host``: the same call's time on the host alone (no synchronisation): what a backward hook pays;
* ``host syncs``: how many times one call makes the host wait (torch's sync debug mode, counted);
* ``row sums``: the fused and the eager row sums alone over the same bytes;
* ``early-copy shape``: the digest of a 1 B model's worth of bf16 ranges (2 GiB in 24 ranges) and of 2 GiB in 400
  tensors (what ``local_dedup`` checks);
* references: a clone and an int32 sum of the same bytes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from refimpl.store.backends import digest as dg  # noqa: E402


def best(fn: Callable[[], object], repeats: int, *, sync: bool = True) -> float:
    """Shortest of ``repeats`` timed calls after one warm-up; with ``sync`` the device work is counted."""
    fn()
    torch.cuda.synchronize()
    out = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out = min(out, time.perf_counter() - t0)
        torch.cuda.synchronize()
    return out


def syncs_of(fn: Callable[[], object]) -> int:
    """Host synchronisations in one call of ``fn`` (sync debug mode "warn", warnings counted)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


def row_sums_only(tensors: list[torch.Tensor], fused: bool) -> None:
    """Run only the digest's row-sum stage over ``tensors``, fused or eager, without finalizing."""
    weights = dg._row_weights(tensors[0].device)
    for t in tensors:
        words = dg._words(t)
        out = torch.empty(dg._row_count(words), dtype=torch.int32, device=t.device)
        saved = dg._FUSED.get(str(t.device))
        if not fused:
            dg._FUSED[str(t.device)] = None
        try:
            dg._row_sums_into(out, words, weights)
        finally:
            dg._FUSED[str(t.device)] = saved


def measure(name: str, tensors: list[torch.Tensor], repeats: int) -> dict:
    """Time the digest and its parts over ``tensors`` (best of ``repeats``) against a clone and an int32 sum."""
    dev = tensors[0].device
    gib = sum(t.numel() * t.element_size() for t in tensors) / (1 << 30)
    fused = dg._FUSED.get(str(dev))
    r = {"case": name, "gib": round(gib, 3), "tensors": len(tensors)}
    r["digest_ms"] = best(lambda: dg.content_digest(tensors), repeats) * 1e3
    r["digest_host_ms"] = best(lambda: dg.content_digest(tensors), repeats, sync=False) * 1e3
    r["digest_syncs"] = syncs_of(lambda: dg.content_digest(tensors))
    dg._FUSED[str(dev)] = None
    try:
        r["eager_digest_ms"] = best(lambda: dg.content_digest(tensors), repeats) * 1e3
    finally:
        dg._FUSED[str(dev)] = fused
    r["fused_row_sums_ms"] = best(lambda: row_sums_only(tensors, True), repeats) * 1e3
    r["eager_row_sums_ms"] = best(lambda: row_sums_only(tensors, False), repeats) * 1e3
    r["clone_ms"] = best(lambda: [t.clone() for t in tensors], repeats) * 1e3
    r["int32_sum_ms"] = best(lambda: [t.view(-1).view(torch.int32).sum(dtype=torch.int32) for t in tensors],
                             repeats) * 1e3
    r["digest_gib_per_s"] = gib / (r["digest_ms"] / 1e3)
    r["digest_over_sum"] = r["digest_ms"] / r["int32_sum_ms"]
    r["digest_over_clone"] = r["digest_ms"] / r["clone_ms"]
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}


def main() -> int:
    """Print one JSON line per tensor layout with the digest's timings on the first CUDA device."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=8192)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)
    dg.release_digest_weights()
    t0 = time.perf_counter()
    fused = dg.fused_row_sums(dev)
    print(f"fused row sums: {'built' if fused is not None else 'NOT built'} in {time.perf_counter() - t0:.2f} s",
          flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    numel = (args.mib << 20) // 4 // args.tensors
    cases = {f"{args.mib} MiB fp32 in {args.tensors}": [torch.randn(numel, device=dev, generator=g)
                                                         for _ in range(args.tensors)]}
    flat = torch.randn(1 << 30, device=dev, generator=g, dtype=torch.bfloat16)  # 2 GiB of bf16
    cuts = [c - c % 2 for c in torch.linspace(0, flat.numel(), 25).long().tolist()]
    cases["2 GiB bf16 in 24 ranges of one flat"] = [flat[a:b] for a, b in zip(cuts, cuts[1:])]
    cuts = sorted(set(torch.randint(1, flat.numel() // 2, (399,), generator=torch.Generator().manual_seed(1))
                      .mul(2).tolist()) | {0, flat.numel()})
    cases[f"2 GiB bf16 in {len(cuts) - 1} tensors"] = [flat[a:b] for a, b in zip(cuts, cuts[1:])]
    rows = []
    for name, tensors in cases.items():
        r = measure(name, tensors, args.repeats)
        rows.append(r)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
