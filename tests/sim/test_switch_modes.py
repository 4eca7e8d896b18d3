"""sim.calibrate.switch_modes: the predicted switch per policy and mode, on a committed RL-step record."""
from __future__ import annotations

import json
import pathlib

import pytest

REC = pathlib.Path(__file__).resolve().parents[2] / "bench/results/2026-11-30-h200x2-all-policies/loop/rl1_alloc/rl_step_1.json"


@pytest.fixture(scope="module")
def rows():
    from sim.calibrate.switch_modes import predict_modes

    return {(r["policy"], r["mode"]): r for r in predict_modes(json.loads(REC.read_text()))}


def test_the_modes_compose_the_same_parts(rows):
    for policy in ("DESTROY_DEFERRED", "SUSPEND_PLANNED", "PAUSED_LIVE"):
        seq, ovl, stm = (rows[(policy, m)] for m in ("sequential", "overlapped", "streamed"))
        # beside each other a walk and a copy cost their maximum, never more than one after the other
        assert ovl["offload_s"] <= seq["offload_s"] and ovl["reload_s"] <= seq["reload_s"]
        assert stm["reload_s"] <= ovl["reload_s"]
        # off the sequential mode the gather runs beside the params' streamed copies: the larger of the two
        assert stm["weight_sync_s"] == ovl["weight_sync_s"] < seq["weight_sync_s"]
        for r in (seq, ovl, stm):  # switch_cost_s: the window plus the first step's extra and the stream's wait
            assert r["switch_cost_s"] == pytest.approx(r["offload_s"] + r["weight_sync_s"] + r["reload_s"]
                                                       + r["first_use_extra_s"] + r["stream_wait_s"])
            assert r["copy_time_at_line_s"] > 0 and 0 < r["switch_cost_share_of_step"] < 1


def test_destroying_policies_pay_the_rebuilt_groups_first_use_and_paused_live_does_not(rows):
    assert rows[("DESTROY_DEFERRED", "sequential")]["first_use_extra_s"] > 0.005
    assert rows[("PAUSED_LIVE", "sequential")]["first_use_extra_s"] < 0.005
    # the sequential destroy walk and cooldown cost more than the copies they now hide behind
    seq, ovl = rows[("DESTROY_DEFERRED", "sequential")], rows[("DESTROY_DEFERRED", "overlapped")]
    assert ovl["switch_cost_s"] < 0.8 * seq["switch_cost_s"]


def test_the_command_prints_the_table(capsys):
    from sim.calibrate.switch_modes import main

    assert main([str(REC), "--policies", "PAUSED_LIVE", "--modes", "sequential,streamed"]) == 0
    out = capsys.readouterr().out
    assert out.count("| PAUSED_LIVE |") == 2 and "switch_cost_s" in out
    assert main([str(REC), "--fwd-bwd-share", "2"]) == 2


def test_the_current_step_hides_the_lifecycle_under_the_copies():
    """The RL step as it runs now (the sync needs none of the lifecycle's groups, destroys wake the NCCL proxy,
    rebuilt groups warmed in the resume off the sequential mode): the overlapped switch of a policy that frees the
    NCCL memory costs about the copies; the sequential one still pays the lazy init at the first use."""
    from sim.calibrate.switch_modes import predict_modes

    rec = json.loads(REC.read_text())
    rec.update(sync_needs_no_group=True, wake_proxies=True)
    rows = {(r["policy"], r["mode"]): r for r in predict_modes(rec, policies=("DESTROY_DEFERRED", "SUSPEND_PLANNED"))}
    for policy in ("DESTROY_DEFERRED", "SUSPEND_PLANNED"):
        seq, ovl = rows[(policy, "sequential")], rows[(policy, "overlapped")]
        assert seq["first_use_extra_s"] > 0.005 and ovl["first_use_extra_s"] < 1e-6
        assert ovl["switch_cost_x_copy_time"] <= 1.1
    old = {(r["policy"], r["mode"]): r for r in predict_modes(json.loads(REC.read_text()),
                                                               policies=("DESTROY_DEFERRED",))}
    assert rows[("DESTROY_DEFERRED", "sequential")]["offload_s"] < old[("DESTROY_DEFERRED", "sequential")]["offload_s"] - 0.2


