"""The offload benchmark: ``python bench/offload_bench.py [--dry-run] ...`` is ``timeshare bench offload``.

See :mod:`bench.offload` for what it measures; ``--help`` for the options.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refimpl.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", "offload", *sys.argv[1:]]))
