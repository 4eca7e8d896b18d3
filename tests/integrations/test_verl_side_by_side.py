"""``bench/gpu/verl_side_by_side.py --dry-run``: the H200 comparison's script runs on the CPU and writes its record.

The GPU run's figures are in bench/results; here the script must run end to end with the tiny model:
verl's functions (loaded without ``verl/__init__.py``) and the drop-ins, the same losses bit for bit,
and a record with the ratios and the stores' statistics; on one process and on 2 Gloo ranks (as under
``torchrun``), where rank 0's record holds every rank's figures and all ranks agree on the outcome.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.integrations._verl import needs_verl

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@needs_verl
def test_dry_run_writes_a_bitwise_record(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, MASTER_PORT=str(29000 + os.getpid() % 1000))
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "gpu", "verl_side_by_side.py"), "--dry-run",
                          "--cycles", "2", "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "losses bitwise equal: yes" in out.stdout and "verl / store" in out.stdout, out.stdout
    rec = json.loads((tmp_path / "verl_side_by_side.json").read_text())
    assert rec["bitwise_losses"] and rec["model"] == "tiny" and rec["verl"].startswith("0.9")
    assert set(rec["ratios_verl_over_store"]) == {"cold_offload", "steady_offload", "reload"}
    verl, store = rec["methods"]["verl"], rec["methods"]["store"]
    assert verl["losses"] == store["losses"] and len(store["losses"]) == 3
    assert len(store["steady_offload_s"]) == 2 and len(store["reload_s"]) == 3
    # the stores hold the state: parameters and optimizer state, and the model's buffers (the rotary table,
    # 2 x 4 fp32 values in the tiny model) that travel with the module
    both = store["model_store"]["state_bytes"] + store["optim_store"]["state_bytes"]
    assert store["state_bytes"] == verl["state_bytes"] and both == store["state_bytes"] + 32, (both, store)
    assert store["model_store"]["offloads"] == store["optim_store"]["offloads"] == 3


def _script():
    """The script as a module (bench/gpu is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verl_side_by_side",
                                                  os.path.join(REPO, "bench", "gpu", "verl_side_by_side.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _side_by_side_rank(rank, world, out):
    return _script().main(["--dry-run", "--cycles", "2", "--out", out])


@needs_verl
def test_dry_run_on_two_ranks_writes_every_ranks_figures(tmp_path):
    # the script as torchrun runs it: FSDP2 over both Gloo ranks, rank 0 writes the record
    from tests._dist import run_distributed

    assert run_distributed(_side_by_side_rank, 2, args=(str(tmp_path),), timeout=300) == [0, 0]
    rec = json.loads((tmp_path / "verl_side_by_side.json").read_text())
    assert rec["world_size"] == 2 and rec["timings"] == "max over ranks" and rec["bitwise_losses"]
    ranks = rec["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["bitwise_losses"] for r in ranks)
    for r in ranks:
        verl, store = r["methods"]["verl"], r["methods"]["store"]
        assert verl["losses"] == store["losses"] and len(store["losses"]) == 3
        assert store["model_store"]["offloads"] == store["optim_store"]["offloads"] == 3
    # each rank trained on its own batch, and holds its own shard of the state
    assert ranks[0]["methods"]["store"]["losses"] != ranks[1]["methods"]["store"]["losses"]
    for m in ("verl", "store"):
        per = [r["methods"][m] for r in ranks]
        top = rec["methods"][m]
        assert top["state_bytes"] == sum(p["state_bytes"] for p in per) == rec["state_bytes"]
        for i, row in enumerate(top["rows"]):
            assert row == {k: max(p["rows"][i][k] for p in per) for k in ("offload_s", "reload_s")}
        assert top["cold_offload_s"] == top["rows"][0]["offload_s"] and len(top["steady_offload_s"]) == 2


def _agree_rank(rank, world):
    return _script().agree_all(rank != 1, torch.device("cpu"))


@needs_verl
def test_one_ranks_differing_losses_fail_every_rank():
    from tests._dist import run_distributed

    assert run_distributed(_agree_rank, 3, timeout=120) == [False, False, False]
