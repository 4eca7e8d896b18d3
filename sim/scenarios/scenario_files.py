"""Scenario documents as files: JSON or YAML, UTF-8 checked, and ``--set key=value`` overrides.

This module knows nothing about what a scenario means (that is :mod:`sim.scenarios.scenario`); it turns
a file or a shipped example's name into a parsed document, and applies overrides to it. Every
problem is one :class:`ScenarioFileError` line; :mod:`sim.scenarios.scenario` and :mod:`sim.scenarios.scenario_io`
report it as a :class:`sim.scenarios.scenario.ScenarioError`.

* :func:`read_document` reads ``.json``, ``.yaml`` / ``.yml`` (YAML needs ``pyyaml``, the
  ``yaml`` extra: ``pip install 'gpu-timeshare[yaml]'``) or a shipped example by name.
* :func:`apply_overrides` applies ``KEY=VALUE`` the way verl/ROLL users override configs: dotted
  keys (``workload.rollout_s=30``), integer parts index lists (``faults.0.ranks=[1]``), values
  parsed as JSON (numbers, ``true``/``false``, ``null``, lists, objects) and otherwise strings.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterable

YAML_SUFFIXES = (".yaml", ".yml")


class ScenarioFileError(ValueError):
    """A scenario file cannot be read or parsed, or an override is malformed; the message is one line."""


def read_document(path_or_name: str | Path) -> Any:
    """The parsed content of a scenario file or shipped example (see the module docstring)."""
    from sim.presets import PresetError, scenario_path

    path = Path(path_or_name)
    if not path.suffix and not path.exists():
        try:
            path = scenario_path(str(path_or_name))
        except PresetError as exc:
            raise ScenarioFileError(str(exc)) from None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioFileError(f"{path}: cannot read the scenario ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioFileError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                                "save the scenario as UTF-8") from None
    if path.suffix.lower() in YAML_SUFFIXES:
        try:
            import yaml
        except ImportError:
            raise ScenarioFileError(f"{path}: YAML scenarios need pyyaml (pip install 'gpu-timeshare[yaml]'), "
                                    "or write the scenario as JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            raise ScenarioFileError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioFileError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON if it parses (``30``, ``true``, ``[1, 2]``, ``{"a": 1}``), else the string itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(raw: Any, sets: Iterable[str]) -> Any:
    """A copy of ``raw`` with each ``KEY=VALUE`` applied (dotted keys; integer parts index lists)."""
    out = copy.deepcopy(raw)
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ScenarioFileError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. workload.rollout_s=30")
        parts = key.strip().split(".")
        if not isinstance(out, dict):
            raise ScenarioFileError(f"--set {key}: the scenario is not an object")
        node: Any = out
        for i, part in enumerate(parts[:-1]):
            where = ".".join(parts[: i + 1])
            if isinstance(node, list):
                node = node[_index(node, part, key)]
            elif isinstance(node, dict):
                if part not in node or node[part] is None:
                    node[part] = {}
                node = node[part]
            else:
                raise ScenarioFileError(f"--set {key}: {where} is a {type(node).__name__}, not an object or list")
        last = parts[-1]
        if isinstance(node, list):
            node[_index(node, last, key)] = parse_value(value)
        elif isinstance(node, dict):
            node[last] = parse_value(value)
        else:
            raise ScenarioFileError(f"--set {key}: {'.'.join(parts[:-1])} is a {type(node).__name__}, "
                                    "not an object or list")
    return out


def _index(node: list, part: str, key: str) -> int:
    if not part.lstrip("-").isdigit() or not -len(node) <= int(part) < len(node):
        raise ScenarioFileError(f"--set {key}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


__all__ = ["ScenarioFileError", "YAML_SUFFIXES", "apply_overrides", "parse_value", "read_document"]
