"""What the checkpoint checksums cost: DCP save and load of an offloaded state with and without them.

``python -m bench.checkpoint_checksums [--gib 1] [--tensors 16] [--repeats 3] [--dir DIR] [--json]``

Builds ``--gib`` GiB of fp32 parameters in ``--tensors`` tensors on the CPU, attaches them to a
``local`` :class:`~refimpl.store.OffloadStore`, offloads (so the save reads the host buffers, the path a
switch-time checkpoint takes) and times, best of ``--repeats``:

* ``save``: :func:`refimpl.torch_runtime.dcp.save` with ``checksums=False`` and with ``checksums=True``
  (the write, then every item read back and CRC-32 summed);
* ``load``: torch's own ``dcp.load`` into the target in place (no staging, nothing verified), then
  :func:`refimpl.torch_runtime.dcp.load_into` with ``verify=False`` (staged: the all-or-nothing copy) and
  with ``verify=True`` (staged and every item verified first).

The checkpoint goes to ``--dir`` (default: a temporary directory, removed afterwards); the files are
read back from the page cache, as they would be right after a save. Each row gives the wall time and
the CPU time of this process (all its threads); on a shared machine the wall times are noisy and the CPU
times are the steadier measure of what the checksums add.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from typing import Any, Callable

import torch


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """``(wall s, CPU s of this process)`` of the fastest of ``repeats`` calls."""
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


def measure(gib: float = 1.0, tensors: int = 16, repeats: int = 3, root: str | None = None) -> dict[str, Any]:
    """``(wall s, CPU s)`` of the fastest of ``repeats`` runs of each save and load variant (see the module
    docstring)."""
    import torch.distributed.checkpoint as tdcp

    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime, dcp

    numel = int(gib * (1 << 30)) // 4 // tensors
    torch.manual_seed(0)
    model = torch.nn.ParameterDict({f"p{i}": torch.nn.Parameter(torch.randn(numel)) for i in range(tensors)})
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model, name="model")
    store.offload()
    tmp = root or tempfile.mkdtemp(prefix="ckpt-checksums-")
    out: dict[str, Any] = {"bytes": numel * 4 * tensors, "tensors": tensors}
    try:
        out["save_s"] = _best(lambda: dcp.save(store, f"{tmp}/plain", checksums=False), repeats)
        out["save_checksums_s"] = _best(lambda: dcp.save(store, f"{tmp}/summed"), repeats)
        store.reload()
        target = {"model": model.state_dict()}
        out["load_torch_s"] = _best(lambda: tdcp.load(target, checkpoint_id=f"{tmp}/summed"), repeats)
        out["load_staged_s"] = _best(lambda: dcp.load_into(target, f"{tmp}/summed", verify=False), repeats)
        out["load_verified_s"] = _best(lambda: dcp.load_into(target, f"{tmp}/summed"), repeats)
    finally:
        store.close()
        if root is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run :func:`measure` and print its table (or ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = measure(args.gib, args.tensors, args.repeats, args.dir)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    gb = r["bytes"] / 1e9
    print(f"{r['bytes'] / (1 << 30):.2f} GiB in {r['tensors']} tensors, best of {args.repeats}")
    for label, key, base in (("save, no checksums", "save_s", None), ("save, checksums", "save_checksums_s", "save_s"),
                             ("load, torch dcp.load (in place)", "load_torch_s", None),
                             ("load_into, staged, verify=False", "load_staged_s", "load_torch_s"),
                             ("load_into, staged, verified", "load_verified_s", "load_torch_s")):
        (wall, cpu), extra = r[key], ""
        if base:
            extra = f"  (+{wall - r[base][0]:.2f} s wall, +{cpu - r[base][1]:.2f} s CPU)"
        print(f"  {label:34s} {wall:7.2f} s wall {cpu:6.2f} s CPU  {gb / wall:5.2f} GB/s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
