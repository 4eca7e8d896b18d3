"""``timeshare sim compare A B``: two runs' phases side by side.

``A`` and ``B`` are each a result (``timeshare sim run --out``, or its ``--json`` envelope) or a
scenario (file or shipped example name), which is then run first; ``--set`` overrides apply to
the scenarios. The table lists, per phase of the last step, the mean over finished ranks of A and
of B and the ratio B/A, the switch cost of the last step (its pause, weight sync and wake plus what the
first collectives after a wake added, slowest rank: [Note: the switch cost] in :mod:`sim.machine.switch_cost`;
``-`` where the scenario does not touch its groups in training), then the peaks of GPU and pinned host memory (GiB) and simulated time (s).
"""
from __future__ import annotations

from typing import Any, Iterable

from sim.scenarios.result import PHASE_ORDER


def load_side(name: str, sets: Iterable[str] = ()) -> tuple[str, dict[str, Any]]:
    """(label, result dict) of one side: a result file as it is, a scenario after running it."""
    from sim.scenarios.scenario import ScenarioError
    from sim.scenarios.scenario_io import apply_overrides, read_scenario_raw

    raw = read_scenario_raw(name)
    if isinstance(raw, dict) and raw.get("format", "").startswith("timeshare/") and isinstance(raw.get("data"), dict):
        raw = raw["data"]
    if isinstance(raw, dict) and "ranks" in raw and "phases" in raw:
        if list(sets):
            raise ScenarioError(f"{name}: --set applies to scenarios, and this is a result file")
        return f"{name} (result)", raw
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import parse_scenario

    result, _world, _plan = run_scenario(parse_scenario(apply_overrides(raw, list(sets))))
    return f"{name} (simulated)", result.to_dict()


def _mean(d: dict[str, Any], phase: str) -> float | None:
    v = d.get("phases", {}).get(phase)
    return v.get("mean") if v else None


def _peak(d: dict[str, Any], key: str) -> float | None:
    vals = [r.get(key) for r in d.get("ranks", []) if r.get(key) is not None]
    return max(vals) / 2**30 if vals else None


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{"what", "unit", "a", "b", "ratio"}``: phases (s), memory peaks (GiB), simulated time (s)."""
    rows = []
    for phase in PHASE_ORDER:
        rows.append({"what": phase, "unit": "s", "a": _mean(a, phase), "b": _mean(b, phase)})
    rows.append({"what": "switch cost (max rank)", "unit": "s", "a": (a.get("switch_cost") or {}).get("max"),
                 "b": (b.get("switch_cost") or {}).get("max")})
    rows.append({"what": "peak GPU", "unit": "GiB", "a": _peak(a, "peak_device_bytes"), "b": _peak(b, "peak_device_bytes")})
    rows.append({"what": "peak pinned host", "unit": "GiB", "a": _peak(a, "peak_host_pinned_bytes"),
                 "b": _peak(b, "peak_host_pinned_bytes")})
    rows.append({"what": "simulated time", "unit": "s", "a": a.get("simulated_time_s"), "b": b.get("simulated_time_s")})
    for r in rows:
        r["ratio"] = (r["b"] / r["a"]) if r["a"] and r["b"] is not None else None
    return rows


def format_compare(label_a: str, label_b: str, a: dict[str, Any], b: dict[str, Any], rows: list[dict[str, Any]],
                   wide: bool = False) -> str:
    """The side-by-side table (:func:`refimpl.output.table`: units in the headers, at most 100 columns unless
    ``wide``)."""
    from refimpl.output import table, wrap

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    lines = [wrap(f"{side}: {label}: scenario {d.get('scenario')!r}, {d.get('world_size')} ranks, pg_policy "
                  f"{d.get('pg_policy')}, backend {d.get('offload_backend')}, ok {d.get('ok')}", wide=wide)
             for side, label, d in (("A", label_a, a), ("B", label_b, b))]
    body = [[f"{r['what']} ({r['unit']})", f(r["a"]), f(r["b"]), "-" if r["ratio"] is None else f"{r['ratio']:.3f}"]
            for r in rows]
    lines += ["", table(["what (unit)", "A", "B", "B/A (x)"], body, wide=wide, right=(1, 2, 3)),
              "phases: mean over finished ranks of the last step"]
    return "\n".join(lines)


__all__ = ["compare", "format_compare", "load_side"]
