"""For every mesh, group layout and workload Hypothesis draws: wherever plan_fold folds, the folded run's
result is the full run's, bit for bit (the JSON text apart from the wall-clock field).

Worlds are small (2-6 HGX nodes, a few tensors per rank) so the full run is cheap; what is drawn is
what the fold's symmetry checks reason about: mesh dimension order and sizes (groups aligned with
nodes, spanning them, straddling their borders), which families exist, collectives and an export
on them, steps, copy streams and the offload backend.
"""
from __future__ import annotations

import json

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.scenarios.fold import plan_fold
from sim.scenarios.fold_run import run_folded
from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import parse_scenario

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def scenarios(draw):
    """A valid multi-node scenario with meta payloads and no faults (the fold's domain)."""
    nodes = draw(st.integers(2, 6))
    n = 8 * nodes
    a = draw(st.sampled_from(_divisors(n)))
    b = draw(st.sampled_from(_divisors(n // a)))
    c = n // (a * b)
    names = draw(st.permutations(["dp", "tp", "pp"]))
    mesh = {name: size for name, size in zip(names, (a, b, c))}
    dims = list(mesh)
    families = []
    for i, fam_dims in enumerate(draw(st.lists(st.lists(st.sampled_from(dims), min_size=1, max_size=2, unique=True),
                                               min_size=1, max_size=3))):
        families.append({"name": f"g{i}", "dims": fam_dims})
    export = draw(st.none() | st.builds(lambda f, b: {"group": f, "bucket_bytes": b, "ipc_s": 0.01},
                                        st.sampled_from([f["name"] for f in families]),
                                        st.sampled_from([2**20, 2**24])))
    tensors = [{"name": f"t{i}", "shape": [draw(st.integers(1, 4)) * 2**20], "dtype": "bfloat16",
                "category": cat}
               for i, cat in enumerate(draw(st.lists(st.sampled_from(["params", "grads", "optimizer"]),
                                                     min_size=1, max_size=4)))]
    backend = draw(st.sampled_from(["local", "tms"]))
    return {
        "name": "drawn", "world_size": n, "topology": {"preset": "hgx-h200-8x-ib", "nodes": nodes},
        "mesh": mesh, "groups": families, "model": {"tensors": tensors},
        "offload": {"backend": backend, "include": ["params", "grads", "optimizer"]},
        "workload": {"train_s": draw(st.sampled_from([0.0, 0.5])), "rollout_s": 1.0,
                     "rollout_memory_fraction": draw(st.sampled_from([0.0, 0.3])),
                     "touch_groups": draw(st.booleans()), "export": export},
        "steps": draw(st.integers(1, 2)),
        "transport": {"streams": draw(st.sampled_from(["per_rank", "per_kind"]))},
    }


def _text(result) -> str:
    d = result.to_dict()
    d.pop("wall_time_s")
    return json.dumps(d, indent=1)


@SETTINGS
@given(raw=scenarios())
def test_wherever_a_scenario_folds_the_folded_result_is_the_full_one(raw):
    scn = parse_scenario(raw)
    fold, why = plan_fold(scn)
    full, _, _ = run_scenario(parse_scenario(raw))
    assert full.ok, full.violations[:3]
    event(f"folded: {fold is not None}")
    if fold is None:
        return  # nothing to compare; test_fold.py checks that the refusals are the intended ones
    folded, world, _ = run_folded(scn, fold)
    assert len(world.runtimes) == fold.active < scn.world_size
    assert _text(folded) == _text(full), why
