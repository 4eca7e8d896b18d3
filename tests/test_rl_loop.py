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
    # the switch intervals ([Note: the GIL's switch interval]): the switch's own by default, 0 the interpreter's
    from bench.rl.command import parse_args
    from refimpl.runtime.switch_interval import RESPONSIVE_SWITCH_INTERVAL_S

    assert StepConfig().thread_switch_interval_s == RESPONSIVE_SWITCH_INTERVAL_S
    assert parse_args(["--thread-switch-interval-us", "0"]).thread_switch_interval_s is None
    assert parse_args(["--thread-switch-interval-us", "500"]).thread_switch_interval_s == pytest.approx(5e-4)
    for name in ("thread_switch_interval_us", "pacer_switch_interval_us"):
        with pytest.raises(ValueError, match=f"{name} must be in"):
            StepConfig(**{name: -1})


def test_rl_step_streamed_switch_is_bitwise_and_counts_its_wait(tmp_path):
    """The streamed mode: the optimizer state's reload runs under the next step; every sync still bitwise,
    the training continues from the same state on both ranks, and the switch cost counts the step after."""
    recs = run_distributed(_rank, 2, args=(str(tmp_path), "streamed", ("--profile", "--no-batch-ahead")), timeout=240)
    for rec in recs:
        assert rec["mode"] == "streamed" and rec["policy"] == "DESTROY_DEFERRED"
        assert rec["config"]["batch_ahead"] is False  # the batch copied at each training step's start
        assert rec["thread_switch_interval_s"] == 0.0002  # the switch's background moves' ([Note: the GIL's ...])
        # the setup's objects frozen before the first step, every collection of the steps counted
        assert rec["gc_freeze"]["on"] is True and rec["gc_freeze"]["frozen_objects"] > 10_000
        assert len(rec["gc"]["count"]) == 3 and sum(rec["gc"]["count"]) > 0
        # off the sequential mode each rebuild warms trainer.dp (its backend left to the runtime's default)
        assert rec["lifecycle_stats"]["warm_ups"] == rec["lifecycle_stats"]["rebuilds"] >= 2
        sm = rec["summary"]
        assert sm["weights_bitwise_equal_every_sync"] is True
        rows = sm["switch_costs"]["rows"]
        assert rows and all(r["train_after_s"] is not None and r["switch_cost_s"] >= r["window_s"] for r in rows)
        assert sm["switch_cost_x_copy_time"] > 0 and 0 < sm["switch_cost_share_of_step"] < 1
        assert all(s["reload_rest_store_s"] >= 0 for s in rec["steps"])
    assert recs[0]["after_steps"][-1]["loss"] == recs[1]["after_steps"][-1]["loss"]  # same state on every rank
    # --profile: rank 0 traced the last switch's tail with the step after it, and a plain step; trace_gaps reads them
    from bench.gpu.trace_gaps import analyse, load, report

    traces = sorted(p.name for p in tmp_path.glob("profile_*.json"))
    assert traces == ["profile_switch_tail_1.json", "profile_train_plain_3.json"]
    for name in traces:
        a = analyse(load(str(tmp_path / name)))
        assert a["span_ms"] > 0 and "span" in report(name, a)


def test_rl_step_offload_in_backward_copies_early_and_trains_exactly_as_the_plain_step(tmp_path):
    """``--offload-in-backward``: each FSDP unit steps inside the backward and its params and optimizer state go
    to host memory right after (OffloadStore.copy_early); the offload takes those copies over. On two ranks every
    sync stays bitwise, the offload reuses every early byte of the steady steps (nothing found changed), and the
    training is the plain step's to the bit: the same losses as a run with one optimizer stepped after the
    backward."""
    extra = ("--steps", "3", "--offload-in-backward", "--overlap-reload")
    early = run_distributed(_rank, 2, args=(str(tmp_path / "early"), "streamed", extra), timeout=240)
    plain = run_distributed(_rank, 2, args=(str(tmp_path / "plain"), "streamed", ("--steps", "3")), timeout=240)
    for rec in early:
        assert rec["offload_in_backward"] is True and rec["summary"]["weights_bitwise_equal_every_sync"] is True
        units = rec["early_units_bytes"]
        assert len(units) == 4 and all(u > 0 for u in units)  # the head, two decoder layers, then the root
        first, *steady = rec["steps"]
        assert first["early_copy_bytes"] == 0 and first["early_skipped"] > 0  # nothing resident before a reload
        for s in steady:
            assert s["early_copy_bytes"] == sum(units) == s["early_reused_bytes"]
            assert s["early_redone_bytes"] == 0 and s["early_skipped"] == 0
            # --overlap-reload: the reload still streamed under the backward that copied them
            assert s["early_streaming_bytes"] == s["early_copy_bytes"]
            assert s["early_reused_bytes"] < s["offload_bytes"]  # the buffers are copied by the offload itself
    for e, p in zip(early, plain):
        assert p["offload_in_backward"] is False and all(s["early_copy_bytes"] == 0 for s in p["steps"])
        assert [s["loss"] for s in e["steps"]] == [s["loss"] for s in p["steps"]]
        assert [s["loss"] for s in e["after_steps"]] == [s["loss"] for s in p["after_steps"]]


