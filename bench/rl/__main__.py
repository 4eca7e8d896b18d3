"""``python -m bench.rl``: the colocated RL step (:func:`bench.rl.command.main`); under ``torchrun`` one process a rank."""
from bench.rl.command import main

if __name__ == "__main__":
    raise SystemExit(main())
