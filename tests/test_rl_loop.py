"""The colocated RL step (bench/rl/) on 2 and 4 real Gloo processes with a tiny transformers model.

Checks the record the GPU run will produce: every phase timed on every step, the
rollout's weights bitwise equal to the trainer's after every sync (and the
weights really changed between syncs, so the check compares live values), the
lifecycle took the trainer's groups through pause / weight sync / resume, and the
JSON/PNG are written. The switch on several GPUs (the FSDP mesh on groups the
lifecycle takes down, the resume ahead, the sync in the backward) is compared
bit for bit with the step without it, on 2 ranks (FSDP) and 4 (HSDP). Skipped
without transformers (the optional ``models`` extra).
"""
from __future__ import annotations

import json
import os

import pytest

from tests._dist import run_distributed

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def _rank(rank, world_size, out_dir, mode="sequential", extra=()):
    from bench.rl import parse_args, run_step, write_outputs

    cfg = parse_args(["--device", "cpu", "--tiny", "--steps", "2", "--out", out_dir, "--policy", "DESTROY_DEFERRED",
                      "--mode", mode, *extra])
    rec = run_step(rank, world_size, cfg)
    if rank == 0:
        write_outputs(rec, out_dir)
    return rec


def test_rl_step_two_gloo_ranks(tmp_path):
    recs = run_distributed(_rank, 2, args=(str(tmp_path),), timeout=240)
    for rec in recs:
        assert rec["world_size"] == 2 and rec["mesh"] == [2] and rec["mesh_groups"] == ["trainer.mesh.shard"]
        assert rec["reload_order"] == "first_use" and rec["reload_categories"][:2] == ["params", "buffers"]
        assert rec["config"]["batch_ahead"] is True  # the default: the batch on the device before the reloads
        assert rec["initial_sync"]["bitwise_equal"]
        assert len(rec["steps"]) == 2
        for s in rec["steps"]:
            wc = s["weight_check"]
            assert wc["bitwise_equal"] and wc["ranks_agree"] and wc["mismatched"] == []
            assert wc["tensors"] == rec["initial_sync"]["tensors"] > 0
            assert s["generated_tokens"] == 2 * 4 and s["kv_cache_len"] >= 8
            assert s["offload_bytes"] > 0 and s["lifecycle_state"] == "ACTIVE"
            assert s["nccl_in_rollout"]["state"] == "DESTROYED" and s["nccl_in_rollout"]["live_groups"] == []
            assert s["nccl_in_rollout"]["process"]["others"] == []  # no group of the trainer's but the control group
            assert 0 < s["params_bytes"] < s["offload_bytes"]
            for k in ("offload_store_s", "reload_params_store_s", "gather_copy_s", "reload_rest_store_s", "weight_check_s"):
                assert s[k] >= 0
        # training changed the weights: each sync saw new values (the check is not comparing constants)
        digests = [rec["initial_sync"]["digest"]] + [s["weight_check"]["digest"] for s in rec["steps"]]
        assert len(set(digests)) == 3
        assert rec["lifecycle_stats"]["pauses"] == 2 and rec["lifecycle_stats"]["weight_syncs"] == 2
        assert rec["lifecycle_stats"]["resumes"] == 2
        phases = {(sp["step"], sp["phase"]) for sp in rec["spans"]}
        assert phases == {(i, p) for i in range(2) for p in ("train", "offload", "rollout", "weight_sync", "reload")} | {
            (2, "train"), (3, "train_plain"), (4, "train_plain")}  # the step after the last switch, then plain ones
        for sp in rec["spans"]:
            assert sp["end_s"] >= sp["start_s"] >= 0
        sm = rec["summary"]
        assert sm["weights_bitwise_equal_every_sync"] is True
        assert sm["switch_cost_s"] >= sm["switch_overhead_s"] - 1e-9  # the window plus the first step's extra
        assert sm["switch_overhead_s"] == pytest.approx(
            sm["phase_s"]["offload"] + sm["phase_s"]["weight_sync"] + sm["phase_s"]["reload"])
        assert sm["copy_time_at_line_s"] > 0 and sm["overhead_x_copy_time"] > 0
        assert rec["config"]["free"] == "allocator"  # the default the H200 measurements favour
        # the runtime's own spans, placed inside the phases that ran them (the lifecycle's and the store's)
        br = sm["runtime_spans_by_phase"]
        assert {"lifecycle.pause", "lifecycle.destroy", "offload"} <= set(br["offload"])
        # the sync after the rollout gathers over the mesh's groups, which the lifecycle took down at the pause:
        # they come back before it (the resume), for the sync and the training after it, and stay up
        assert {"lifecycle.resume", "lifecycle.rebuild", "lifecycle.weight_sync", "reload"} <= set(br["weight_sync"])
        assert "lifecycle.destroy" not in br["weight_sync"] and rec["sync_needs_no_group"] is False
        assert "reload" in br["reload"] and not any(k.startswith("lifecycle.") for k in br["reload"])
        assert rec["lifecycle_stats"]["rebuilds"] == rec["lifecycle_stats"]["destroys"] == 2  # once per step
        assert br["offload"]["lifecycle.pause"] <= sm["phase_s"]["offload"] + 1e-6
        assert br["weight_sync"]["lifecycle.resume"] <= sm["phase_s"]["weight_sync"] + 1e-6
    # both ranks generated from the same weights; digests agree across ranks
    assert recs[0]["steps"][-1]["weight_check"]["digest"] == recs[1]["steps"][-1]["weight_check"]["digest"]
    on_disk = json.loads((tmp_path / "rl_step_2.json").read_text())
    assert set(on_disk["summary"]["phase_s"]) == {"train", "offload", "rollout", "weight_sync", "reload"}
    assert os.path.getsize(tmp_path / "rl_step_2.png") > 1000
    # the simulator's model of the step reads the record (sim/calibrate/colocated.py)
    from sim.calibrate.colocated import compare, predict_step

    pred = predict_step(on_disk, preset="h200-1x")
    assert set(pred["phase_s"]) == set(on_disk["summary"]["phase_s"])
    assert all(v >= 0 for v in pred["phase_s"].values())
    assert compare(on_disk, pred)["phases"]["train"]["ratio"] == pytest.approx(1.0)