def test_rl_step_sync_first_gives_the_rollout_the_weights_just_trained(tmp_path):
    """``--sync-first`` (verl's order): the weight sync reads the trainer's params before the offload, so each
    rollout holds the weights of the training step right before it (checked bitwise at the next quiet point
    against the digests taken after that step), nothing is reloaded for the sync, and the reload phase brings all
    of the state back; with early copies as well every early byte is still taken over."""
    extra = ("--steps", "3", "--sync-first", "--offload-in-backward", "--no-sync-in-backward")
    recs = run_distributed(_rank, 2, args=(str(tmp_path), "streamed", extra), timeout=240)
    for rec in recs:
        assert rec["config"]["sync_first"] is True and rec["summary"]["weights_bitwise_equal_every_sync"] is True
        digests = [rec["initial_sync"]["digest"]] + [s["weight_check"]["digest"] for s in rec["steps"]]
        assert len(set(digests)) == len(digests)  # every sync carried new weights
        assert rec["lifecycle_stats"]["weight_syncs"] == 0 and rec["lifecycle_stats"]["pauses"] == 3
        for s in rec["steps"]:
            assert s["reload_params_store_s"] == 0.0 and s["gather_copy_s"] > 0
            assert s["reload_bytes_last"] == s["offload_bytes"]  # the whole state came back in the reload phase
        for s in rec["steps"][1:]:
            assert s["early_reused_bytes"] == s["early_copy_bytes"] > 0
        order = [sp["phase"] for sp in rec["spans"] if sp["step"] == 1]
        assert order == ["train", "weight_sync", "offload", "rollout", "reload"]


#: the switch on several GPUs off: init_device_mesh's (1, 2) HSDP mesh, trainer.dp, the check on the world group
WITHOUT_NGPU = ("--no-managed-mesh", "--no-flat-mesh", "--no-rebuild-ahead", "--no-sync-in-backward",
                "--no-gather-in-rollout-dtype", "--no-forward-from-rollout")


def _with_and_without(rank, world_size, out_dir, extra):
    """The step with the switch on several GPUs (the defaults, and the reload overlapped with the step after it:
    ``--overlap-reload``), then without any of it, in the same processes (the first run's groups stay alive beside
    the second's)."""
    on = _rank(rank, world_size, f"{out_dir}/on", "streamed", (*extra, "--overlap-reload"))
    off = _rank(rank, world_size, f"{out_dir}/off", "streamed", (*extra, *WITHOUT_NGPU))
    return on, off


