"""A channel cap on the mesh's communicators (NCCL's maxCTAs; the RL step's --nccl-max-ctas) in the simulator:
the creation's connection scaled by the channels kept ([Note: a communicator's channels] in sim.presets), the
step's FSDP2 collectives slowed as much (sim.calibrate.switch_ngpu.step_collectives_s), and the N-GPU prediction
with both."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sim.calibrate.nccl_init_log import CONNECT_SHARE_2X_H200, PER_EXCHANGE_SHARE_2X_H200, RING_CHANNELS_2X_H200
from sim.calibrate.switch_ngpu import (main, mesh_shape, per_rank_record, predict_ngpu, predict_table,
                                       step_collectives_s)
from sim.machine.topology import Topology

ROOT = Path(__file__).resolve().parents[3]
INPUT = "bench/results/2026-12-05-h200-pending/run4/rl_today.json"
MULTI = "calibrated/hgx-h200-8x"
C, SHARE, PER = RING_CHANNELS_2X_H200, CONNECT_SHARE_2X_H200, PER_EXCHANGE_SHARE_2X_H200


@pytest.fixture(scope="module")
def comm():
    return Topology.from_preset(MULTI).comm


@pytest.fixture(scope="module")
def rec():
    return json.loads((ROOT / INPUT).read_text())


def test_the_cap_scales_the_connection_by_the_channels_kept(comm):
    """Two ranks: the connection (the log's share of the init) times cap / C, the rest as it was; a cap at or above
    the log's channels changes nothing; one rank (no connection) and every other cost keep their figures; with a
    per-channel share below 1 only that part of the connection scales."""
    t2 = comm.for_size(2).init_s
    for cap, keep in ((C, 1.0), (2 * C, 1.0), (C // 2, 0.5), (C // 3, 1 / 3), (1, 1 / C)):
        capped = comm.with_channel_cap(cap, C, SHARE)
        assert capped.for_size(2).init_s == pytest.approx(t2 * (1 - SHARE) + t2 * SHARE * keep)
        part = comm.with_channel_cap(cap, C, SHARE, PER)
        assert part.for_size(2).init_s == pytest.approx(t2 - t2 * SHARE * PER * (1 - keep))
        assert capped.for_size(1).init_s == comm.for_size(1).init_s
        assert capped.for_size(2).destroy_s == comm.for_size(2).destroy_s
        assert capped.for_size(8).resume_s == comm.for_size(8).resume_s
    assert comm.with_channel_cap(8, C, SHARE).for_size(2).init_s < t2


def test_past_two_ranks_the_connection_is_the_rules(comm):
    """Under the ring rule the connection is the two-rank one at every size, so a cap takes the same seconds off at
    8 ranks as at 2; under the log2 rule it is the share of the grown init, so a cap takes more off at 8."""
    ring = comm.with_size_rule("ring", SHARE)
    t2 = comm.for_size(2).init_s
    off = t2 * SHARE * (1 - 8 / C)
    for n in (2, 4, 8):
        assert ring.with_channel_cap(8, C, SHARE).for_size(n).init_s == pytest.approx(ring.for_size(n).init_s - off)
        log2 = comm.for_size(n).init_s
        assert comm.with_channel_cap(8, C, SHARE).for_size(n).init_s == pytest.approx(log2 - log2 * SHARE * (1 - 8 / C))


def test_bad_caps_and_a_cap_on_a_measured_creation_are_refused(comm):
    for cap in (0, -1, 2.5, None):
        with pytest.raises(ValueError, match="channel cap"):
            comm.with_channel_cap(cap, C, SHARE)
    with pytest.raises(ValueError, match="channels the connection"):
        comm.with_channel_cap(8, 0, SHARE)
    with pytest.raises(ValueError, match="share"):
        comm.with_channel_cap(8, C, 1.0)
    with pytest.raises(ValueError, match="per-channel share"):
        comm.with_channel_cap(8, C, SHARE, 0.0)
    with pytest.raises(ValueError, match="measured"):
        comm.with_measured_init({4: 0.3}).with_channel_cap(8, C, SHARE)
    with pytest.raises(ValueError, match="measured"):
        comm.with_channel_cap(8, C, SHARE).with_measured_init({4: 0.3})
    with pytest.raises(ValueError, match="two-rank"):
        dataclasses.replace(comm, multi=None).with_channel_cap(8, C, SHARE)


def test_the_steps_collectives_are_their_bytes_at_nvlink_and_slow_with_the_cap(rec):
    """FSDP2's bytes of a plain step (bf16 gathers twice a unit, the root's once; fp32 reduce-scatters; an HSDP
    mesh's fp32 all-reduce) at the preset's NVLink rate; a cap below the log's channels divides the rate by what it
    keeps, one at or above leaves it; one rank moves nothing."""
    from sim.calibrate.colocated import gather_bytes_s

    r = per_rank_record(rec, 8, 8, bytes_per_rank="one-gpu")
    units = r["early_units_bytes"]
    params = [b / 12 for b in units]
    gathers = sum(2 * p for p in params[:-1]) * 2 + params[-1] * 2
    want = gather_bytes_s(gathers, 8, MULTI) + gather_bytes_s(sum(params) * 4, 8, MULTI)
    full = step_collectives_s(r, 1, 8)
    assert full == pytest.approx(want)
    assert step_collectives_s(r, 1, 8, channel_cap=8) == pytest.approx(full * C / 8)
    assert step_collectives_s(r, 1, 8, channel_cap=C) == pytest.approx(full)
    assert step_collectives_s(r, 1, 8, channel_cap=4 * C) == pytest.approx(full)
    assert step_collectives_s(r, 1, 8, logprob_pass=True) > full
    assert step_collectives_s(per_rank_record(rec, 1, 1), 1, 1) == 0.0
    replicate, shard = mesh_shape("hsdp", 8)
    h = per_rank_record(rec, 8, shard, bytes_per_rank="one-gpu")
    assert step_collectives_s(h, replicate, shard) > step_collectives_s(h, 1, shard)


def test_the_prediction_with_a_cap_shortens_the_join_and_pays_the_collectives_past_the_step(rec):
    """8-GPU FSDP2, each rank's state as the one GPU's, under the log2 rule: a cap of 8 leaves the resume thread
    shorter and the join with it; the capped collectives cost nothing while they fit in the step and what passes
    the step beyond the uncapped ones once they do not; without a cap the term is 0 and the row as before."""
    kw = dict(mechanisms=("forward_from_rollout",), bytes_per_rank="one-gpu")
    base = predict_ngpu(rec, 8, **kw)[0]
    eight = predict_ngpu(rec, 8, nccl_max_ctas=8, **kw)[0]
    four = predict_ngpu(rec, 8, nccl_max_ctas=4, **kw)[0]
    assert "capped_collectives" not in base["terms"] and base["nccl_max_ctas"] is None
    assert eight["detail"]["resume_thread_s"] < base["detail"]["resume_thread_s"]
    assert eight["terms"]["join_wait"] < base["terms"]["join_wait"]
    step = eight["plain_step_s"]
    for row in (eight, four):
        d = row["detail"]
        want = max(0.0, d["step_collectives_s"] - step) - max(0.0, d["step_collectives_uncapped_s"] - step)
        assert row["terms"]["capped_collectives"] == pytest.approx(want)
        assert row["switch_cost_s"] == pytest.approx(sum(row["terms"].values()))
    assert eight["detail"]["step_collectives_s"] < step and eight["terms"]["capped_collectives"] == 0.0
    assert four["detail"]["step_collectives_s"] > step and four["terms"]["capped_collectives"] > 0.0
    with pytest.raises(ValueError, match="channel count"):
        predict_ngpu(rec, 8, nccl_max_ctas=0, **kw)
    with pytest.raises(ValueError, match="measured"):
        predict_ngpu(rec, 8, nccl_max_ctas=8, init_measured={4: 0.3}, **kw)
    # the earlier mechanism (trainer.dp, not the mesh) is not capped
    old = predict_table(rec, [8], ("fsdp",), mechanisms=("old",), nccl_max_ctas=8)[0]
    assert old["nccl_max_ctas"] is None and "capped_collectives" not in old["terms"]


def test_the_command_takes_the_cap_and_prints_its_columns(capsys):
    assert main([INPUT, "--ranks", "8", "--meshes", "fsdp", "--mechanisms", "forward_from_rollout",
                 "--bytes-per-rank", "one-gpu", "--nccl-max-ctas", "8"]) == 0
    out = capsys.readouterr().out
    assert "capped at 8 channels" in out and "| capped collectives | step's collectives |" in out
    assert main([INPUT, "--ranks", "8", "--meshes", "fsdp", "--mechanisms", "forward_from_rollout"]) == 0
    assert "capped collectives" not in capsys.readouterr().out
    assert main([INPUT, "--ranks", "8", "--nccl-max-ctas", "0"]) == 2
    assert "channel count" in capsys.readouterr().err


def test_the_caps_inputs_are_named_as_sources():
    """With a cap the NCCL logs the connection share and the channels come from are inputs, under either rule."""
    from sim.calibrate.nccl_init_log import WALK_PROBE_LOGS
    from sim.calibrate.switch_ngpu import check_inputs_blind

    plain = check_inputs_blind(INPUT)
    capped = check_inputs_blind(INPUT, channel_cap=8)
    for p in WALK_PROBE_LOGS:
        assert f"RING_CHANNELS_2X_H200: {p}" in capped and f"CONNECT_SHARE_2X_H200: {p}" in capped
    assert not any(s.startswith(("RING_CHANNELS_2X_H200", "CONNECT_SHARE_2X_H200")) for s in plain)
