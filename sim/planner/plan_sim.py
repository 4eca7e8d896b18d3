"""The simulations behind ``timeshare plan``'s switch costs: one scenario per role state, offload set and PG policy.

:func:`simulate_node` builds the scenario for one role of a :class:`sim.planner.plan.Planner` on one node of its
cluster (meta tensors coarsened to :data:`SIM_TENSORS` per category), runs it with
:func:`sim.scenarios.runner.run_scenario` and reads the second step's phases, pinned host and device memory. A
scenario that does not finish (pinning fails, the job deadlocks) is an answer about that candidate: its costs
come back with ``failed`` set to the reason in the user's terms (:func:`sim_failure`). Results are kept per
process (:data:`SCENARIO_CACHE_SIZE`): the simulator is deterministic, so the same scenario gives the same result.
"""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import re
import time
from typing import Any, Iterator

log = logging.getLogger(__name__)
#: the loggers of the protocol code the simulated candidates run: quiet while they run (a candidate that fails is
#: an answer, reported once with its reason), unless the plan logs at DEBUG (``timeshare -vv plan``)
PROTOCOL_LOGGERS = ("refimpl", "sim")

#: at most this many tensors per category in a simulated role (same bytes; the steady-state copies do not depend on it)
SIM_TENSORS = 16
#: simulated scenarios kept across planners in one process (the layout stage, the "fits on N nodes" hint, tests):
#: the simulator is deterministic, so the same scenario gives the same result
SCENARIO_CACHE_SIZE = 512
_SCENARIO_CACHE: dict[str, dict[str, float]] = {}

def simulate_node(planner: Any, role: str, include: tuple[str, ...], pg_policy: str) -> dict[str, float]:
    """Offload/reload and lifecycle (of the layout's groups) costs of ``role`` of ``planner`` from one simulated node
    (cached per planner and per process)."""
    st = planner.states[role]
    key = (tuple(sorted(st.bytes.items())), include, pg_policy)
    if key in planner.sims:
        return planner.sims[key]
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import parse_scenario

    dp, tp = planner._mesh()
    n = dp * tp
    mesh = {"dp": dp, "tp": tp} if tp > 1 else {"dp": n}
    k = min(SIM_TENSORS, st.tensors)
    tensors = []
    for cat, b in sorted(st.bytes.items()):
        itemsize = 4 if cat == "optimizer" else 2
        numel = max(1, math.ceil(b / k / itemsize))
        tensors += [{"name": f"{cat}{i}", "shape": [numel], "dtype": "float32" if itemsize == 4 else "bfloat16",
                     "category": cat} for i in range(k)]
    offload = ({"backend": "local", "include": list(include)} if include
               else {"backend": "tms", "include": ["buffers"]})
    topology: Any = planner.cluster_ref
    if st.total > 0.8 * planner.m.gpu_bytes:
        # the state does not fit the GPU: simulate the copies on a GPU with room for it (copy and lifecycle
        # costs do not depend on the capacity); the analytic memory check marks the candidate infeasible
        from sim.presets import load_preset_data

        topology = copy.deepcopy(dict(planner.cluster_ref if isinstance(planner.cluster_ref, dict)
                                       else load_preset_data(planner.cluster_ref)))
        grow = math.ceil(st.total / planner.m.gpu_bytes) + 1
        for e in topology["node"]["elements"]:
            if e.get("kind") == "gpu":
                const = topology["constants"][e["hbm"]]
                const["value"] = const["value"] * grow
                const["source"] = f"plan: {grow} x the preset's GPU memory, to simulate copies of a state that does not fit"
    raw = {"name": f"plan-{role}", "topology": topology, "world_size": n, "mesh": mesh,
           "model": {"tensors": tensors}, "offload": offload, "pg_policy": pg_policy, "steps": 2,
           "workload": {"rollout_s": planner.rollout_full, "touch_groups": True}, "payload": "meta"}
    scenario_key = json.dumps(raw, sort_keys=True, default=str)
    if scenario_key in _SCENARIO_CACHE:  # the same scenario simulated before in this process (a deterministic run)
        planner.sims[key] = _SCENARIO_CACHE[scenario_key]
        return planner.sims[key]
    t0 = time.perf_counter()
    with quiet_protocol_logs():
        result, world, _plan = run_scenario(parse_scenario(raw), record_memory=True)
    planner.sim_wall_s += time.perf_counter() - t0
    if not result.ok:
        # a candidate that does not fit the host (pinning fails) or that the simulated job cannot finish is an
        # answer about that candidate, not a fault of the planner: it is infeasible, and the reason says why
        out = {"failed": sim_failure(result.violations, role, include, pg_policy), "offload_s": 0.0,
               "reload_s": 0.0, "sync_s": 0.0, "train_overhead_s": 0.0, "pinned": 0.0, "comm_train": 0.0,
               "rollout_resident": 0.0}
        planner.sims[key] = _SCENARIO_CACHE[scenario_key] = out
        return out
    ph = {p: v["max"] for p, v in result.data["phases"].items()}
    ranks = result.data["ranks"]
    # no per-tensor correction: after the first cycle the store copies each dtype's flat buffer per pinned
    # host segment (docs/calibration.md), so the copy count does not follow the tensor count (checked
    # against the full tensor list in tests/sim/planner/test_plan.py)
    extra = 0.0
    out = {
        "offload_s": ph["sleep"] + extra,
        "reload_s": ph["wake_up"] + extra,
        "sync_s": ph["update_weights"],
        "train_overhead_s": ph["train"],
        "pinned": max(r["peak_host_pinned_bytes"] or 0 for r in ranks),
        "comm_train": max(r["phase_peak_device_bytes"]["train"] for r in ranks) - st.total,
        "rollout_resident": rollout_resident(world),
    }
    planner.sims[key] = out
    if len(_SCENARIO_CACHE) >= SCENARIO_CACHE_SIZE:
        _SCENARIO_CACHE.pop(next(iter(_SCENARIO_CACHE)))
    _SCENARIO_CACHE[scenario_key] = out
    return out


