"""User-facing text speaks of the project and of public sources, in words a user has: no development-note file
names, local paths, commit hashes, issue numbers or names of work records (CLI output, presets, docs/comparison.md)."""
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from refimpl.cli import main

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = re.compile(r"seeds/|seeds? 0\d\d|/work/|\bwave\d*\b|\bissue \d+|\bcommit [0-9a-f]{6,}|\(commit\b|"
                       r"bench/results/|\brun\d+\b", re.IGNORECASE)


def _text(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
    return out.getvalue()


def test_sim_list_lists_every_preset_with_its_basis_in_user_words():
    out = _text(["sim", "list"])
    assert not FORBIDDEN.search(out), FORBIDDEN.search(out)
    for name in ("hgx-h200-8x", "calibrated/hgx-h200-8x", "calibrated/h200-1x", "default", "Qwen2.5-7B"):
        assert name in out
    assert "measured" in out and "fitted" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("path", sorted([*(ROOT / "sim/presets").glob("*.json"),
                                         *(ROOT / "sim/presets/scenarios").glob("*.json")]), ids=lambda p: p.name)
def test_preset_descriptions_and_sources_are_in_user_words(path):
    raw = json.loads(path.read_text())
    # a constant's "records" are machine-read provenance (validate refuses those files), not text a user reads
    constants = {k: {f: v for f, v in c.items() if f != "records"} for k, c in raw.get("constants", {}).items()}
    text = json.dumps({"description": raw.get("description", ""), "constants": constants})
    assert not FORBIDDEN.search(text), FORBIDDEN.search(text)


def test_the_comparison_page_and_help_texts_are_in_user_words():
    page = (ROOT / "docs/comparison.md").read_text()
    assert not FORBIDDEN.search(page), FORBIDDEN.search(page)
    for argv in (["--help"], ["plan", "--help"], ["sim", "run", "--help"], ["bench", "offload", "--help"]):
        out = _text(argv)
        assert not FORBIDDEN.search(out), (argv, FORBIDDEN.search(out))


def test_in_user_words_names_the_machine_and_date_not_the_record():
    from sim.presets.wording import in_user_words

    text = ("fitted by timeshare sim calibrate (mean of bench/results/2026-11-30-h200x2-walk-probes/destroy-walk/"
            "x-nvidia-h200x2.json: 7 passes; seeds/004 section 4.4; commit 1f33585; /work/shared/GPU.md)")
    got = in_user_words(text)
    assert "2 x H200 of 2026-11-30" in got and "the Relax report, section 4.4" in got and "docs/gpu.md" in got
    assert not FORBIDDEN.search(got), got


#: what no user has, in any text a user reads: the development notes (seeds), local paths, issue numbers,
#: commit hashes (hex words with letters and digits), the names of work sessions; record folders under
#: bench/results/ are files in the repository, so the docs may name them
NOT_A_USERS = re.compile(r"seeds/|seeds? 0\d\d|/work/|\bissues? \d+|\bcommit [0-9a-f]{6,}|"
                         r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b|\bsessions?\b|"
                         r"\b(?:cli|misc|gpufix)\d+\b|\bwave\d+\b|-wave\b", re.IGNORECASE)


def _commands(parser, prefix=()):
    import argparse

    yield prefix
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))


def test_every_commands_help_is_in_user_words_and_fits_100_columns():
    from refimpl.cli import build_parser

    commands = list(_commands(build_parser()))
    assert ("sim", "calibrate") in commands and ("bench", "switch-window") in commands and ("plan",) in commands
    for argv in commands:
        out = _text([*argv, "--help"])
        assert "usage:" in out and not FORBIDDEN.search(out) and not NOT_A_USERS.search(out), (argv, out)
        assert max(len(line) for line in out.splitlines()) <= 100, argv


@pytest.mark.parametrize("argv", [["sim"], ["sim", "list"], ["plan", "--cluster", "h200-1x", "--model", "Qwen3-4B"],
                                  ["bench", "switch-window", "--dp", "2", "--tp", "1", "--steps", "2", "--warmup", "1",
                                   "--policy", "destroy"]], ids=" ".join)
def test_default_runs_print_nothing_a_user_does_not_have(argv):
    out = _text(argv)
    assert out and not FORBIDDEN.search(out) and not NOT_A_USERS.search(out), NOT_A_USERS.search(out)
    assert max(len(line) for line in out.splitlines()) <= 100


@pytest.mark.parametrize("path", sorted((ROOT / "sim/presets").rglob("*.json")),
                         ids=lambda p: str(p.relative_to(ROOT / "sim/presets")))
def test_every_presets_description_is_in_user_words(path):
    raw = json.loads(path.read_text())
    text = " ".join([str(raw.get("description", "")), str((raw.get("fitted_on") or {}).get("words", ""))])
    assert not NOT_A_USERS.search(text), NOT_A_USERS.search(text)


@pytest.mark.parametrize("path", sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")]), ids=lambda p: p.name)
def test_the_docs_name_nothing_a_user_does_not_have(path):
    hits = [(n, m.group(0)) for n, line in enumerate(path.read_text().splitlines(), 1)
            for m in NOT_A_USERS.finditer(line)]
    assert not hits, hits
