"""The ``timeshare`` command (also ``python -m refimpl``).

Subcommands:

* ``sim``    run a simulated scenario (the built-in default when no file is given)
* ``bench``  measure the offload store against the baselines on this machine
* ``demo``   run a real offload/reload cycle with TorchRuntime on this machine

Each subcommand lives in its own module; this file only wires them up.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> (module that defines ``add_arguments(parser)`` and ``run(args) -> int``, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("sim.cli", "run a simulated scenario (default scenario when none is given)"),
    "bench": ("bench.cli", "benchmark the offload store against baselines"),
    "demo": ("refimpl.demo", "run a real offload/reload cycle on this machine"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timeshare", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # a subcommand whose module is missing stays listed but says why
            p.set_defaults(_missing=f"{name}: not available ({exc})")
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.command is None:
        # the main job: the default simulated scenario
        args = parser.parse_args(["sim", *(argv or [])])
    if getattr(args, "_missing", None):
        print(args._missing, file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
