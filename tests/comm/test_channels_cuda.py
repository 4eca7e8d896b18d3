"""A channel cap on a group the runtime makes (GroupSpec option ``config.max_ctas``; the RL step's --nccl-max-ctas)
taking on NCCL, through every rebuild: bench/gpu/channels_probe.py on one GPU with NCCL's INFO log, each creation's
``coll channels`` read back. The probe's own logic on Gloo (and its parsers) run on the CPU below."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "gpu" / "channels_probe.py"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _probe(args: list[str], tmp_path: Path, nproc: int = 1) -> dict:
    out = tmp_path / "channels.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_MAX_CTAS", "NCCL_MAX_NCHANNELS"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(PROBE),
           *args, "--out", str(out)]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.cuda
@cuda
def test_the_cap_takes_on_every_rebuilt_communicator(tmp_path):
    """Every creation of the capped group, each a rebuild from its spec, logs at most the cap's channels; the
    uncapped one more (a one-rank communicator on an H100/H200 logs 64)."""
    rec = _probe(["--caps", "none,4", "--rounds", "2", "--mib", "16", "--iters", "1",
                  "--nccl-log", str(tmp_path / "log")], tmp_path)
    by_cap = {s["cap"]: s for s in rec["summary"]}
    assert len(rec["channels_logged"]) == 4, rec["channels_logged"]
    assert by_cap[4]["channels"] and max(by_cap[4]["channels"]) <= 4
    assert by_cap[None]["channels"] and min(by_cap[None]["channels"]) > 4
    assert all(s["creation_s"] > 0 for s in rec["summary"])


def test_the_probe_runs_on_two_gloo_ranks(tmp_path):
    """The probe's logic end to end on the CPU (no caps on Gloo): a creation per round, the collectives timed."""
    rec = _probe(["--dry-run", "--rounds", "2"], tmp_path, nproc=2)
    assert rec["world_size"] == 2 and rec["caps"] == [None]
    assert len(rec["rounds"]) == 2 and all(r["creation_s"] > 0 for r in rec["rounds"])
    coll = rec["summary"][0]["collectives"]["0.01"]
    assert coll["all_gather"]["ms"] > 0 and coll["reduce_scatter"]["ms"] > 0


def test_the_probes_parsers(tmp_path):
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    try:
        from channels_probe import channels_in_log, parse_caps, summarize
    finally:
        sys.path.remove(str(ROOT / "bench" / "gpu"))
    assert parse_caps("none,16, 8") == [None, 16, 8]
    for bad in ("0", "x", "-2"):
        with pytest.raises(ValueError, match="channel count"):
            parse_caps(bad)
    log = tmp_path / "nccl.h.1.log"
    log.write_text("x NCCL INFO 24 coll channels, 24 collnet channels\nother\nx NCCL INFO 8 coll channels, 8 collnet\n")
    assert channels_in_log([str(log)]) == [24, 8]
    rows = [{"cap": c, "round": r, "creation_s": s, "nccl_bytes": 0}
            for c, r, s in ((None, 0, 0.5), (None, 1, 0.2), (8, 0, 0.3), (8, 1, 0.1))]
    got = summarize(rows, [None, 8], [24, 24, 8, 8], 2)
    assert [g["creation_s"] for g in got] == [0.2, 0.1]  # the first round left out
    assert [g["channels"] for g in got] == [[24], [8]]
