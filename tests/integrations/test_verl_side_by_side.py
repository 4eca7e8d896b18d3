"""``bench/gpu/verl_side_by_side.py --dry-run``: the H200 comparison's script runs on the CPU and writes its record.

The GPU run's figures are in bench/results; here the script must run end to end with the tiny model:
verl's functions (loaded without ``verl/__init__.py``) and the drop-ins, the same losses bit for bit,
and a record with the ratios and the stores' statistics.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

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
