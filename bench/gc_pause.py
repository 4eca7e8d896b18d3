"""How long one full collection of Python's cyclic collector holds the GIL in the RL step's process, before and after
its setup is frozen ([Note: the collector in the switch] in bench/rl/gc_watch.py).

``python -m bench.gc_pause [--tiny] [--repeats 3]``

Imports what the step imports, builds its model on the CPU (``bench.rl.config.model_config``: about 1 B parameters,
or ``--tiny``), then times ``gc.collect()`` (a full collection) ``--repeats`` times, freezes the survivors as the
step does (``bench.rl.gc_watch.freeze_setup``) and times it again. Prints the tracked objects and the median of each.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time


def full_collection_s(repeats: int) -> float:
    """The median of ``repeats`` full collections, seconds."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        gc.collect()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    """Build, time, freeze, time again; print the figures. 0 on success, 2 on bad arguments."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="the tests' tiny model instead of the ~1 B one")
    p.add_argument("--repeats", type=int, default=3, help="full collections timed each way (default 3)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    import torch
    from transformers import Qwen2ForCausalLM

    from bench.rl.config import model_config
    from bench.rl.gc_watch import freeze_setup

    with torch.device("cpu"):
        model = Qwen2ForCausalLM(model_config(args.tiny))
    tracked = len(gc.get_objects())
    before = full_collection_s(args.repeats)
    frozen = freeze_setup()
    after = full_collection_s(args.repeats)
    gc.unfreeze()
    n = sum(q.numel() for q in model.parameters())
    print(f"model {n / 1e9:.2f} B parameters; {tracked:,} objects tracked")
    print(f"one full collection: {before * 1e3:.1f} ms; after freezing {frozen:,} objects: {after * 1e3:.2f} ms "
          f"(median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
