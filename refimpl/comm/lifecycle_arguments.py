"""Argument checks of :class:`refimpl.comm.PGLifecycle`'s constructor, made at the call.

A lifecycle built on a wrong argument would fail at its first pause, on every
rank, in the middle of a switch; a bare string as ``groups`` would even work,
on one group per letter. These checks refuse such arguments where they are
passed, with what was expected (:mod:`refimpl.arguments`).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from refimpl.arguments import ArgumentTypeError, describe, expect, expect_names
from refimpl.comm.gates import Gate
from refimpl.comm.group_plan import GroupPlanRules
from refimpl.comm.lifecycle_config import LifecycleConfig
from refimpl.runtime.base import GroupSpec, Runtime

CALL = "PGLifecycle(rt, groups, ...)"


def check_lifecycle_arguments(rt: Any, groups: Any, config: Any, gates: Any, facts: Any, resident: Any,
                              plan: Any) -> tuple[tuple[GroupSpec | str, ...], tuple[str, ...]]:
    """Raise :class:`~refimpl.arguments.ArgumentTypeError` for the first argument of the wrong type; return
    ``groups`` and ``resident`` as tuples (each is iterated once)."""
    expect(rt, Runtime, CALL, "rt", "a Runtime (TorchRuntime(device) or SimRuntime)")
    groups = _groups(groups)
    expect(config, LifecycleConfig, CALL, "config", "a LifecycleConfig or None", optional=True,
           hint="build one: LifecycleConfig(**options)" if isinstance(config, Mapping) else "")
    if isinstance(gates, (str, bytes)) or not isinstance(gates, Iterable):
        raise ArgumentTypeError(f"{CALL}: gates must be a sequence of Gate, got {describe(gates)}")
    for g in gates:
        expect(g, Gate, CALL, "every element of gates", "a Gate (name, predicate)")
    expect(facts, Mapping, CALL, "facts", "a mapping or None", optional=True)
    resident = expect_names(resident, CALL, "resident")
    expect(plan, GroupPlanRules, CALL, "plan", "a GroupPlanRules or None", optional=True)
    return groups, resident


def _groups(groups: Any) -> tuple[GroupSpec | str, ...]:
    expected = "a collection of group names (str) or GroupSpecs"
    if isinstance(groups, (str, bytes, GroupSpec)):
        raise ArgumentTypeError(f"{CALL}: groups must be {expected}, got {describe(groups)}; "
                                f"wrap a single group in a list: [{groups!r}]")
    if not isinstance(groups, Iterable):
        raise ArgumentTypeError(f"{CALL}: groups must be {expected}, got {describe(groups)}")
    out = tuple(groups)
    for g in out:
        expect(g, (str, GroupSpec), CALL, "every element of groups", "a group name (str) or a GroupSpec")
    return out


__all__ = ["check_lifecycle_arguments"]
