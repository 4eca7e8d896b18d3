"""What the content digest costs: the check of early copies at the offload and ``local_dedup``'s replica check.

    python -m bench.digest_cost                          # CPU: 256 MiB in 64 tensors, best of 5
    python -m bench.digest_cost --device cuda --mib 8192 # one GPU (the figure docs/store.md asks for)

The digest ([Note: content digest] in ``refimpl/store/backends/digest.py``) reads every byte of what it checks:
``copy_early`` digests each range it copies and the offload digests those ranges again (one host synchronisation
for all); ``local_dedup`` digests each replicated tensor when a layout is first checked. This times
``content_digest`` over ``--mib`` MiB of fp32 in ``--tensors`` tensors against two references on the same bytes:
a copy of them (``clone``: what the offload's device-to-host copy reads and writes; on a CPU it is the copy itself)
and a bare int32 sum (one read). Best of ``--repeats`` after one warm-up; prints one line per measurement and the
digest's time as a multiple of each reference.
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Callable

import torch

from refimpl.store.backends.digest import content_digest


def _best(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls of ``fn`` (after one warm-up), device work included."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(device: str, mib: int, tensors: int, repeats: int) -> dict:
    """Seconds of the digest, a clone and an int32 sum over the same ``mib`` MiB in ``tensors`` tensors."""
    from refimpl.store.backends import digest as dg

    dev = torch.device(device)
    numel = (mib << 20) // 4 // tensors
    state = [torch.randn(numel, device=dev) for _ in range(tensors)]
    dg.release_digest_weights()
    t0 = time.perf_counter()
    fused = dg.fused_row_sums(dev)  # the one-time compile and probe (CUDA), paid at the store's first reload
    fused_setup_s = time.perf_counter() - t0
    digest_s = _best(lambda: content_digest(state).cpu(), dev, repeats)
    dg._FUSED[str(dev)] = None  # the same bytes through the eager row sums
    try:
        eager_s = _best(lambda: content_digest(state).cpu(), dev, repeats)
    finally:
        dg._FUSED[str(dev)] = fused
    clone_s = _best(lambda: [t.clone() for t in state], dev, repeats)
    sum_s = _best(lambda: [t.view(torch.int32).sum(dtype=torch.int32) for t in state], dev, repeats)
    gib = numel * tensors * 4 / (1 << 30)
    return {"device": str(dev), "mib": mib, "tensors": tensors, "repeats": repeats,
            "threads": torch.get_num_threads(), "digest_s": round(digest_s, 5), "clone_s": round(clone_s, 5),
            "int32_sum_s": round(sum_s, 5), "digest_gib_per_s": round(gib / digest_s, 2),
            "fused": fused is not None, "fused_setup_s": round(fused_setup_s, 3), "eager_digest_s": round(eager_s, 5),
            "eager_over_digest": round(eager_s / digest_s, 2),
            "digest_over_clone": round(digest_s / clone_s, 2), "digest_over_sum": round(digest_s / sum_s, 2)}


def main(argv: list[str] | None = None) -> int:
    """Run the measurement and print it (text, or JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = measure(args.device, args.mib, args.tensors, args.repeats)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"{r['mib']} MiB in {r['tensors']} fp32 tensors on {r['device']} ({r['threads']} threads), best of "
          f"{r['repeats']}:")
    how = f"fused row sums, built in {r['fused_setup_s']:.2f} s" if r["fused"] else "eager row sums"
    print(f"  content_digest  {r['digest_s'] * 1e3:9.2f} ms  ({r['digest_gib_per_s']} GiB/s; {how})")
    print(f"  eager digest    {r['eager_digest_s'] * 1e3:9.2f} ms  (= {r['eager_over_digest']} x the digest)")
    print(f"  clone           {r['clone_s'] * 1e3:9.2f} ms  (digest = {r['digest_over_clone']} x)")
    print(f"  int32 sum       {r['int32_sum_s'] * 1e3:9.2f} ms  (digest = {r['digest_over_sum']} x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