def _check_switch_ngpu(on, off, n_groups, served=True):
    """What the switch on several GPUs must give, against the same run without it (``served``: with the first
    forward after a switch served from the rollout's copy, the default)."""
    for a, b in ((on, off),):
        steps = [s["loss_local"] for s in a["steps"] + a["after_steps"]]
        assert steps == [s["loss_local"] for s in b["steps"] + b["after_steps"]]  # bit for bit
        assert [s["weight_check"]["digest"] for s in a["steps"]] == [s["weight_check"]["digest"] for s in b["steps"]]
    for rec in (on, off):
        assert rec["summary"]["weights_bitwise_equal_every_sync"] is True
        assert rec["overlap_reload"] is (rec is on)
        steady = rec["steps"][1:]  # with the overlap the early copies left while the reload still streamed
        assert all((s["early_streaming_bytes"] == s["early_copy_bytes"] > 0) if rec is on
                   else s["early_streaming_bytes"] == 0 for s in steady)
        digests = [rec["initial_sync"]["digest"]] + [s["weight_check"]["digest"] for s in rec["steps"]]
        assert len(set(digests)) == len(digests)  # every sync carried new weights
    # without it the world group carries the mesh's collectives and the check's; with it, none
    assert on["world_collectives"] == {"start": 0, "end": 0}
    assert off["world_collectives"]["end"] > off["world_collectives"]["start"]
    assert len(on["mesh_groups"]) == n_groups and off["mesh_groups"] == ["trainer.dp"]
    stats = on["lifecycle_stats"]
    assert stats["destroys"] == stats["rebuilds"] == n_groups * len(on["steps"]) and stats["weight_syncs"] == 0
    spans = {(sp["step"], sp["phase"]): sp for sp in on["spans"]}
    names = []
    for s in on["steps"]:
        held = s["nccl_in_rollout"]
        assert held["live_groups"] == [] and held["process"]["others"] == []  # in the rollout: the control group
        assert [g["name"] for g in held["process"]["groups"]] == ["world", "trainer.control"]
        assert held["process"]["nccl_communicators"] == 0
        assert s["mesh_problems"] == [] and s["lifecycle_state"] == "ACTIVE"
        names.append(tuple(s["mesh_names"]))
        # the resume ran on a thread from the reload phase and was joined in the next training step, before its
        # backward: the forward's all-gathers came from the rollout's copy (every unit, no collective)
        ahead, k = s["resume_ahead"], s["step"]
        assert ahead["join_at"] == ("backward" if served else "forward")
        assert spans[(k, "reload")]["start_s"] <= ahead["start_s"] <= spans[(k, "reload")]["end_s"]
        assert spans[(k + 1, "train")]["start_s"] <= ahead["join_at_s"] <= spans[(k + 1, "train")]["end_s"]
        assert ahead["end_s"] <= ahead["join_at_s"] + ahead["join_wait_s"] + 1e-3
        assert ahead["rebuild_s"] > 0 and ahead["warm_s"] > 0 and ahead["resume_s"] >= ahead["rebuild_s"]
        # the sync ran in the backward, unit by unit, and left nothing to the weight-sync phase
        early = s["early_sync"]
        assert [u["unit"] for u in early["units"]] == list(range(len(on["early_units_bytes"])))
        at = [u["at_s"] for u in early["units"]]  # issued one after the other inside the step's training phase
        assert at == sorted(at) and spans[(k, "train")]["start_s"] <= at[0] <= at[-1] <= spans[(k, "train")]["end_s"]
        assert early["bytes"] == sum(u["bytes"] for u in early["units"]) > 0
    assert len(set(names)) == len(names)  # the mesh named new groups after every rebuild
    after = on["steps"][1:] + on["after_steps"][:1]  # the training steps right after a switch
    units = len(on["early_units_bytes"])
    if served:
        assert all(a["forward_from_rollout"]["units"] >= units and a["forward_from_rollout"]["bytes"] > 0
                   for a in after)
    assert "forward_from_rollout" not in on["steps"][0] and "forward_from_rollout" not in on["after_steps"][1]
    assert served or not any("forward_from_rollout" in a for a in after)
    terms = on["summary"]["ngpu"]
    assert terms["resume_ahead"]["join_wait_s"] >= 0 and terms["early_sync"]["bytes"] > 0
    assert terms["resume_ahead"]["join_at"] == (["backward"] if served else ["forward"])
    assert (terms["forward_from_rollout"]["units"] >= units) if served else terms["forward_from_rollout"] is None
    assert terms["nccl_in_rollout"]["others"] == []
    assert off["summary"]["ngpu"]["resume_ahead"] is None and off["summary"]["ngpu"]["early_sync"] is None
    assert off["summary"]["ngpu"]["forward_from_rollout"] is None


