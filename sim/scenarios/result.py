"""The result of a simulated scenario: per-rank outcomes, phase times, memory, and invariant violations.

:func:`judge` looks at what every rank reported and at the world, and lists
the invariants that were broken. A scenario run is ``ok`` when there are none:

* no deadlock and no collective mismatch (the simulator stops on both);
* every rank that finished got every tensor back bitwise equal (real payloads
  through the offload store);
* every rank that finished ended in the same lifecycle state;
* no rank failed, crashed or hung unless the fault plan injected a fault
  (with faults, failures are outcomes to report, not violations).

:meth:`ScenarioResult.to_dict` is the JSON the ``timeshare sim run`` command
writes; :meth:`ScenarioResult.table` the per-rank, per-phase summary it prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sim.presets.models import describe

if TYPE_CHECKING:  # pragma: no cover
    from sim.machine.faults import FaultPlan
    from sim.scenarios.scenario import Scenario
    from sim.machine.topology import Topology
    from sim.world import SimWorld

PHASE_ORDER = ("train", "sleep", "update_weights", "rollout", "wake_up")


@dataclass
class RankOutcome:
    """What one rank's scenario coroutine reported (filled in as it goes)."""

    rank: int
    finished: bool = False
    state: str = "n/a"
    bitwise_equal: bool | None = None
    bitwise_note: str = ""
    mismatched: list[str] = field(default_factory=list)
    phases: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    lifecycle_stats: dict[str, int] = field(default_factory=dict)
    host_pinned_store: int | None = None


