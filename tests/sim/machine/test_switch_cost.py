"""The switch cost: the window plus what training's first collectives after the wake add ([Note: the switch cost])."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sim.machine.switch_cost import SwitchCostError, recorded_switch_cost, steady_switch_cost, switch_cost


def _step(sleep, update, wake, first, steady=0.0):
    return SimpleNamespace(sleep=sleep, update_weights=update, wake_up=wake, first_use_after=first,
                           steady_use_after=steady)


def test_one_step_is_the_window_plus_the_first_use_beyond_live_groups():
    c = switch_cost(1.5, 0.01, 0.004, 1.26, 0.01)
    assert c.window == pytest.approx(1.514) and c.first_use_extra == pytest.approx(1.25)
    assert c.total == pytest.approx(2.764)
    assert switch_cost(0.009, 0.001, 0.0, 0.005, 0.01).first_use_extra == 0.0  # never below the window
    with pytest.raises(SwitchCostError, match="first_use must be a non-negative"):
        switch_cost(1.0, 0.0, 0.0, None)


def test_a_wait_on_another_rank_is_counted_once_where_it_lands():
    # rank 1 wakes 0.3 s late; rank 0's first collective waits for it: the step costs what the slowest rank pays
    per_rank = [[_step(1.0, 0.1, 0.0, 1.3)], [_step(1.0, 0.1, 0.3, 1.0)]]
    c = steady_switch_cost(per_rank, 0)
    assert c.total == pytest.approx(2.4) and c.total == pytest.approx(c.window + c.first_use_extra)
    # means over the steady steps; a step without its first collectives timed is refused
    per_rank = [[_step(9.0, 0, 0, 9.0), _step(1.0, 0, 0, 1.0), _step(2.0, 0, 0, 1.0)]]
    assert steady_switch_cost(per_rank, 1).total == pytest.approx(2.5)
    with pytest.raises(SwitchCostError, match="step 0 has no timed first collectives"):
        steady_switch_cost([[_step(1.0, 0, 0, None)]], 0)


def test_a_record_without_the_second_pass_uses_paused_live_as_its_live_reference():
    results = {"PAUSED_LIVE": {"sleep": 0.009, "update_weights": 0.001, "wake_up": 0.0, "first_use_after_wake": 0.010},
               "SUSPEND_PLANNED": {"sleep": 0.003, "update_weights": 1.508, "wake_up": 0.004,
                                   "first_use_after_wake": 1.257},
               "OLD": {"sleep": 1.0, "update_weights": 0.0, "wake_up": 0.0}}
    assert recorded_switch_cost(results, "SUSPEND_PLANNED").total == pytest.approx(1.515 + 1.257 - 0.010)
    assert recorded_switch_cost(results, "OLD") is None  # not timed: no switch cost, never the window in its place


def test_the_simulated_rows_carry_the_lazy_init_after_the_wake():
    """The switch-window driver on 2 x H200 (calibrated preset): SUSPEND_PLANNED destroys every group, so their lazy
    NCCL init after the wake (1.1 s) is in its switch cost; PAUSED_LIVE keeps them live and pays none. The weight
    sync's destroy walk costs the 14 destroys' own cost with the runtime's proxy waker (its default), and waits for the
    proxies' polls without it."""
    from sim.calibrate.switch_window import simulate, summarize_simulated

    res = {}
    for row, wake in (("SUSPEND_PLANNED", True), ("PAUSED_LIVE", True), ("SUSPEND_PLANNED", False)):
        per_rank = simulate(row, dp=2, tp=1, steps=3, train_s=0.0, rollout_s=3.0, cooldown_s=2.0,
                            topology="calibrated/hgx-h200-8x", wake_proxies=wake)
        res[row, wake] = summarize_simulated(row, per_rank, 1, "calibrated/hgx-h200-8x")
    sp, live, waiting = res["SUSPEND_PLANNED", True], res["PAUSED_LIVE", True], res["SUSPEND_PLANNED", False]
    assert sp.switch_cost == pytest.approx(sp.total + sp.first_use_extra)
    assert 1.0 < sp.first_use_extra < 1.4 and 1.2 < sp.switch_cost < 1.6
    assert 0.2 < sp.update_weights < 0.3  # 14 destroys at 16.5-16.7 ms
    assert waiting.first_use_extra == pytest.approx(sp.first_use_extra, abs=1e-3)
    assert waiting.update_weights > 1.4 and waiting.switch_cost > 2.5  # the polls: three periods after the last init
    assert live.first_use_extra == pytest.approx(0.0, abs=1e-3)


def test_bench_switch_window_ranks_by_switch_cost(capsys):
    from refimpl.cli import main

    assert main(["bench", "switch-window", "--dp", "2", "--tp", "1", "--steps", "3", "--warmup", "1",
                 "--rollout-s", "3", "--policy", "destroy_deferred", "--policy", "suspend_planned_parallel"]) == 0
    out = capsys.readouterr().out
    header = out.split("─")[0]
    assert "switch" in header and "window" in header and "use +" in header and header.count("(s)") == 6
    assert max(len(line) for line in out.splitlines()) <= 100
    row = next(line for line in out.splitlines() if line.startswith("SUSPEND_PLANNED_PARALLEL"))
    cost, window = float(row.split()[1]), float(row.split()[6])
    assert cost > window + 1.0  # the lazy inits after the wake are counted in


def test_sim_compare_shows_each_sides_switch_cost():
    """A scenario that touches its groups carries its last step's switch cost (the lazy inits after the wake
    included), and ``timeshare sim compare`` shows it beside the phases."""
    from sim.scenarios.compare import compare
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import parse_scenario

    def side(policy):
        raw = {"name": policy, "topology": "calibrated/hgx-h200-8x", "world_size": 2, "mesh": {"dp": 2},
               "model": {"tensors": [{"name": "w", "shape": [1024], "dtype": "bfloat16", "category": "params"}]},
               "offload": {"backend": "local", "include": ["params"]}, "pg_policy": policy, "steps": 3,
               "workload": {"rollout_s": 3.0, "touch_groups": True}, "payload": "meta"}
        result, _, _ = run_scenario(parse_scenario(raw))
        assert result.ok, result.violations
        return result.to_dict()

    live, destroy = side("paused_live"), side("destroy_deferred")
    rows = {r["what"]: r for r in compare(live, destroy)}
    cost = rows["switch cost (max rank)"]
    last = destroy["ranks"][0]["phases_by_step"][-1]
    assert destroy["ranks"][0]["switch_cost"] == pytest.approx(
        last["sleep"] + last["update_weights"] + last["wake_up"] + last["first_use_extra"])
    assert last["first_use_extra"] > 0.1 and cost["b"] > cost["a"] + last["first_use_extra"]
