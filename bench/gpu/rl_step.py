"""A colocated RL step on one GPU or several: see :mod:`bench.rl` for what each phase does.

    torchrun --nproc-per-node=N bench/gpu/rl_step.py [--free driver|allocator] [--out DIR]
    torchrun --nproc-per-node=2 bench/gpu/rl_step.py --device cpu --tiny --out DIR   # Gloo, seconds
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.rl import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
