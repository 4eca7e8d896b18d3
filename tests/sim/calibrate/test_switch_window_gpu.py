"""bench/switch_window_gpu.py on two real torch.distributed processes (Gloo on CPU): the record it writes carries the
mesh and the runtime's proxy-waker condition, and ``timeshare sim validate`` reads it (a dry run it refuses)."""
from __future__ import annotations

import json

import pytest

from tests._dist import run_distributed


def _measure(rank, world_size, argv):
    from bench.switch_window_gpu import measure, parse_args

    return measure(parse_args(argv))


def test_the_record_carries_the_mesh_and_the_waker_condition(tmp_path):
    argv = ["--dry-run", "--tp", "2", "--steps", "3", "--warmup", "1", "--policies", "destroy_deferred", "paused_live"]
    records = run_distributed(_measure, 2, args=(argv,), timeout=300)
    rec = records[0]
    assert records[1]["switch_window"]["results"] == rec["switch_window"]["results"]  # gathered: every rank agrees
    st = rec["switch_window"]["settings"]
    assert (st["dp"], st["tp"], st["ep"], st["groups_per_rank"]) == (1, 2, 1, 14)
    assert st["wake_proxies"] is False  # Gloo on CPU: no NCCL proxy to wake
    rows = {r["policy"]: r for r in rec["switch_window"]["results"]}
    assert set(rows) == {"DESTROY_DEFERRED", "PAUSED_LIVE"}
    for r in rows.values():
        assert r["bitwise_after_wake"] is True and r["first_use_after_wake"] is not None
    assert len(rec["switch_window"]["spans"]["DESTROY_DEFERRED"]) == 2
    from sim.calibrate.records import RecordError, load_record

    path = tmp_path / "r.json"
    path.write_text(json.dumps(rec))
    with pytest.raises(RecordError, match="dry run"):
        load_record(path)
    path.write_text(json.dumps({**rec, "dry_run": False}))
    got = load_record(path).switch_window.settings
    assert got["tp"] == 2 and got["wake_proxies"] is False


def test_a_mesh_that_is_not_the_world_is_named():
    from bench.switch_window_gpu import _mesh, parse_args

    with pytest.raises(ValueError, match="= 4 ranks, but the job has 2"):
        _mesh(parse_args(["--tp", "2", "--dp", "2"]), 2)
    assert _mesh(parse_args(["--ep", "2"]), 2)["dp"] == 2
