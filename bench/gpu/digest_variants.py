"""Where the content digest's time goes on one GPU, and what its parts cost apart (one call, about a minute):

    python bench/gpu/digest_variants.py [--mib 8192] [--tensors 64] [--repeats 5]

Times, best of ``--repeats`` after a warm-up, each with the device synchronised at the end:

* ``<kind>_digest``: :func:`~refimpl.store.backends.digest.content_digest` with each kind of row sums: eager,
  each fused kind that builds and passes the probe (its build time printed), the Triton kernel with other tiles;
  ``digest`` is the kind the digest picks by default;
* ``digest, host``: the same call's time on the host alone (no synchronisation): what a backward hook pays;
* ``host syncs``: how many times one call makes the host wait (torch's sync debug mode, counted);
* ``<kind>_row_sums``: each kind's row sums alone over the same bytes;
* ``early-copy shape``: the digest of a 1 B model's worth of bf16 ranges (2 GiB in 24 ranges) and of 2 GiB in 400
  tensors (what ``local_dedup`` checks);
* references: a clone and an int32 sum of the same bytes.
"""
from __future__ import annotations

import argparse
import functools
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


def row_sums_only(tensors: list[torch.Tensor], fn: dg.RowSums | None) -> None:
    """Run only the digest's row-sum stage over ``tensors`` with the row sums ``fn`` (None: eager), without
    finalizing."""
    weights = dg._row_weights(tensors[0].device)
    key = str(tensors[0].device)
    saved = dg._FUSED.get(key)
    dg._FUSED[key] = fn
    try:
        for t in tensors:
            words = dg._words(t)
            out = torch.empty(dg._row_count(words), dtype=torch.int32, device=t.device)
            dg._row_sums_into(out, words, weights)
    finally:
        dg._FUSED[key] = saved


def candidates(dev: torch.device) -> dict[str, dg.RowSums | None]:
    """The row sums to compare: eager, each fused kind that builds and passes the probe (with its build time
    printed), and the Triton kernel with other tile shapes (rows per program, warps)."""
    out: dict[str, dg.RowSums | None] = {"eager": None}
    for kind in dg.FUSED_KINDS:
        t0 = time.perf_counter()
        fn = dg.choose_row_sums((kind,), dev)
        print(f"{kind} row sums: {'built and exact' if fn is not None else 'NOT taken'} in "
              f"{time.perf_counter() - t0:.2f} s", flush=True)
        if fn is not None:
            out[kind] = fn
    if "triton" in out:
        from refimpl.store.backends.digest_kernel import triton_row_sums
        for rows, warps in ((2, 4), (4, 4), (16, 8), (32, 16)):
            fn = functools.partial(triton_row_sums, block_rows=rows, num_warps=warps)
            fn.writes_into = True
            if dg.checked_row_sums(fn, dev):
                out[f"triton_r{rows}_w{warps}"] = fn
            else:
                print(f"triton {rows} rows x {warps} warps: NOT exact", flush=True)
    return out


def measure(name: str, tensors: list[torch.Tensor], kinds: dict[str, dg.RowSums | None], repeats: int) -> dict:
    """Time the digest and its row sums over ``tensors`` with each of ``kinds`` (best of ``repeats``), the default
    choice's host time and host syncs, against a clone and an int32 sum of the same bytes."""
    dev = tensors[0].device
    key = str(dev)
    gib = sum(t.numel() * t.element_size() for t in tensors) / (1 << 30)
    r = {"case": name, "gib": round(gib, 3), "tensors": len(tensors)}
    r["digest_host_ms"] = best(lambda: dg.content_digest(tensors), repeats, sync=False) * 1e3
    r["digest_syncs"] = syncs_of(lambda: dg.content_digest(tensors))
    default = dg._FUSED.get(key)
    for kind, fn in kinds.items():
        dg._FUSED[key] = fn
        try:
            r[f"{kind}_digest_ms"] = best(lambda: dg.content_digest(tensors), repeats) * 1e3
        finally:
            dg._FUSED[key] = default
        r[f"{kind}_row_sums_ms"] = best(lambda: row_sums_only(tensors, fn), repeats) * 1e3
    r["clone_ms"] = best(lambda: [t.clone() for t in tensors], repeats) * 1e3
    r["int32_sum_ms"] = best(lambda: [t.view(-1).view(torch.int32).sum(dtype=torch.int32) for t in tensors],
                             repeats) * 1e3
    chosen = next((k for k, fn in kinds.items() if fn is default), "?")
    r["default"] = chosen
    r["digest_ms"] = r[f"{chosen}_digest_ms"] if chosen != "?" else float("nan")
    r["digest_gib_per_s"] = gib / (r["digest_ms"] / 1e3)
    r["digest_over_sum"] = r["digest_ms"] / r["int32_sum_ms"]
    r["digest_over_clone"] = r["digest_ms"] / r["clone_ms"]
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}


def main() -> int:
    """Print one JSON line per tensor layout with the digest's timings, per kind of row sums, on the first CUDA
    device."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=8192)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)
    dg.release_digest_weights()
    kinds = candidates(dev)
    t0 = time.perf_counter()
    fused = dg.fused_row_sums(dev)
    if fused is not None and all(fn is not fused for fn in kinds.values()):
        kinds["default"] = fused  # a kind built again (torch.compile gives a new object): timed under its own name
    print(f"default row sums: {next((k for k, fn in kinds.items() if fn is fused), '?')} "
          f"(decided in {time.perf_counter() - t0:.2f} s, the kinds already built)", flush=True)
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
        r = measure(name, tensors, kinds, args.repeats)
        rows.append(r)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
