"""The JSON Schemas under ``sim/schema/``, checked with ``jsonschema``, errors phrased by field path.

``check(raw, "scenario", ScenarioError)`` validates a parsed scenario against
``sim/schema/scenario.schema.json`` and raises the caller's error type with one
message that starts with the path of the offending field, in the project's
phrasing (``"workload.rollout_s: expected a number >= 0, got -1"``,
``"colour: unknown field (expected one of [...])"``, ``"world_size: required"``).
What a schema cannot say (a preset that does not exist, mesh sizes that must
multiply to the world size, a link missing from the topology) is checked in
code afterwards, in the same style.

:func:`check_fields` is the one hand-written check left: required and allowed
keys of an object, for the parts of the presets that have no schema (a
preset's sections and constants, a fault built from a dict outside a scenario).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schema"


@functools.cache
def _validator(name: str) -> Any:
    import jsonschema

    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    # the shipped schemas are checked against their meta-schema by tests/sim/scenarios/test_scenario.py, not in
    # every process that parses a scenario (20 ms of a 1,024-rank `timeshare sim run`)
    return jsonschema.validators.validator_for(schema)(schema)


def schema(name: str) -> dict[str, Any]:
    """The parsed schema ``sim/schema/<name>.schema.json``."""
    return _validator(name).schema


def field_path(parts: Iterable[Any], root: str = "") -> str:
    """``a.b[2].c`` from a JSON path (keys and list indices); ``root`` is prefixed."""
    out = root
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _expected(sch: Mapping[str, Any]) -> str:
    """What a schema node asks for, in words ("an integer >= 1", "a number between 0 and 1")."""
    t = sch.get("type")
    if t in ("integer", "number"):
        noun = "an integer" if t == "integer" else "a number"
        lo = sch.get("minimum", sch.get("exclusiveMinimum"))
        strict = "exclusiveMinimum" in sch and "minimum" not in sch
        hi = sch.get("maximum", math.inf)
        if lo is not None and math.isfinite(hi):
            return f"{noun} between {lo} and {hi}" + (f" (not {lo})" if strict else "")
        if lo is not None:
            return f"{noun} {'>' if strict else '>='} {lo}"
        return noun
    return {"object": "an object", "array": "a list", "string": "a string", "boolean": "true or false",
            "null": "null"}.get(t, f"one of {sch['enum']}" if "enum" in sch else "a valid value")


def _message(err: Any, root: str) -> str:
    path = field_path(err.absolute_path, root)
    where = path or "scenario"
    v, inst, sch = err.validator, err.instance, err.schema
    if v == "required":
        missing = next(k for k in err.validator_value if k not in inst)
        return f"{field_path([*err.absolute_path, missing], root)}: required"
    if v == "additionalProperties" and err.validator_value is False:
        allowed = set(sch.get("properties", {}))
        extra = sorted(k for k in inst if k not in allowed)[0]
        return f"{field_path([*err.absolute_path, extra], root)}: unknown field (expected one of {sorted(allowed)})"
    if v == "enum":
        return f"{where}: {inst!r} is not one of {list(err.validator_value)}"
    if v in ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{where}: expected {_expected(sch)}, got {inst!r}"
    if v == "minItems":
        return f"{where}: expected a list of at least {err.validator_value} item(s), got {inst!r}"
    if v == "uniqueItems":
        return f"{where}: items must be distinct, got {inst!r}"
    if v == "minLength":
        return f"{where}: expected a string of at least {err.validator_value} characters, got {inst!r}"
    if v in ("oneOf", "anyOf") and sch.get("description"):
        return f"{where}: {sch['description']}"
    return f"{where}: {err.message}"


def check(raw: Any, name: str, error: type[Exception], root: str = "") -> None:
    """Validate ``raw`` against schema ``name``; raise ``error`` naming the field of the most relevant problem.

    Errors are ranked as :func:`jsonschema.exceptions.best_match` does (the
    shallowest, most specific), so an unknown or missing top-level field is
    reported before a problem deep inside another.
    """
    from jsonschema.exceptions import best_match

    err = best_match(_validator(name).iter_errors(raw))
    if err is not None:
        raise error(_message(err, root))


def check_fields(raw: Any, where: str, required: Iterable[str], optional: Iterable[str],
                 error: type[Exception]) -> Mapping[str, Any]:
    """``raw`` must be an object with every ``required`` key and no key outside ``required`` + ``optional``."""
    required, optional = tuple(required), tuple(optional)
    if not isinstance(raw, Mapping):
        raise error(f"{where or 'top level'}: expected an object" + (f" (needs {list(required)})" if required else "")
                    + f", got {type(raw).__name__}")
    for k in required:
        if k not in raw:
            raise error(f"{field_path([k], where)}: required")
    for k in raw:
        if k not in required and k not in optional:
            raise error(f"{field_path([k], where)}: unknown field (expected one of {sorted(required + optional)})")
    return raw


__all__ = ["SCHEMA_DIR", "check", "check_fields", "field_path", "schema"]
