"""The Relax report's 8 x H20 Qwen3-30B-A3B run (section 4.4: TP=4, CP=2, EP=8, CPU optimizer offload), simulated
with nothing fitted on it. Report, first steady step: sleep 12.046 -> 10.042 s, update_weights 9.090 -> 6.156 s;
the lifecycle cost (the sleep and update differences) 4.937 s; the paused window's memory +3.6 to +5.4 GiB.
``python -m bench.relax_h20 --no-poll`` prints the comparison (docs/calibration.md)."""
import pytest

from bench.relax_h20 import (BASELINE, OPTIMIZED, REPORT_KEPT_LIVE_GIB, report_cost, run_arm, waiting_destroys,
                              waits_below)
from sim.calibrate.switch_window import megatron_groups
from sim.scenarios.runner import mesh_groups
from sim.scenarios.scenario import load_scenario

NAMES = (BASELINE, OPTIMIZED)


def test_the_scenarios_are_relax_s_groups_and_export():
    """Megatron's families for the report's sizes; Relax destroys and rebuilds only its groups of two or more ranks
    (``ReloadableProcessGroup``), and its export broadcasts the expert weights over EP before the TP all-gather."""
    for name in NAMES:
        scn = load_scenario(name)
        layout = mesh_groups(scn)
        ours = {(s.name.rstrip("0123456789"), s.ranks) for s in layout.specs}
        want = {(s.name.rstrip("0123456789"), s.ranks) for s in megatron_groups(tp=4, cp=2, ep=8, etp=1)}
        assert ours == want
        assert all(len(m) == 14 for m in layout.member)
        multi = {fam for fam, g in layout.member[0].items() if next(s for s in layout.specs if s.name == g).size > 1}
        assert multi == {"tp", "dp_cp", "mp", "tp_dp", "tp_dp_cp", "tp_cp", "cp", "ep"}
        assert scn.lifecycle.min_ranks == 2
        assert scn.workload.export.group == "tp" and scn.workload.export.also_uses == ("ep",)
        assert scn.wake_proxies is False  # Relax destroys with destroy_process_group, without a proxy waker


@pytest.mark.slow
def test_lifecycle_cost_and_kept_live_memory_against_the_report():
    """As shipped (Relax's destroys without a proxy waker, one phase of the proxy poll): 6.17 s against 4.937 s
    (+25%); over the poll's phase the mean is 6.54 s (+33%, ``python -m bench.relax_h20``). The proxy-poll waits are
    the term that is off: with the runtime's waker (not Relax's code) the same model is within 1% of the report, each
    row within 5%. The kept-live memory, the 8 groups of two or more ranks at the two-rank figure (484 MiB), lies
    inside the report's +3.6 to +5.4 GiB."""
    opt, base = run_arm(OPTIMIZED), run_arm(BASELINE)
    cost = sum(base[p] - opt[p] for p in ("sleep", "update_weights"))
    assert cost == pytest.approx(6.168, abs=0.01)
    kept = opt["rollout_gib"] - base["rollout_gib"]
    assert kept == pytest.approx(8 * 484 / 1024, rel=1e-3)
    assert REPORT_KEPT_LIVE_GIB[0] < kept < REPORT_KEPT_LIVE_GIB[1]
    free = run_arm(BASELINE, wake_proxies=True)
    opt = run_arm(OPTIMIZED, wake_proxies=True)  # no destroy in its steady step: the same either way
    assert free["sleep"] - opt["sleep"] == pytest.approx(2.003, rel=0.05)
    assert free["update_weights"] - opt["update_weights"] == pytest.approx(2.934, rel=0.05)
    assert sum(free[p] - opt[p] for p in ("sleep", "update_weights")) == pytest.approx(report_cost(), rel=0.01)


def test_the_report_leaves_no_room_for_the_waits_of_relaxs_destroys():
    """[Note: the poll phase of a destroy long after its init]: the baseline's two walks destroy 6 initialised
    communicators (the 4 the training step used, the 2 the export used), each waiting for its proxy's poll in
    Relax's code; the report's cost leaves 0.044 s for all six, which uniform phases give with probability 6e-10,
    and within 15% of the report (0.79 s) with 2%."""
    assert waiting_destroys() == 6
    assert waits_below(0.044, 6) == pytest.approx(6.45e-10, rel=0.01)
    assert waits_below(0.785, 6) == pytest.approx(0.0205, abs=0.001)
    assert waits_below(1.5, 6) == pytest.approx(0.5) and waits_below(3.0, 6) == 1.0 and waits_below(0.0, 6) == 0.0
    assert waits_below(0.25, 1) == pytest.approx(0.5)
