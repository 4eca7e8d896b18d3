"""The walk of one offload: which store module each stage of ``Offload.run`` enters, in order.

``python -m bench.store_walk [--verbose]``

For each path (streamed, steady, full) it runs one ``OffloadStore.offload(include=...)`` of a small
state on the CPU under ``sys.setprofile`` and records every call made *from*
``refimpl/store/moves/offload.py`` (the driver's stage methods) into another module of
``refimpl/store``, as ``module:stage>callee``, with consecutive calls into the same module
collapsed. A module that appears twice is a re-entry: the walk left it for another stage and came
back. Calls below the stages (the backend, the source, the pool) are not listed: each stage's
module owns them. Deterministic; no GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

from bench.store_overhead import small_state

_STORE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "refimpl", "store") + os.sep
_DRIVER = os.sep + "offload.py"


def walk(path: str) -> list[tuple[str, str]]:
    """``(module, "stage>callee")`` of every store module the offload's stages enter, for ``path``."""
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.torch_runtime import TorchRuntime

    rt = TorchRuntime(torch.device("cpu"))
    state = small_state("moe", 16, rt.device)
    store = OffloadStore(rt, config=StoreConfig(pin_ahead="off"))
    for cat, tensors in state.items():
        store.attach_tensors(cat, tensors, name=cat.value)
    include = list(state)
    if path != "streamed":
        for _ in range(2):
            store.offload(include)
            store.reload()
    if path == "full":
        cat = next(iter(state))
        name = next(iter(state[cat]))
        state[cat][name] = state[cat][name].clone()  # one tensor re-assigned
    seq: list[tuple[str, str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        f, back = frame.f_code.co_filename, frame.f_back
        if back is None or not f.startswith(_STORE) or f.endswith(_DRIVER):
            return
        if back.f_code.co_filename.endswith(_DRIVER):
            module = f[len(_STORE):]
            if not seq or seq[-1][0] != module:
                seq.append((module, f"{back.f_code.co_name}>{frame.f_code.co_name}"))

    sys.setprofile(profile)
    try:
        store.offload(include)
    finally:
        sys.setprofile(None)
    took = store.stats().last_offload_path
    store.reload()
    store.close()
    if took != path:
        raise RuntimeError(f"the offload took the {took} path, not {path}")
    return seq


def main(argv: list[str] | None = None) -> int:
    """Print each path's walk and its re-entries."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verbose", action="store_true", help="print every entry (module:stage>callee)")
    a = p.parse_args(argv)
    for path in ("streamed", "steady", "full"):
        seq = walk(path)
        modules = [m for m, _ in seq]
        again = sorted({m for m in modules if modules.count(m) > 1})
        print(f"{path}: {' -> '.join(modules)}  (re-entered: {', '.join(again) or 'none'})")
        if a.verbose:
            print("    " + " -> ".join(f"{m}:{w}" for m, w in seq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
