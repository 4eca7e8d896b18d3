"""sim.calibrate.switch_modes: the predicted switch per policy and mode, on a committed RL-step record."""
from __future__ import annotations

import json
import pathlib

import pytest

REC = pathlib.Path(__file__).resolve().parents[3] / "bench/results/2026-11-30-h200x2-all-policies/loop/rl1_alloc/rl_step_1.json"


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


EARLY = pathlib.Path(__file__).resolve().parents[3] / "bench/results/2026-12-02-h200-offload-in-backward"
#: the Qwen2 1.03 B step's units in backward order with the head on its own: head, 20 layers, root (bytes)
UNITS = [589824000] + [561573888] * 20 + [589842432]


def test_early_copies_run_behind_the_units_and_only_what_outlasts_the_step_is_paid():
    from sim.calibrate.switch_modes import early_copies_tail

    rate = 50e9
    # units that the copies keep up with: only the last unit's copy, final at the step's end, is paid
    assert early_copies_tail([1e9] * 11, rate, train_s=1.0, start_share=0.3) == pytest.approx(1e9 / rate)
    # copies slower than the units become final: they queue, and the queue's end is paid
    tail = early_copies_tail([10e9] * 5, rate, train_s=1.0, start_share=0.3)
    assert tail == pytest.approx(0.3 + 5 * 10e9 / rate - 1.0)
    assert early_copies_tail([], rate, train_s=1.0) == 0.0


def test_early_copies_leave_the_offload_its_host_work_and_the_step_its_tail():
    from sim.calibrate.switch_modes import predict_modes, store_offload_host_s

    base = json.loads((EARLY / "db_base.json").read_text())
    kw = dict(policies=("DESTROY_DEFERRED",), modes=("streamed",))
    plain, = predict_modes(base, **kw)
    early, = predict_modes(base, early_units_bytes=UNITS, **kw)
    assert plain["early_copies_tail_s"] == 0 and not plain["offload_in_backward"]
    assert early["offload_in_backward"] and early["early_copies_tail_s"] > 0
    # the copies left the offload: what stays is host work, far below the copies' 0.23 s at line
    host = store_offload_host_s(base)
    assert 0 < host < 0.05 and early["offload_s"] < host + 0.02 < plain["offload_s"]
    assert early["switch_cost_s"] == pytest.approx(early["offload_s"] + early["weight_sync_s"] + early["reload_s"]
                                                   + early["first_use_extra_s"] + early["stream_wait_s"]
                                                   + early["early_copies_tail_s"])
    assert early["switch_cost_s"] < 0.6 * plain["switch_cost_s"]


def test_without_an_offload_phase_of_its_own_the_early_offload_is_the_walk_plus_the_records_host_work():
    """A record that ran no early copies: the predicted early-copy offload is the pause's walk plus the store's
    host work the record measured (its copies and their wait gone), so it follows that host work one for one
    and does not depend on the record's copy wait."""
    from sim.calibrate.switch_modes import predict_modes, store_offload_host_s

    base = json.loads((EARLY / "db_base.json").read_text())
    kw = dict(policies=("DESTROY_DEFERRED",), modes=("streamed", "overlapped"), early_units_bytes=UNITS)
    rows = {r["mode"]: r for r in predict_modes(base, **kw)}
    more_host = json.loads(json.dumps(base))
    more_host["store_phases"]["offload.collect"] += 0.010
    longer_wait = json.loads(json.dumps(base))
    longer_wait["store_phases"]["offload.wait"] += 1.0
    assert store_offload_host_s(more_host) == pytest.approx(store_offload_host_s(base) + 0.010)
    for mode, row in rows.items():
        walk = row["offload_s"] - store_offload_host_s(base)
        assert walk > 0, mode  # DESTROY_DEFERRED's pause walks its groups
        moved, = (r for r in predict_modes(more_host, **kw) if r["mode"] == mode)
        assert moved["offload_s"] == pytest.approx(row["offload_s"] + 0.010, abs=1e-9)
        waited, = (r for r in predict_modes(longer_wait, **kw) if r["mode"] == mode)
        assert waited["offload_s"] == pytest.approx(row["offload_s"], abs=1e-9)


def test_a_record_that_ran_early_copies_gives_its_own_offload_phase_and_reload_issue_time():
    from sim.calibrate.switch_modes import early_offload_phase_s, predict_modes, reload_issue_host_s

    rec = json.loads((EARLY / "db_early_r3.json").read_text())
    phase = early_offload_phase_s(rec)
    spans = [sp["end_s"] - sp["start_s"] for sp in rec["spans"] if sp["phase"] == "offload" and sp["step"] > 0]
    assert phase == pytest.approx(sum(spans) / len(spans))
    assert early_offload_phase_s(json.loads((EARLY / "db_base.json").read_text())) is None
    assert reload_issue_host_s(rec) > 0 and reload_issue_host_s(json.loads(REC.read_text())) is None  # sequential
    row, = predict_modes(rec, policies=("DESTROY_DEFERRED",), modes=("streamed",), early_units_bytes=UNITS)
    assert row["offload_s"] == pytest.approx(phase)


