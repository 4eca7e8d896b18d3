"""`timeshare bench offload --model`: a real FSDP2 transformers model, the store beside verl's way, on Gloo.

Skipped without transformers (the optional ``models`` extra).
"""
from __future__ import annotations

import pytest

from tests._dist import run_distributed

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def _bench(rank, world_size, out):
    from bench.model_offload import format_report, run_model_bench

    rep = run_model_bench("tiny", device="cpu", cycles=1, methods=["store", "verl_like", "verl"], out=out)
    return rep, format_report(rep)


def test_the_store_and_verls_way_move_a_real_fsdp2_model_bitwise(tmp_path):
    (rep, text), = run_distributed(_bench, 1, args=(str(tmp_path),), timeout=240)
    by = {m["method"]: m for m in rep["methods"]}
    assert rep["state_bytes"] > 0 and set(by) == {"store", "verl_like", "verl"}
    for name in ("store", "verl_like"):
        assert by[name]["bitwise_every_cycle"] and len(by[name]["rows"]) == 2
        assert by[name]["state_bytes"] == rep["state_bytes"]
    assert "skipped" in by["verl"] or by["verl"]["bitwise_every_cycle"]
    assert any(line.startswith("store ") for line in text.splitlines()) and (tmp_path / "model_offload_tiny.json").exists()