@contextlib.contextmanager
def quiet_protocol_logs() -> Iterator[None]:
    """Raise the protocol code's loggers (:data:`PROTOCOL_LOGGERS`) above ERROR while a candidate is simulated: its
    failure (pinning past the host's memory, a peer that failed) is one reason in the plan's answer, not a hundred
    log lines; ``-vv`` (the planner's logger at DEBUG) keeps them."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    loggers = [logging.getLogger(name) for name in PROTOCOL_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def sim_failure(violations: list[str], role: str, include: tuple[str, ...], pg_policy: str) -> str:
    """The reason a simulated candidate did not finish, in the user's terms."""
    text = " ".join(violations)
    what = f"{role} offloading {'+'.join(include) or 'nothing'} with pg {pg_policy}"
    m = re.search(r"cannot allocate ([\d.]+) GiB of pinned host memory.*?pinnable limit ([\d.]+) GiB, pinned in use "
                  r"([\d.]+) GiB", text)
    if m:
        need = float(m.group(1)) + float(m.group(3))
        return f"host pinned memory {need:.0f} GiB > {float(m.group(2)):.0f} GiB per NUMA node ({what})"
    if "deadlock" in text.lower():
        return f"the simulated step deadlocks ({what}): {violations[0][:160]}"
    return f"the simulated step fails ({what}): {violations[0][:160] if violations else 'no detail'}"


def rollout_resident(world) -> float:
    """Device bytes a rank holds while the rollout runs (last step), the largest over ranks.

    The result's per-phase peak counts everything recorded at the phase's first and last
    instants, which includes the release that ends ``sleep`` and the reload that starts
    ``wake_up``; this reads the ledger strictly inside the rollout span instead.
    """
    eps = 1e-9
    best = 0
    for rt in world.runtimes:
        spans = [(s, e) for name, s, e in rt.spans if name == "rollout"]
        if spans:
            s, e = spans[-1]
            best = max(best, world.memory.peak_between(rt.rank, s + eps, max(s + eps, e - eps)))
    return best


__all__ = ["PROTOCOL_LOGGERS", "SCENARIO_CACHE_SIZE", "SIM_TENSORS", "quiet_protocol_logs", "rollout_resident", "sim_failure", "simulate_node"]