def test_the_sync_first_leaves_the_weight_sync_the_gather_and_moves_every_reload_after_the_rollout():
    from sim.calibrate.switch_modes import predict_modes, reload_issue_host_s

    rec = json.loads((EARLY / "db_early_r3.json").read_text())
    kw = dict(policies=("DESTROY_DEFERRED",), modes=("streamed", "overlapped"), early_units_bytes=UNITS)
    after = {r["mode"]: r for r in predict_modes(rec, sync_first=False, **kw)}
    first = {r["mode"]: r for r in predict_modes(rec, sync_first=True, **kw)}
    for mode in ("streamed", "overlapped"):
        assert first[mode]["sync_first"] and not after[mode]["sync_first"]
        assert first[mode]["weight_sync_s"] < after[mode]["weight_sync_s"]  # no params' reload, no issue before
    # streamed: the reload phase issues every reload, then the resume; the copies themselves run into the step
    issue = reload_issue_host_s(rec)
    assert first["streamed"]["reload_s"] == pytest.approx(after["streamed"]["reload_s"] + issue)
    # overlapped: the reload phase waits for all of the copies (params too), so it takes longer than the rest's
    assert first["overlapped"]["reload_s"] > after["overlapped"]["reload_s"]


def test_an_overlapped_reload_waits_for_each_units_own_bytes_not_the_whole_reload():
    """``--overlap-reload``: the reload in the step's use order, each use waiting for its own bytes (no pinned copy of
    the step's queued behind it: ``window_s=0``). Its wait is the largest shortfall of an arrival against its use:
    never more than the whole reload's wait at the first optimizer step, nothing where the copies keep ahead of the
    step, and the whole rest where the step has no time at all."""
    from sim.calibrate.switch_modes import FIRST_WAIT_SHARE, overlapped_reload_wait

    units = [3_000_000] * 10  # ten equal units (backward order), a third of each its params
    train = 0.30
    for rest in (0.05, 0.20, 0.40, 0.80):
        whole = max(0.0, rest - FIRST_WAIT_SHARE * train)  # the host finishing everything at the first step
        got = overlapped_reload_wait(rest, units, train, forward_share=0.27, window_s=0.0)
        # (the forward's first read waits for the root's params, which the whole reload's model leaves out)
        assert 0.0 <= got <= whole + rest / 3 / len(units) + 1e-12
        if rest > train:  # the last unit's state lands at the end of the copies; the root steps at the step's end
            assert got == pytest.approx(rest - train)
    assert overlapped_reload_wait(0.05, units, train, issue_s=0.01, forward_share=0.27, window_s=0.0) == 0.0  # ahead of every use
    assert overlapped_reload_wait(0.4, units, 0.0, window_s=0.0) == pytest.approx(0.4)  # no step to hide under
    # the params come first: a forward that reads them sooner than they land waits for them
    fast_fwd = overlapped_reload_wait(0.6, units, train, forward_share=0.01, window_s=0.0)
    assert fast_fwd >= 0.6 / 3 - 0.01 * train - 1e-9
    # the host's join before the backward delays every backward use by as much: the copies have that much longer
    kw = dict(forward_share=0.27, window_s=0.0)
    without, joined = overlapped_reload_wait(0.4, units, train, **kw), overlapped_reload_wait(0.4, units, train,
                                                                                              join_s=0.05, **kw)
    assert without - 0.05 - 1e-12 <= joined < without
    assert overlapped_reload_wait(0.4, [], train) == 0.0


def test_a_pinned_copy_of_the_step_waits_behind_the_queued_reload():
    """[Note: a pinned copy behind the queued reload]: with every piece queued at once (``window_s=None``, the store
    unpaced) FSDP2's first reduce waits for the whole reload, the same wait as finishing it on the host at the first
    optimizer step; with a window each unit's reduce while the copies run waits for up to one window more."""
    from sim.calibrate.switch_modes import FIRST_WAIT_SHARE, overlapped_reload_wait

    units, train = [3_000_000] * 10, 0.30
    for rest in (0.15, 0.30, 0.60):
        whole = max(0.0, rest - FIRST_WAIT_SHARE * train)
        assert overlapped_reload_wait(rest, units, train, forward_share=0.27) == pytest.approx(
            max(whole, overlapped_reload_wait(rest, units, train, forward_share=0.27, window_s=0.0)))
    free = overlapped_reload_wait(0.25, units, train, forward_share=0.27, window_s=0.0)
    paced = overlapped_reload_wait(0.25, units, train, forward_share=0.27, window_s=0.002)
    # the reduces at 0.31 T .. T of a 0.30-s step that come before 0.25 s: units 0-6 of 10
    assert paced == pytest.approx(free + 7 * 0.002)
    assert overlapped_reload_wait(0.25, units, train, forward_share=0.27) > paced  # unpaced: the whole reload first

