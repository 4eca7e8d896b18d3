"""The colocated RLVR pipeline on a local Ray cluster (actor_train FSDP2 under a PGLifecycle, with the reference
copy, and actor_infer, 2 ranks each on the same CPU "GPUs"): bitwise equal to the same pipeline with no offload,
state offloaded after each call or kept per meta_info."""
import dataclasses

import pytest

from tests.worker._ray import start_ray



@pytest.fixture(scope="module")
def clusters():
    ray = start_ray()
    from bench.ray_pipeline import build

    cfg = {"vocab": 32, "hidden": 16, "layers": 2, "prompt_len": 3, "new_tokens": 3, "call_timeout_s": 120}
    _, roles = build(cfg, roles=2, ranks=2, device="cpu")
    yield roles
    ray.shutdown()


def _pcfg(**kw):
    from refimpl.worker.pipeline import PipelineConfig

    return PipelineConfig(**{"steps": 2, "batch": 3, "prompt_len": 3, "new_tokens": 3, "vocab": 32, **kw})


def test_pipeline_with_offload_is_bitwise_the_pipeline_without(clusters):
    from bench.ray_pipeline import run_once

    moved = run_once(clusters, _pcfg(offload=True), generation=1)
    after = {r: c.moves() for r, c in clusters.items()}
    kept = run_once(clusters, _pcfg(offload=False), generation=2)
    assert moved["losses"] == kept["losses"] and moved["sequences"] == kept["sequences"]
    assert moved["digests"] == kept["digests"], "the trained weights, bit for bit"
    assert moved["losses"][1] != moved["losses"][0], "the policy trained between the steps"
    # offload mode: every role ends offloaded, and state really moved
    for role, ranks in after.items():
        assert all(m["offloaded"] and m["offload"] >= 2 and m["reload"] >= 2 for m in ranks), (role, ranks)
    calls = {(c["role"], c["method"]): c for c in moved["calls"]}
    # the reference log-probs are served by actor_train and followed by its old log-probs, then its training:
    # the pipeline keeps the state on the device between them (is_offload_states=False) and offloads after training
    lp = [c for c in moved["calls"] if c["method"] == "compute_log_probs"]
    assert lp and all("offload_s" not in c for c in lp)
    assert "offload_s" in calls[("actor_train", "train_step")] and "onload_s" in calls[("actor_infer", "generate")]
    assert calls[("actor_infer", "generate")]["offload_bytes"] > 0
    # the trainer's group went down with its state and came back for training and for every weight sync
    life = moved["lifecycle"]
    assert life["state"] == "DESTROYED" and life["pauses"] >= 3 and life["resumes"] >= 2, life
    assert life["weight_syncs"] == 3, "the first sync and one per step"
    assert kept["lifecycle"]["state"] == "ACTIVE" and kept["lifecycle"]["pauses"] == 0
    # baseline: nothing moved
    for role, c in clusters.items():
        assert all(not m["offloaded"] for m in c.moves()), role
    assert not any("offload_s" in c or "onload_bytes" in c for c in kept["calls"] if c["method"] != "init_model")


def test_role_order_is_checked():
    from refimpl.worker.pipeline import check_order

    assert check_order(["actor_infer", "old_log_probs", "reference", "actor_train"])[1] == "old_log_probs"
    with pytest.raises(ValueError, match="'actor_infer' first, 'actor_train' last"):
        _pcfg(order=("reference", "actor_infer", "old_log_probs", "actor_train"))
    with pytest.raises(ValueError, match="steps must be >= 1"):
        dataclasses.replace(_pcfg(), steps=0)
