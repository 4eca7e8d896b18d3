"""``python -m bench.rl_loop``: the colocated RL step's command by the name earlier docs and records give it.

The step itself is the package :mod:`bench.rl` (``python -m bench.rl`` runs the same :func:`bench.rl.main`).
"""
from bench.rl import main

if __name__ == "__main__":
    raise SystemExit(main())