def test_bitwise_equal_compares_bits_not_values():
    import torch

    from bench.rl.weights import bitwise_equal
    from bench.rl.weights import digest as _digest

    a = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    assert bitwise_equal(a, a.clone())
    assert not bitwise_equal(a, torch.tensor([1.0, 0.0, float("nan")], dtype=torch.bfloat16))  # -0 vs +0
    one_ulp = a.clone()
    one_ulp.view(torch.int16)[0] += 1
    assert not bitwise_equal(a, one_ulp)
    assert not bitwise_equal(a, a.float())  # dtype differs
    assert _digest(a) == _digest(a.clone()) and _digest(a) != _digest(one_ulp)


def test_step_config_refuses_bad_values():
    from bench.rl import StepConfig

    with pytest.raises(ValueError, match="free must be"):
        StepConfig(free="pool")
    with pytest.raises(ValueError, match="steps must be >= 1"):
        StepConfig(steps=0)
    with pytest.raises(ValueError, match="needs sync_first and offload_in_backward"):
        StepConfig(sync_in_backward=True, sync_first=True)
    assert StepConfig(sync_first=True, offload_in_backward=True).sync_in_backward is True  # on exactly then
    assert StepConfig(sync_first=True).sync_in_backward is False
    with pytest.raises(ValueError, match="forward_from_rollout"):
        StepConfig(forward_from_rollout=True, sync_first=True)  # the rollout copy is not the trainer's weights
    assert StepConfig(sync_first=True, offload_in_backward=True).forward_from_rollout is True  # on exactly then
    assert StepConfig(sync_first=True, offload_in_backward=True, sync_in_backward=False).forward_from_rollout is False
    with pytest.raises(ValueError, match="overlap_reload .* needs --mode streamed"):
        StepConfig(overlap_reload=True, mode="overlapped")
    assert StepConfig(overlap_reload=True, mode="streamed").overlap_reload is True
    # the overlap keeps a window of the reload queued (FSDP2's pinned copy in the backward waits behind the queue),
    # unless told otherwise; 0 is every piece at once; the simulator models the same default
    from bench.rl.config import OVERLAP_WINDOW_MIB
    from sim.calibrate.switch_ngpu import OVERLAP_WINDOW_MIB as SIM_WINDOW, overlap_window_bytes

    assert StepConfig(overlap_reload=True, mode="streamed").stream_window_mib == OVERLAP_WINDOW_MIB == SIM_WINDOW
    assert StepConfig(overlap_reload=True, mode="streamed", stream_window_mib=0).stream_window_mib == 0
    assert StepConfig(mode="streamed").stream_window_mib is None
    with pytest.raises(ValueError, match="stream_window_mib must be >= 0"):
        StepConfig(stream_window_mib=-1)
    assert overlap_window_bytes({"overlap_reload": True, "config": {"stream_window_mib": 64}}) == 64 << 20
    assert overlap_window_bytes({"overlap_reload": True, "config": {"stream_window_mib": 0}}) is None
    assert overlap_window_bytes({"overlap_reload": True, "config": {}}) is None  # before the step set one
    assert overlap_window_bytes({"config": {}}) == OVERLAP_WINDOW_MIB << 20  # predicted as the flag runs it now


