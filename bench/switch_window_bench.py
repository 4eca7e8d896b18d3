"""Switch-window cost of each process-group policy (simulated 8 ranks x 14 groups); same as
``timeshare bench switch-window``. Prints the table with ratios against the DESTROY baseline.

    python bench/switch_window_bench.py [--dp 4 --tp 2 --steps 4 --rollout-s 60 --json out.json]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import switch_window  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=switch_window.__doc__.split("\n\n")[0])
    switch_window.add_arguments(parser)
    sys.exit(switch_window.run(parser.parse_args()))
