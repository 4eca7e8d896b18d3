"""``timeshare`` imports only the subcommand it runs (issue 18: a 1,024-rank ``sim run`` in 2.5 s), and
parses every command line as the parser with every subcommand wired does."""
import subprocess
import sys
from pathlib import Path

import pytest

from refimpl.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]

COMMAND_LINES = [
    ["sim", "run", "default", "--quiet", "--set", "steps=2", "--no-fold"],
    ["-v", "sim", "run", "x.json", "--out", "r.json", "--max-est-gb", "2"],
    ["sim", "list"],
    ["sim", "compare", "a.json", "b.json", "--json"],
    ["sim", "validate", "rec.json"],
    ["plan", "--json"],
    ["bench", "offload", "--dry-run"],
    ["demo"],
]


def _parsed(parser, argv):
    ns = vars(parser.parse_args(argv))
    return {k: (getattr(v, "__qualname__", v) if callable(v) else v) for k, v in ns.items()}


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda a: " ".join(a))
def test_the_lazy_parser_parses_each_command_line_as_the_full_one(argv):
    assert _parsed(build_parser(argv, lazy=True), argv) == _parsed(build_parser(), argv)


@pytest.mark.parametrize("argv", [["sim", "bogus"], ["sim", "run", "--bogus"], ["nosuch"]], ids=" ".join)
def test_bad_command_lines_get_the_full_parsers_error(argv, capsys):
    errors = []
    for parser in (build_parser(argv, lazy=True), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] and "error:" in errors[0]


def test_sim_run_does_not_import_the_other_subcommands():
    code = ("import sys; from refimpl.cli import main; rc = main(['sim', 'list']); "
            "print(sorted(m for m in ('bench.cli', 'bench.validate', 'refimpl.demo', 'sim.commands.plan') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