def test_switch_ngpu_two_ranks_is_bitwise_and_leaves_no_group_in_the_rollout(tmp_path):
    """On 2 ranks (1-D FSDP over a managed mesh): the same losses and synced weights, bit for bit, as the step
    without the N-GPU switch; in the rollout no process group of the trainer is alive but the Gloo control group
    and the world group never carries a collective; every step's rebuild is followed by the mesh and FSDP2; the
    resume runs from the reload phase on a thread and is joined in the next forward; the sync runs in the
    backward per unit."""
    extra = ("--steps", "3", "--sync-first", "--offload-in-backward")
    for on, off in run_distributed(_with_and_without, 2, args=(str(tmp_path), extra), timeout=300):
        assert on["mesh"] == [2] and on["mesh_dims"] == ["shard"] and off["mesh"] == [1, 2]
        _check_switch_ngpu(on, off, n_groups=1)


def test_switch_ngpu_hsdp_four_ranks(tmp_path):
    """On 4 ranks the mesh is HSDP (2 x 2): four groups, each rank a member of one replicate and one shard group;
    the same checks as on 2 ranks, against the step without the N-GPU switch on the same mesh shape."""
    extra = ("--steps", "2", "--sync-first", "--offload-in-backward")
    outs = run_distributed(_with_and_without, 4, args=(str(tmp_path), extra), timeout=480)
    for rank, (on, off) in enumerate(outs):
        assert on["mesh"] == [2, 2] == off["mesh"] and on["mesh_dims"] == ["replicate", "shard"]
        assert on["mesh_groups"] == ["trainer.mesh.replicate0", "trainer.mesh.replicate1", "trainer.mesh.shard0",
                                     "trainer.mesh.shard1"]
        _check_switch_ngpu(on, off, n_groups=4)
        # this rank's two groups named anew at every rebuild; its peers in a group name the same torch group
        assert all(len(n) == 2 for n in (s["mesh_names"] for s in on["steps"]))
    for k in range(2):
        by_group = {}
        for rank, (on, _) in enumerate(outs):
            rep, shard = on["steps"][k]["mesh_names"]
            by_group.setdefault(("r", rank % 2), set()).add(rep)
            by_group.setdefault(("s", rank // 2), set()).add(shard)
        assert all(len(v) == 1 for v in by_group.values())


def test_switch_ngpu_joined_in_the_forward_without_the_rollout_copy(tmp_path):
    """``--no-forward-from-rollout``: the first forward after a switch all-gathers over the rebuilt groups, so its
    pre-hook joins the resume; bit for bit the same as the step without the N-GPU switch."""
    extra = ("--steps", "2", "--sync-first", "--offload-in-backward", "--no-forward-from-rollout")
    for on, off in run_distributed(_with_and_without, 2, args=(str(tmp_path), extra), timeout=300):
        _check_switch_ngpu(on, off, n_groups=1, served=False)


def test_switch_ngpu_with_the_logprob_pass_serves_it_from_the_rollout_copy(tmp_path):
    """``--logprob-pass`` on 2 ranks: every training step starts with a no-grad forward computing the old
    log-probs; after a switch it is filled from the rollout's copy like the training forward (the resume still
    joined before the backward), and its log-probs, the losses and the synced weights are bit for bit those of the
    step without the N-GPU switch, whose pass all-gathers over FSDP2's groups."""
    extra = ("--steps", "2", "--sync-first", "--offload-in-backward", "--logprob-pass")
    for on, off in run_distributed(_with_and_without, 2, args=(str(tmp_path), extra), timeout=300):
        _check_switch_ngpu(on, off, n_groups=1)
        steps_on, steps_off = on["steps"] + on["after_steps"], off["steps"] + off["after_steps"]
        assert [s["logprob_pass"]["sum"] for s in steps_on] == [s["logprob_pass"]["sum"] for s in steps_off]
        assert all(s["logprob_pass"]["tokens"] == 2 * 15 and s["logprob_pass"]["s"] > 0 for s in steps_on)
        assert on["config"]["logprob_pass"] is True and on["summary"]["logprob_pass_s"] > 0
        # the pass's all-gathers were served too: with the forward's and the backward's re-gathers more than the
        # 2 x units - 1 of a step without it
        units = len(on["early_units_bytes"])
        after = on["steps"][1:] + on["after_steps"][:1]
        assert all(a["forward_from_rollout"]["units"] >= 2 * units for a in after)


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