def test_the_channel_cap_goes_to_every_mesh_group_and_is_refused_where_it_cannot_apply():
    """--nccl-max-ctas: NCCL's maxCTAs on the mesh's groups (ProcessGroupNCCL's config.max_ctas, kept in each group's
    spec, so every rebuild re-makes it so); refused below 1, on the CPU (Gloo has no channels) and without the
    managed mesh (init_device_mesh's groups take no options)."""
    from bench.rl import StepConfig
    from bench.rl.command import parse_args
    from bench.rl.groups import mesh_group_options

    assert mesh_group_options(StepConfig(nccl_max_ctas=8), env={}) == (("config.max_ctas", 8),)
    assert mesh_group_options(StepConfig(), env={"NCCL_MAX_CTAS": "4"}) == ()
    assert mesh_group_options(StepConfig(nccl_max_ctas=8), env={"NCCL_MAX_CTAS": "8"}) == (("config.max_ctas", 8),)
    with pytest.raises(ValueError, match="NCCL_MAX_CTAS=4 in the environment replaces --nccl-max-ctas 8"):
        mesh_group_options(StepConfig(nccl_max_ctas=8), env={"NCCL_MAX_CTAS": "4"})
    assert parse_args(["--nccl-max-ctas", "12"]).nccl_max_ctas == 12
    assert parse_args([]).nccl_max_ctas is None
    with pytest.raises(ValueError, match="nccl_max_ctas must be >= 1"):
        StepConfig(nccl_max_ctas=0)
    with pytest.raises(ValueError, match="Gloo"):
        StepConfig(nccl_max_ctas=8, device="cpu")
    with pytest.raises(ValueError, match="managed-mesh"):
        StepConfig(nccl_max_ctas=8, managed_mesh=False)


def _options_run(rank, world_size):
    from refimpl.runtime import GroupError
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.torch_runtime.mesh_groups import build_mesh_groups

    rt = TorchRuntime("cpu")
    try:
        build_mesh_groups(rt, (world_size,), ("shard",), prefix="cap", options=(("config.max_ctas", 8),))
    except GroupError as e:
        refused = str(e)
    else:
        refused = ""
    mg = build_mesh_groups(rt, (world_size,), ("shard",), prefix="plain")
    # the RL step's groups with a cap (the config's CPU refusal aside: the cap is for the CUDA run it describes)
    import torch

    from bench.rl import StepConfig
    from bench.rl.groups import trainer_groups

    try:
        trainer_groups(rt, StepConfig(nccl_max_ctas=8, shard=world_size), world_size, torch.device("cpu"))
    except GroupError as e:
        step_refused = str(e)
    else:
        step_refused = ""
    return refused, rt.group_spec(mg.mine["shard"]).options, step_refused


def test_a_mesh_groups_options_reach_its_group():
    """build_mesh_groups hands the options to the runtime's group spec, which makes the group with them (as
    ProcessGroupNCCL options; on Gloo the runtime refuses them by name, so they are not dropped). The cap taking
    on NCCL, through every rebuild: tests/comm/test_channels_cuda.py."""
    from tests._dist import run_distributed

    refused, options, step_refused = run_distributed(_options_run, 1)[0]
    assert "group 'cap.shard'" in refused and "are NCCL process-group options but the backend is 'gloo'" in refused
    assert options == ()
    # the RL step's trainer groups hand --nccl-max-ctas to the mesh's groups
    assert "trainer.mesh" in step_refused and "{'config.max_ctas': 8}" in step_refused
