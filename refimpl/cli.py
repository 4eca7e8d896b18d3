"""The ``timeshare`` command (also ``python -m refimpl``).

Subcommands:

* ``sim``    run a simulated scenario (the built-in default when no file is given)
* ``bench``  measure the offload store against the baselines on this machine
* ``demo``   run a real offload/reload cycle with TorchRuntime on this machine
* ``plan``   rank offload settings, PG policies and role orders for a model on a cluster

Exit codes (:mod:`refimpl.cli_errors`): 0 done, 1 a negative answer (``plan``: nothing
fits), 2 bad input (one line on stderr, nothing run), 3 an invariant violated, 4 a bug in
``timeshare`` (one line on stderr names the file the full report went to).

Each subcommand lives in its own module; this file only wires them up.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from refimpl import __version__

# subcommand -> (module that defines ``add_arguments(parser)`` and ``run(args) -> int``, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("sim.commands.simulate", "run a simulated scenario (default scenario when none is given)"),
    "bench": ("bench.cli", "benchmark the offload store against baselines"),
    "demo": ("refimpl.demo", "run a real offload/reload cycle on this machine"),
    "plan": ("sim.commands.plan", "rank offload settings for a model on a cluster (simulated RL step)"),
}


#: subcommands of ``timeshare sim`` that live above the simulator: they drive the benchmarks
SIM_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("bench.validate", "replay each record in the simulator; predicted against measured"),
}


def _asked_for(argv: list[str] | None) -> tuple[str | None, str | None]:
    """The subcommand and sub-subcommand a command line names (its first two words that are not options),
    or None for each it does not name."""
    words = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")]
    return (words[0] if words else None), (words[1] if len(words) > 1 else None)


def build_parser(argv: list[str] | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The ``timeshare`` parser. With ``lazy``, only the subcommand that ``argv`` names has its module
    imported and its arguments added (the others stay listed with their help): a command line that names
    a subcommand is parsed the same either way, and ``timeshare sim run`` skips importing the benchmark,
    demo and plan modules. Without a subcommand every one is wired, as without ``lazy``."""
    command, subcommand = _asked_for(argv) if lazy else (None, None)
    if command not in SUBCOMMANDS:
        command = subcommand = None
    parser = argparse.ArgumentParser(prog="timeshare", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"timeshare {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if command is not None and name != command:
            continue  # not the one asked for: argparse never looks at its arguments
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:  # a subcommand whose module is missing stays listed but says why
            p.set_defaults(_missing=f"{name}: not available ({exc})")
            continue
        subs = mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
        for extra, (extra_module, extra_help) in (SIM_SUBCOMMANDS.items() if name == "sim" else ()):
            if subcommand is not None and subcommand != extra and subcommand in subs.choices:
                continue  # `timeshare sim run`: the sim subcommand asked for is another one
            e = subs.add_parser(extra, help=extra_help)
            extra_mod = importlib.import_module(extra_module)
            extra_mod.add_arguments(e)
            e.set_defaults(_run=extra_mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run its subcommand; no subcommand runs ``sim`` with the same
    arguments. Returns the exit status (see the module docstring). Nothing reaches the terminal as a traceback: bad
    input (a :class:`~refimpl.cli_errors.CliInputError`, which the simulator's and planner's input errors are) is one
    ``error:`` line and 2, an unexpected exception is one line naming the report file and
    :data:`~refimpl.cli_errors.EXIT_BUG`, an interrupt 130, a reader of stdout that left 0."""
    from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_BUG, CliInputError, report_bug

    try:
        return _main(argv)
    except CliInputError as exc:  # bad input found by a subcommand's checks: one line, nothing run
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `timeshare plan | head`: the reader left; no traceback
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: one line and a report file, never a traceback
        print(report_bug(exc, argv), file=sys.stderr)
        return EXIT_BUG


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; ``timeshare plan``'s Hydra overrides may stand anywhere among its options, as on a trainer's
    command line (``plan CONFIG.yaml --layouts given data.train_batch_size=512``), so words left over that are not
    options join its overrides in their order; anything else left over is argparse's usual error."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "command", None) == "plan" and not any(w.startswith("-") for w in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv, lazy=True)
    args = _parse(parser, argv)
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
