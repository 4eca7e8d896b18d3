"""The command line's way into scenarios: read (JSON or YAML), override (``--set``), validate.

:func:`read_scenario_raw` and :func:`apply_overrides` are :mod:`sim.scenarios.scenario_files`' reader
and overrides with their errors reported as :class:`sim.scenarios.scenario.ScenarioError`;
:func:`load_scenario_with` does both and validates with :func:`sim.scenarios.scenario.parse_scenario`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from sim.scenarios import scenario_files
from sim.scenarios.scenario import Scenario, ScenarioError, parse_scenario
from sim.scenarios.scenario_files import YAML_SUFFIXES, parse_value


def read_scenario_raw(path_or_name: str | Path) -> Any:
    """The parsed document of a scenario file or shipped example; :class:`ScenarioError` (one line) if not."""
    try:
        return scenario_files.read_document(path_or_name)
    except scenario_files.ScenarioFileError as exc:
        raise ScenarioError(str(exc)) from None


def apply_overrides(raw: Any, sets: Iterable[str]) -> Any:
    """A copy of ``raw`` with each ``KEY=VALUE`` applied; :class:`ScenarioError` for a malformed one."""
    try:
        return scenario_files.apply_overrides(raw, sets)
    except scenario_files.ScenarioFileError as exc:
        raise ScenarioError(str(exc)) from None


def load_scenario_with(path_or_name: str | Path, sets: Iterable[str] = ()) -> Scenario:
    """Read, override and validate a scenario."""
    return parse_scenario(apply_overrides(read_scenario_raw(path_or_name), list(sets)))


__all__ = ["YAML_SUFFIXES", "apply_overrides", "load_scenario_with", "parse_value", "read_scenario_raw"]