def test_a_streamed_reload_in_order_on_the_copy_engine_hides_nothing_the_step_needs_first():
    """The copy engine serves a stream's queued copies before another stream's (bench/gpu/copy_queue_probe.py on
    the H200): the step after a streamed reload waits for what is left of it, so the streamed switch costs what
    the overlapped one does; with the engine shared (the ideal), the forward and backward hide that part."""
    from sim.calibrate.switch_modes import predict_modes

    rec = json.loads(REC.read_text())
    rec.update(sync_needs_no_group=True, wake_proxies=True)
    kw = dict(policies=("PAUSED_LIVE",), modes=("overlapped", "streamed"))
    in_order = {r["mode"]: r for r in predict_modes(rec, **kw)}
    shared = {r["mode"]: r for r in predict_modes(rec, copy_engine="shared", **kw)}
    assert in_order["streamed"]["stream_wait_s"] > 0.05
    assert in_order["streamed"]["switch_cost_s"] == pytest.approx(in_order["overlapped"]["switch_cost_s"], rel=0.02)
    assert shared["streamed"]["switch_cost_s"] < in_order["streamed"]["switch_cost_s"] - 0.05
    with pytest.raises(ValueError, match="copy_engine"):
        predict_modes(rec, copy_engine="fast", **kw)


def test_a_reload_in_first_use_order_lets_the_forward_run_under_the_streamed_rest():
    """With the forward's tensors issued first, the step's first wait on the streamed rest is FSDP2's post-backward
    pinned copy: the forward runs under the rest's copies and the step pays only what is left after it. The order
    the store used before (buffers behind the optimizer state) made the forward wait at once. The default follows
    the record."""
    from sim.calibrate.switch_modes import FIRST_WAIT_SHARE, INLINE_COPY_BYTES, predict_modes

    rec = json.loads(REC.read_text())
    rec.update(sync_needs_no_group=True, wake_proxies=True)
    kw = dict(policies=("PAUSED_LIVE",), modes=("overlapped", "streamed"))
    old = {r["mode"]: r for r in predict_modes(rec, reload_order="category", **kw)}
    new = {r["mode"]: r for r in predict_modes(rec, reload_order="first_use", **kw)}
    train = rec["summary"]["phase_s"]["train"]
    assert 0 < FIRST_WAIT_SHARE < 0.5
    assert {**old["overlapped"], "reload_order": "first_use"} == new["overlapped"]  # only the streamed mode changes
    saved = old["streamed"]["stream_wait_s"] - new["streamed"]["stream_wait_s"]
    assert saved > 0.01
    assert new["streamed"]["switch_cost_s"] == pytest.approx(old["streamed"]["switch_cost_s"] - saved)
    # the forward's stretch of the record's training step, or all that was left
    assert saved == pytest.approx(min(FIRST_WAIT_SHARE * train, old["streamed"]["stream_wait_s"]), rel=0.2)
    assert predict_modes(rec, **kw)[1] == old["streamed"]  # a record without reload_order: the order of its time
    rec["reload_order"] = "first_use"
    assert predict_modes(rec, **kw)[1] == new["streamed"]
    with pytest.raises(ValueError, match="reload_order"):
        predict_modes(rec, reload_order="random", **kw)
    # a batch larger than CUDA stages inline, copied at the step's start, is the step's first wait
    big = {**rec, "config": {**rec["config"], "batch": 32, "seq": 1024}}
    assert 32 * 1024 * 8 > INLINE_COPY_BYTES >= rec["config"]["batch"] * rec["config"]["seq"] * 8
    assert predict_modes(big, batch_ahead=False, **kw)[1]["stream_wait_s"] == old["streamed"]["stream_wait_s"]
    assert predict_modes(big, batch_ahead=True, **kw)[1]["stream_wait_s"] == new["streamed"]["stream_wait_s"]


def test_copies_on_sms_hide_the_rest_under_the_step_at_their_own_rate():
    """With the streamed copies made on SMs the engine serves the step's own copies at once: the rest runs under the
    forward and backward as with a shared engine, but every streamed copy (the params' under the gather too) at the
    kernel's measured rate."""
    from sim.calibrate.switch_modes import SM_COPY_RATE, predict_modes

    rec = json.loads(REC.read_text())
    rec.update(sync_needs_no_group=True, wake_proxies=True, reload_order="first_use")
    kw = dict(policies=("PAUSED_LIVE",), modes=("sequential", "overlapped", "streamed"))
    eng = {r["mode"]: r for r in predict_modes(rec, **kw)}
    sms = {r["mode"]: r for r in predict_modes(rec, copy_engine="sms", **kw)}
    shared = {r["mode"]: r for r in predict_modes(rec, copy_engine="shared", **kw)}
    assert 0.85 < SM_COPY_RATE < 1
    assert sms["sequential"] == eng["sequential"]  # nothing streamed, nothing on SMs
    assert sms["overlapped"]["reload_s"] > eng["overlapped"]["reload_s"]  # the same copies, slower
    assert sms["streamed"]["stream_wait_s"] < eng["streamed"]["stream_wait_s"]
    assert shared["streamed"]["switch_cost_s"] <= sms["streamed"]["switch_cost_s"] < eng["streamed"]["switch_cost_s"]
