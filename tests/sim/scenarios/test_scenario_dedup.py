"""``local_dedup`` scenarios deduplicate: replicas declared or inferred from the model's parallelism (issue 11)."""
from __future__ import annotations

import copy

import pytest

from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import ScenarioError, parse_scenario

HSDP = {
    "name": "hsdp",
    "topology": "hgx-h200-8x",
    "world_size": 4,
    "mesh": {"ddp": 2, "fsdp": 2},
    "model": {"tensors": [
        {"name": "w", "shape": [4096, 64], "dtype": "bfloat16", "category": "params"},
        {"name": "m", "shape": [4096, 64], "dtype": "float32", "category": "optimizer"},
    ], "fsdp": 2},
    "offload": {"backend": "local_dedup"},
    "workload": {"rollout_s": 0.1, "touch_groups": False},
    "steps": 2,
    "payload": "real",
}


def _pinned(raw):
    result, _, _ = run_scenario(parse_scenario(raw))
    assert result.ok, result.violations
    return [r["peak_host_pinned_bytes"] for r in result.data["ranks"]], result


def test_local_dedup_keeps_about_half_of_local_per_rank_over_two_replicas_and_restores_every_byte():
    local = copy.deepcopy(HSDP)
    local["offload"] = {"backend": "local"}
    local_bytes, _ = _pinned(local)
    dedup_bytes, result = _pinned(HSDP)  # replicas inferred: the model shards over fsdp=2 of 4 ranks, 'ddp' is 2
    assert parse_scenario(HSDP).offload.replicate_over == ("ddp",)
    assert all(r["bitwise_equal"] for r in result.data["ranks"])
    for d, loc in zip(dedup_bytes, local_bytes):
        assert loc / 2 <= d <= loc / 2 + 4096, (d, loc)


def test_declared_replicas_on_a_meta_payload_at_8_ranks():
    raw = {"world_size": 8, "mesh": {"dp": 8}, "model": {"preset": "dense-7b", "fsdp": 2, "state": ["params"]},
           "offload": {"backend": "local_dedup", "replicate_over": ["dp"]}, "payload": "meta",
           "workload": {"touch_groups": False}}
    with pytest.raises(ScenarioError, match=r"^offload\.replicate_over: \['dp'\] \(8 replicas\) times"):
        parse_scenario(raw)
    raw["mesh"] = {"dp": 4, "fsdp": 2}
    dedup, _ = _pinned(raw)
    raw["offload"] = {"backend": "local"}
    local, _ = _pinned(raw)
    assert max(dedup) <= min(local) / 4 + 4096 * 8


@pytest.mark.parametrize("changes, message", [
    ({"model": {"preset": "dense-7b", "fsdp": 4}, "payload": "meta"},
     r"^offload\.backend: 'local_dedup' needs state held by several ranks"),
    ({"mesh": {"a": 2, "fsdp": 2}}, r"^offload\.replicate_over: the model's sharding .* leaves 2 replicas"),
    ({"offload": {"backend": "local", "replicate_over": ["ddp"]}}, r"^offload\.replicate_over: only the local_dedup"),
    ({"offload": {"backend": "local_dedup", "replicate_over": ["pp"]}}, r"^offload\.replicate_over: expected a list"),
])
def test_a_dedup_scenario_without_replicas_is_an_error_naming_the_field(changes, message):
    raw = {**copy.deepcopy(HSDP), **changes}
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(raw)
