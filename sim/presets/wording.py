"""Preset text in words a user has: what a figure was measured or fitted on, without the project's own file names.

A preset's description and its constants' sources are read by users (``timeshare sim list``, the JSON of
``sim run``). The project's records live under ``bench/results/<date>-<machine>-<name>/``; the names of those
folders (``run1``, ``walk-probes``) and of the development notes mean nothing to a user, so :func:`in_user_words`
says instead which machine and which date a figure came from ("the project's 2 x H200 measurements of
2026-11-30"), names the public sources by their titles (the Relax report, the verl articles, ROLL's guide)
and drops commit hashes and issue numbers. :func:`basis` sums up a preset's constants by where they come from.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

#: the development notes' public sources, by their numbers
_SOURCES = {"000": "ROLL's guide", "002": "the verl articles", "003": "the verl articles", "004": "the Relax report"}
_MACHINES = {"h200": "one H200", "h200x2": "2 x H200", "cpu": "CPU"}


def _record(m: re.Match) -> str:
    date, machine = m.group("date"), m.group("machine")
    return f"the measurements on {_MACHINES.get(machine, machine)} of {date}"


_RULES: tuple[tuple[re.Pattern, Any], ...] = (
    # bench/results/2026-11-30-h200x2-walk-probes/x/y.json#key  ->  the project's 2 x H200 measurements of 2026-11-30
    (re.compile(r"(?:mean of )?bench/results/(?P<date>\d{4}-\d\d-\d\d)-(?P<machine>[a-z0-9]+)(?:-[\w.-]+)?(?:/[\w./#-]+)?"),
     _record),

    (re.compile(r"\b[\w.-]+\.json#\w+"), "the record"),
    (re.compile(r"/work/shared/GPU\.md"), "docs/gpu.md"),
    (re.compile(r"\bGPU\.md\b"), "docs/gpu.md"),
    (re.compile(r"/work/[\w./-]+"), "the project's notes"),
    (re.compile(r"seeds/(\d{3})(?:_\w+\.txt)?( section [\d.]+)?"),
     lambda m: _SOURCES.get(m.group(1), "a public source") + (f",{m.group(2)}" if m.group(2) else "")),
    (re.compile(r"\s*\(commit [0-9a-f]{6,40}\)"), ""),
    (re.compile(r"\bcommit [0-9a-f]{6,40}\b"), "an earlier version"),
    (re.compile(r"\s*\(?\bissue \d+\)?"), ""),
    (re.compile(r"\b(?:wave\d*|run\d+) record\b"), "record"),
    (re.compile(r"\bH200 run \d+, "), "H200, "),
    (re.compile(r"\b(?:sim/[\w/]+\.py|bench/[\w/]+\.py)\b"), "the simulator's calibration"),
)


def _unique_list(m: re.Match) -> str:
    items = list(dict.fromkeys(re.findall(r"'([^']*)'", m.group(1))))
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def in_user_words(text: str) -> str:
    """``text`` with the project's record paths, note names, commit hashes and issue numbers put in a user's words."""
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    text = re.sub(r"\[((?:'[^']*'(?:, )?)+)\]", _unique_list, text)
    return re.sub(r"\s{2,}", " ", text).replace(" ,", ",").replace("..", ".").strip()


#: where a constant's figure comes from, by the first words of its source
_KINDS = (("fitted", "fitted"), ("derived by timeshare sim calibrate", "fitted"), ("measured", "measured"),
          ("derived from measured", "measured"), ("assumption", "assumed"))


def basis(data: Mapping[str, Any]) -> str:
    """One line: how many of a preset's constants were measured, fitted, taken from datasheets or assumed."""
    counts: dict[str, int] = {}
    for c in (data.get("constants") or {}).values():
        src = str(c.get("source", "")).lower() if isinstance(c, Mapping) else ""
        kind = next((k for prefix, k in _KINDS if src.startswith(prefix)), "datasheet or public report")
        counts[kind] = counts.get(kind, 0) + 1
    order = ("measured", "fitted", "datasheet or public report", "assumed")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


__all__ = ["basis", "in_user_words"]
