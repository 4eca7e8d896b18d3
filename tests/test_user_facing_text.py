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