@dataclass
class ScenarioResult:
    """Everything a run produced; ``violations`` empty means every invariant held."""

    data: dict[str, Any]
    violations: list[str]

    @property
    def ok(self) -> bool:
        """True when no invariant was violated."""
        return not self.violations

    @property
    def exit_code(self) -> int:
        """0 when every invariant held, 3 otherwise (the CLI's exit status, refimpl.cli_errors.EXIT_INVARIANT)."""
        return 0 if self.ok else 3

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready result."""
        return {**self.data, "ok": self.ok, "violations": list(self.violations)}

    def table(self, max_rows: int = 64, *, wide: bool = False) -> str:
        """The per-rank table (the last step's phase times, memory peaks), a blank line, then the summary lines.

        Consecutive ranks with the same figures share a row (``0-7``); the status column is left out when every
        rank finished, the PG-state column when no rank has a lifecycle (pg ``none``). One library draws every
        ``timeshare`` table (:func:`refimpl.output.table`): units in every header, at most 100 columns unless
        ``wide``."""
        from refimpl.output import table, wrap

        ranks = self.data["ranks"]
        cols = [p for p in PHASE_ORDER if any(p in r["phases"] for r in ranks)]
        words = [k for k, keep in (("status", any(r["status"] != "finished" for r in ranks)),
                                   ("lifecycle_state", any(r["lifecycle_state"] != "-" for r in ranks))) if keep]
        # headers of a few short lines, so that the phase and memory columns fit in 100
        head = ["rank", *({"status": "status", "lifecycle_state": "PG state"}[k] for k in words),
                *(f"{c.replace('_', '_' + chr(10))}\n(s)" for c in cols), "peak\nGPU\n(GiB)", "rollout\nGPU\n(GiB)",
                "pinned\nhost\n(GiB)", "bitwise"]
        groups: list[tuple[list[int], list[str]]] = []
        made: dict[tuple, list[str]] = {}  # a folded run's ranks share their representative's dicts: cells made once
        for r in ranks:
            key = (id(r["phases"]), id(r["phase_peak_device_bytes"]), *(r[k] for k in words), r["peak_device_bytes"],
                   r["peak_host_pinned_bytes"], r["bitwise_equal"])
            cells = made.get(key)
            if cells is None:
                phases = ["-" if r["phases"].get(c) is None else f"{r['phases'][c]:.4f}" for c in cols]
                cells = made[key] = [
                    *(str(r[k]) for k in words), *phases, _gib(r["peak_device_bytes"]),
                    _gib(r["phase_peak_device_bytes"].get("rollout")), _gib(r["peak_host_pinned_bytes"]),
                    _bit(r["bitwise_equal"])]
            if groups and groups[-1][1] == cells and groups[-1][0][-1] == r["rank"] - 1:
                groups[-1][0].append(r["rank"])
            else:
                groups.append(([r["rank"]], cells))
        rows = [[f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]), *cells] for g, cells in groups[:max_rows]]
        text_cols = (0, *range(1, 1 + len(words)), len(head) - 1)  # words never folded: as wide as the longest
        widths = {i: max([len(head[i].split()[-1])] + [len(row[i]) for row in rows]) for i in text_cols}
        first = 1 + len(words)
        lines = [table(head, rows, wide=wide, right=tuple(range(first, first + len(cols) + 3)), min_widths=widths)]
        if len(groups) > max_rows:
            lines.append(f"... {sum(len(g) for g, _ in groups[max_rows:])} more ranks (see the JSON result)")
        if "status" not in words:
            lines.append("every rank finished")
        d = self.data
        lines.append("")
        lines.append(wrap(
            f"scenario {d['scenario']!r} on {d['topology']['name']} ({d['world_size']} ranks, {d['payload']} payload, "
            f"pg_policy {d['pg_policy']}, backend {d['offload_backend']}): simulated {d['simulated_time_s']:.3f} s "
            f"in {d['wall_time_s']:.2f} s wall, {d['events']} events", wide=wide))
        lines.append("phase times are the last step's; GPU and host memory are peaks")
        lines.append("result: OK" if self.ok else "result: INVARIANT VIOLATED\n" + "\n".join(
            wrap(v, wide=wide, indent="  ") for v in self.violations))
        return "\n".join(lines)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _bit(b: bool | None) -> str:
    return {True: "equal", False: "DIFFERENT", None: "n/a"}[b]


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if ranks == list(range(ranks[0], ranks[-1] + 1)) else ", ".join(map(str, ranks[:8])) + ("..." if len(ranks) > 8 else "")


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "mean": sum(values) / len(values), "max": max(values)} if values else {}


def rank_switch_cost(phases_by_step: list[dict[str, float]]) -> float | None:
    """One rank's switch cost in the last step ([Note: the switch cost] in :mod:`sim.machine.switch_cost`): its ``sleep``,
    ``update_weights`` and ``wake_up``, plus what the first collectives after a wake added beyond the collectives
    (``first_use_extra``, timed in the training phase that follows a wake: the last step's own, after the step
    before's wake, as every step is alike in steady state). None without a lifecycle phase or a timed first use
    after a wake (one step, or no ``touch_groups``)."""
    from sim.machine.switch_cost import switch_cost

    if len(phases_by_step) < 2:
        return None
    last = phases_by_step[-1]
    if "first_use_extra" not in last or not all(p in last for p in ("sleep", "update_weights", "wake_up")):
        return None
    return switch_cost(last["sleep"], last["update_weights"], last["wake_up"], last["first_use_extra"]).total


def rank_entry(o: RankOutcome, rr: Any, memory: Any) -> dict[str, Any]:
    """One rank's part of the result: how it ended, its phases and switch cost, its memory peaks (overall and per
    phase); ``rr`` is the rank's :class:`sim.world.RankReport`, ``memory`` the world's simulated memory."""
    led = memory.ledger(o.rank) if hasattr(memory, "ledger") else None
    spans = {name: (s, e) for name, s, e in rr.spans if name in PHASE_ORDER}
    phase_peaks = {}
    if hasattr(memory, "peak_between"):
        phase_peaks = {name: memory.peak_between(o.rank, s, e) for name, (s, e) in spans.items()}
    status = "finished" if o.finished else rr.status if rr.status not in ("finished",) else "failed"
    entry = {
        "rank": o.rank,
        "status": status,
        "lifecycle_state": o.state,
        "bitwise_equal": o.bitwise_equal,
        "bitwise_note": o.bitwise_note,
        "mismatched_tensors": o.mismatched,
        "error": o.error,
        "last_op": rr.last_op,
        "phases": o.phases[-1] if o.phases else {},
        "phases_by_step": o.phases,
        "peak_device_bytes": led.device_peak if led else None,
        "peak_host_pinned_bytes": led.host_pinned_peak if led else None,
        "phase_peak_device_bytes": phase_peaks,
        "lifecycle_stats": o.lifecycle_stats,
    }
    cost = rank_switch_cost(o.phases)
    if cost is not None:  # only where timed (a scenario that touches its groups, two steps or more)
        entry["switch_cost"] = cost
    return entry


def judge(
    scn: "Scenario",
    topo: "Topology",
    world: "SimWorld",
    plan: "FaultPlan | None",
    outcomes: list[RankOutcome] | None,
    error: dict[str, Any] | None,
    wall_s: float,
    *,
    entries: list[dict[str, Any]] | None = None,
) -> ScenarioResult:
    """Build the result of a run and list the violated invariants (see the module docstring).

    ``entries``: every rank's part of the result (:func:`rank_entry`) when the caller has them (a folded run
    copies its representatives'); else they are made from ``outcomes`` and the world's report.
    """
    report = world.report()
    memory = world.memory
    fired = list(plan.fired) if plan is not None else []
    violations: list[str] = []
    unfinished: dict[tuple[str, str], list[int]] = {}
    if error is not None:
        violations.append(f"{error['kind']}: {error['message']}")
    if entries is None:
        entries = [rank_entry(o, rr, memory) for o, rr in zip(outcomes or (), report.ranks)]
    ranks = entries
    for r in ranks:
        status = r["status"]
        if status == "finished" and r["bitwise_equal"] is False:
            violations.append(f"rank {r['rank']}: tensors not bitwise equal after reload: {r['mismatched_tensors'][:5]}")
        if status != "finished" and not fired and error is None:
            unfinished.setdefault((status, r["error"] or r["last_op"]), []).append(r["rank"])
    for (status, why), who in unfinished.items():
        names = f"rank {who[0]}" if len(who) == 1 else f"{len(who)} ranks ({_span(who)})"
        violations.append(f"{names} did not finish ({status}) and no fault was injected: {why}")
    states = {r["lifecycle_state"] for r in ranks if r["status"] == "finished"}
    if len(states) > 1:
        violations.append(f"finished ranks ended in different lifecycle states: {sorted(states)}")
    finished = [r for r in ranks if r["status"] == "finished"]
    phase_summary = {p: _stats([r["phases"][p] for r in finished if p in r["phases"]]) for p in PHASE_ORDER}
    costs = [r["switch_cost"] for r in finished if r.get("switch_cost") is not None]
    numa = getattr(memory, "numa", {})
    data = {
        "scenario": scn.name,
        "description": scn.description,
        "topology": {"name": topo.name, "nodes": topo.nodes, "gpus_per_node": topo.gpus_per_node},
        "world_size": scn.world_size,
        "mesh": dict(scn.mesh),
        "payload": scn.payload,
        "steps": scn.steps,
        "seed": scn.seed,
        "pg_policy": scn.pg_policy,
        "offload_backend": scn.offload.backend,
        "model": describe(scn.model),
        "error": error,
        "faults_fired": [{"time": f.time, "rank": f.rank, "kind": f.kind, "where": f.where} for f in fired],
        "phases": {p: v for p, v in phase_summary.items() if v},
        **({"switch_cost": _stats(costs)} if costs else {}),  # the last step's, over finished ranks, where timed
        "host_memory": {n: {"pinned_peak_bytes": led.pinned_peak, "used_peak_bytes": led.used_peak}
                        for n, led in numa.items() if led.used_peak},
        "ranks": ranks,
        "simulated_time_s": report.time,
        "wall_time_s": wall_s,
        "events": report.events,
    }
    return ScenarioResult(data, violations)


__all__ = ["PHASE_ORDER", "RankOutcome", "ScenarioResult", "judge", "rank_entry", "rank_switch_cost"]
