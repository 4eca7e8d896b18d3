"""Blind means blind: nothing the simulator or the runtime ships was fitted on a record that validation scores.

``sim.calibrate.records.VALIDATION_SET`` lists what ``timeshare sim validate`` scores ([Note: the records validation
scores]). These tests fail if a preset constant's ``source`` (or its ``records``) names one of them, its directory, or
a directory holding one; if a calibrated preset was fitted on one; or if validate would refuse one of them (it refuses
a record a preset was fitted on, so a scored record is one no fit read).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.validate import check_blind, fitted_on
from sim.calibrate.records import HELD_OUT, VALIDATION_SET, load_record
from sim.presets import PRESET_DIR

ROOT = Path(__file__).resolve().parents[3]
PRESETS = sorted([*PRESET_DIR.glob("*.json"), *(PRESET_DIR / "calibrated").glob("*.json")])


def _named(path: str, scored: str) -> bool:
    """True if ``path`` (a file or directory a source names) is ``scored`` or a directory holding it."""
    path = path.rstrip("/")
    return scored == path or scored.startswith(path + "/")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_preset_constant_names_a_scored_record(preset):
    data = json.loads(preset.read_text())
    bad = [(name, path, scored) for name, c in data.get("constants", {}).items()
           for path in fitted_on({"constants": {name: c}}) for scored in VALIDATION_SET if _named(path, scored)]
    assert not bad, f"{preset.name}: constants fitted on records validation scores: {bad}"
    fitted = (data.get("fitted_on") or {}).get("records", [])
    assert not [p for p in fitted for s in VALIDATION_SET if _named(p, s)]


def test_the_check_finds_a_constant_named_after_a_scored_record():
    """The test above can fail: a source naming a scored record (or its directory) is caught."""
    scored = VALIDATION_SET[0]
    for text in (f"fitted on {scored}#switch_window", f"derived from {scored.rsplit('/', 1)[0]}/"):
        paths = fitted_on({"constants": {"x": {"value": 1, "unit": "s", "source": text}}})
        assert any(_named(p, scored) for p in paths), text


@pytest.mark.parametrize("preset", sorted((PRESET_DIR / "calibrated").glob("*.json")), ids=lambda p: p.stem)
def test_validate_accepts_every_scored_record(preset):
    data = json.loads(preset.read_text())
    for path in VALIDATION_SET:
        check_blind(data, load_record(ROOT / path))  # raises RecordError for a record of the fit set


def test_the_held_out_records_are_scored():
    for d in HELD_OUT:
        assert any(s.startswith(d) for s in VALIDATION_SET), d
    for path in VALIDATION_SET:
        assert (ROOT / path).is_file(), path
