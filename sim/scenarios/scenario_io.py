"""The command line's way into scenarios: read (JSON or YAML) and override (``--set``).

:func:`read_scenario_raw` and :func:`apply_overrides` are :mod:`sim.scenarios.scenario_files`' reader
and overrides with their errors reported as :class:`sim.scenarios.scenario.ScenarioError`
(:func:`sim.scenarios.scenario.parse_scenario` validates what they give).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from sim.scenarios import scenario_files
from sim.scenarios.scenario import ScenarioError
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


__all__ = ["YAML_SUFFIXES", "apply_overrides", "parse_value", "read_scenario_raw"]
