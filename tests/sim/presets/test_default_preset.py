"""A machine with a calibrated preset gets it by default, and `timeshare sim list` says what each was fitted on."""
from __future__ import annotations

import pytest

from refimpl.cli import main
from sim.presets import list_calibrated, preferred_preset


def test_a_machine_name_resolves_to_its_calibrated_preset():
    assert "calibrated/hgx-h200-8x" in list_calibrated() and "calibrated/hgx-h20-8x" in list_calibrated()
    assert preferred_preset("hgx-h200-8x") == "calibrated/hgx-h200-8x"
    assert preferred_preset("a6000-4x-nvlink") == "a6000-4x-nvlink"  # none shipped for it
    assert preferred_preset("calibrated/h200-1x") == "calibrated/h200-1x"
    assert preferred_preset("my.json") == "my.json"  # a file is taken as it is


def test_plan_uses_the_calibrated_preset_of_its_cluster():
    from sim.planner.plan import Planner, PlanInputs
    from sim.planner.plan_inputs import model_preset

    assert Planner(PlanInputs(model=model_preset("Qwen2.5-7B"))).cluster_ref == "calibrated/hgx-h200-8x"


def test_bench_switch_window_on_the_machine_name_predicts_the_measured_two_gpu_pause(capsys):
    """The 2 x H200 pause of DESTROY_DEFERRED (its destroy walk), 1.513 s measured on lazy-wake and parallel-walks
    without the runtime's proxy waker: the datasheet preset's communicator figures gave 0.50 s; the machine's name now
    gets the calibrated preset."""
    assert main(["bench", "switch-window", "--dp", "2", "--tp", "1", "--steps", "3", "--warmup", "1",
                 "--rollout-s", "3", "--topology", "hgx-h200-8x", "--policy", "destroy_deferred",
                 "--wake-proxies", "off"]) == 0
    out = capsys.readouterr().out
    assert "topology calibrated/hgx-h200-8x" in out
    row = next(line for line in out.splitlines() if line.startswith("DESTROY_DEFERRED"))
    assert float(row.split()[3]) == pytest.approx(1.513, rel=0.05)


def test_sim_list_marks_the_calibrated_presets_with_what_they_were_fitted_on(capsys):
    assert main(["sim", "list"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip().startswith("calibrated/")]
    assert {line.split()[0] for line in lines} == set(list_calibrated())
    for line in lines:
        assert line.split(None, 1)[1].startswith("fitted on NCCL communicator costs on") and "2 x H200" in line
        assert "bench/" not in line and "seeds/" not in line and "h200x2-" not in line and ".json" not in line
    assert "(plan and bench use calibrated/hgx-h200-8x for it)" in out
