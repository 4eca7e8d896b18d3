"""``timeshare plan``: the search, its ranking and Pareto front, model inputs, and the command line."""
import json

import pytest

from refimpl.cli import main
from sim.planner.plan import (PG_POLICIES, Candidate, PlanInputs, Planner, default_inputs, make_plan, pareto, rank,
                             recommend)
from sim.planner.plan_inputs import (GiB, Layout, PlanInputError, Workload, model_preset, role_state, shape_from_hf_config,
                            shape_from_sizes)


@pytest.fixture(scope="module")
def default_plan():
    return make_plan(default_inputs())


def test_presets_match_published_parameter_counts():
    # published totals: Qwen2.5-7B 7.62B (with biases), Qwen3-30B-A3B 30.5B / 3.3B active, Llama-3-70B 70.6B
    assert 7.5e9 < model_preset("Qwen2.5-7B").params < 7.7e9
    moe = model_preset("qwen3-30b-a3b")  # case-insensitive
    assert 30.3e9 < moe.params < 30.7e9 and 3.2e9 < moe.active_params < 3.5e9 and moe.tensors == 18867
    assert 70.4e9 < model_preset("Llama-3-70B").params < 70.7e9
    with pytest.raises(PlanInputError, match="presets: Qwen2.5-7B"):
        model_preset("nosuch")


def test_hf_config_json_gives_the_same_shape_as_the_preset(tmp_path):
    cfg = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
           "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
           "tie_word_embeddings": False, "model_type": "qwen2"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    got, want = shape_from_hf_config(path), model_preset("Qwen2.5-7B")
    assert (got.params, got.kv_bytes_per_token, got.tensors) == (want.params, want.kv_bytes_per_token, want.tensors)
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(PlanInputError, match="not a JSON config.json"):
        shape_from_hf_config(path)


def test_role_state_shards_and_replicates_as_the_layout_says():
    m = model_preset("Qwen2.5-7B")
    full = role_state(m, Layout(dp=8).resolved(m, 8, 141e9), trained=True)
    assert full.bytes["optimizer"] == pytest.approx(m.params * 12 / 8, rel=1e-6) and full.replicas == 1
    assert not any(full.replicated.values())
    hsdp = role_state(m, Layout(dp=8, fsdp=4).resolved(m, 8, 141e9), trained=True)
    assert hsdp.replicas == 2 and hsdp.replicated["params"] == hsdp.bytes["params"]
    with pytest.raises(PlanInputError, match="--dp"):
        Layout(dp=3).resolved(m, 8, 141e9)
    with pytest.raises(PlanInputError, match="--params-b"):
        shape_from_sizes(0)


def test_default_plan_ranks_every_pg_policy_and_recommends_a_feasible_candidate(default_plan):
    outs = default_plan["outcomes"]
    assert {o["candidate"]["pg_policy"] for o in outs} == set(PG_POLICIES)
    feasible = [o for o in outs if o["feasible"]]
    assert feasible and feasible == outs[: len(feasible)]  # feasible first
    steps = [round(o["step_s"], 3) for o in feasible]  # ranked to the millisecond
    assert steps == sorted(steps)
    rec = default_plan["recommendation"]
    assert round(rec["step_s"], 3) == min(steps) and default_plan["reason"]
    labels = {o["candidate"]["label"] for o in feasible}
    # the ties are feasible candidates within the estimate's error of the fastest; the recommendation is one of them
    assert set(default_plan["ties"]) <= labels and rec["candidate"]["label"] in default_plan["ties"]
    # the step is the sum of its timeline
    assert sum(s["s"] for s in rec["timeline"]) == pytest.approx(rec["step_s"], rel=1e-9)


def test_offloading_more_gives_the_rollout_more_memory_and_costs_switch_time(default_plan):
    by = {(tuple(o["candidate"]["offload"]), o["candidate"]["score_offload"], o["candidate"]["pg_policy"]): o
          for o in default_plan["outcomes"]}
    none, everything = by[((), False, "none")], by[(("params", "grads", "optimizer"), False, "none")]
    m = model_preset("Qwen2.5-7B")
    state_gib = m.params * 16 / 8 / GiB
    assert everything["rollout_gib"] - none["rollout_gib"] == pytest.approx(state_gib, rel=0.01)
    assert everything["switch_s"] > none["switch_s"] + 0.5  # 14 GiB each way over a shared PCIe Gen5 uplink
    assert everything["pinned_rank_gib"] - none["pinned_rank_gib"] == pytest.approx(state_gib, rel=0.01)
    # suspend frees the communicators' memory for the rollout; paused_live keeps it
    sus, live = by[((), False, "suspend")], by[((), False, "paused_live")]
    assert sus["rollout_gib"] > live["rollout_gib"]


def test_fsdp_cpu_policy_frees_the_gpu_but_slows_the_update(default_plan):
    by = {(tuple(o["candidate"]["offload"]), o["candidate"]["score_offload"], o["candidate"]["pg_policy"]): o
          for o in default_plan["outcomes"]}
    cpu, none = by[(("fsdp_cpu",), False, "none")], by[((), False, "none")]
    assert cpu["compute_s"]["actor_train"] > none["compute_s"]["actor_train"]
    assert cpu["peak_gpu_gib"] < none["peak_gpu_gib"]


def test_local_dedup_is_offered_only_for_replicated_state_and_pins_less():
    m = model_preset("Qwen2.5-7B")
    full = Planner(PlanInputs(model=m, layout=Layout(dp=8)))
    assert all(c.backend == "local" for c in full.offload_candidates())
    hsdp = Planner(PlanInputs(model=m, layout=Layout(dp=8, fsdp=4)))
    off = ("params", "grads", "optimizer")
    local = hsdp.evaluate(Candidate(off, "local", False, "none", hsdp.orders()[0]))
    dedup = hsdp.evaluate(Candidate(off, "local_dedup", False, "none", hsdp.orders()[0]))
    assert dedup.pinned_rank_gib < local.pinned_rank_gib - 10  # half of ~28 GiB of replicated state
    assert dedup.switch_s != local.switch_s


def test_role_order_matters_only_when_switches_overlap():
    m = model_preset("Qwen2.5-7B")
    w = Workload(critic=True, reward_model=model_preset("Qwen3-4B"))
    off = ("params", "grads", "optimizer")
    for overlap in (False, True):
        p = Planner(PlanInputs(model=m, workload=w, overlap=overlap))
        assert len(p.orders()) == 6 and all(o[0] == "rollout" and o[-1] == "actor_train" for o in p.orders())
        switches = {round(p.evaluate(Candidate(off, "local", True, "none", o)).switch_s, 6) for o in p.orders()}
        if overlap:
            assert len(switches) > 1
        else:
            assert len(switches) == 1


def test_pareto_keeps_only_undominated_candidates(default_plan):
    p = Planner(default_inputs())
    outs = rank([p.evaluate(Candidate(off, "local", False, "none", p.orders()[0]))
                 for off in ((), ("params",), ("params", "grads", "optimizer"))])
    front = pareto(outs)
    for o in front:
        assert not any(q.step_s < o.step_s and q.rollout_gib > o.rollout_gib and q.pinned_node_gib < o.pinned_node_gib
                       for q in outs)


def test_cli_plan_json_is_the_common_envelope(capsys):
    assert main(["plan", "--json", "--quiet", "--model", "Qwen3-4B"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "timeshare/1" and out["command"] == "plan" and out["ok"] is True
    assert out["data"]["inputs"]["model"]["name"] == "Qwen3-4B" and out["data"]["recommendation"]


def test_cli_plan_without_arguments_says_it_runs_the_default(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert main(["plan", "--quiet", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "no arguments: planning the built-in default" in out and "recommendation:" in out and "Pareto front" not in out
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, words", [
    (["--model", "nosuch"], "unknown model"),
    (["--dp", "3"], "--dp"),
    (["--dp", "0"], "--dp"),
    (["--png", "out.txt"], ".png"),
    (["--cluster", "nosuch"], "--cluster"),
    (["--kv-gib", "-1"], "--kv-gib"),
])
def test_cli_plan_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert main(["plan", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and words in err and "\n" not in err


def test_nothing_fits_exits_1(capsys):
    # Llama-3-70B on one 8xH200 node with a strict 100 GiB KV need: the state alone leaves too little
    assert main(["plan", "--quiet", "--model", "Llama-3-70B", "--kv-gib", "100"]) == 1
    assert "does not fit:" in capsys.readouterr().out


def test_coarsened_simulation_matches_the_full_tensor_list():
    # the planner's shortcut (16 tensors per category + analytic per-copy latency) against the simulator
    # running every one of the 1,455 tensors of a Llama-2-7B FSDP 1/8 shard (docs/plan.md)
    from sim.scenarios.runner import run_scenario
    from sim.scenarios.scenario import parse_scenario

    p = Planner(PlanInputs(model=model_preset("Llama-2-7B"), layout=Layout(dp=8)))
    plan = p._simulate("actor_train", ("params", "grads", "optimizer"), "none")
    full, _world, _ = run_scenario(parse_scenario({
        "world_size": 8, "topology": "hgx-h200-8x", "model": {"preset": "dense-7b", "fsdp": 8},
        "offload": {"backend": "local"}, "steps": 2, "workload": {"rollout_s": p.rollout_full}}))
    assert sum(full.data["model"]["bytes_by_category"].values()) == p.states["actor_train"].total
    for ours, phase in (("offload_s", "sleep"), ("reload_s", "wake_up")):
        assert plan[ours] == pytest.approx(full.data["phases"][phase]["max"], rel=0.005)


def test_one_gpu_store_switch_is_within_10_percent_of_the_h200_measurement():
    # the benchmark's dense shape (a Llama-2-7B FSDP 1/8 shard: bf16 params + fp32 master and Adam moments,
    # 11.79 GB) offloaded and reloaded by the store on one H200, run 8 (bench/results/2026-11-29-h200-run8)
    from pathlib import Path

    report = json.loads((Path(__file__).resolve().parents[3] / "bench/results/2026-11-29-h200-run8"
                         / "2026-11-29-h200-offload.json").read_text())
    dense = next(s for s in report["shapes"] if s["shape"] == "dense-7b-1of8")
    measured = next(r for r in dense["results"] if r["method"] == "store")
    p = Planner(PlanInputs(model=shape_from_sizes(6738415616 / 8 / 1e9), cluster="h200-1x", layout=Layout(dp=1)))
    st = p.states["actor_train"]
    assert st.bytes["params"] + st.bytes["optimizer"] == dense["state_bytes"]
    sim = p._simulate("actor_train", ("params", "optimizer"), "none")
    # the plan leaves out the store's Python time (11.5 ms offload, docs/calibration.md), so it reads 3-4% low
    assert sim["offload_s"] == pytest.approx(measured["steady_offload_s"], rel=0.10)
    assert sim["reload_s"] == pytest.approx(measured["steady_reload_s"], rel=0.10)


def test_two_h200_pg_policy_ranking_and_switch_windows_match_the_measurement():
    # the 2 x H200 measurement the calibrated preset was not fitted on (bench/results/2026-11-30-h200x2-all-policies, every
    # PGPolicy): 14 NCCL groups per rank (mesh_groups(2, 1)), cooldown 2 s, rollout 3 s, 4 steps, the first 2 left
    # out; sleep + update + wake per policy
    from pathlib import Path

    from sim.planner.plan_inputs import GpuSpec
    from sim.calibrate.switch_window import mesh_groups

    report = json.loads((Path(__file__).resolve().parents[3] / "bench/results/2026-11-30-h200x2-all-policies"
                         / "multigpu-2026-11-30-nvidia-h200x2.json").read_text())["switch_window"]
    st = report["settings"]
    assert (st["dp"], st["tp"], st["train_s"]) == (2, 1, 0.0)
    assert st["groups_per_rank"] == len([g for g in mesh_groups(st["dp"], st["tp"]) if 0 in g.ranks]) == 14
    measured = {r["policy"]: r["total"] for r in report["results"]}
    # the calibrated H200 preset cut to its first two GPUs: the measured 2 x H200 host
    inputs = PlanInputs(model=model_preset("Qwen2.5-7B"), cluster="calibrated/hgx-h200-8x", gpus_per_node=2,
                        layout=Layout(dp=st["dp"], tp=st["tp"]), workload=Workload(rollout_s=st["rollout_s"]),
                        gpu=GpuSpec(989e12, "H200 dense bf16"), pg_groups="megatron", cooldown_s=st["cooldown_s"],
                        wake_proxies=False)  # the record predates the runtime's proxy waker
    plan = make_plan(inputs)
    assert plan["inputs"]["gpus"] == 2 and plan["inputs"]["pg_groups"] == "megatron"
    assert plan["inputs"]["wake_proxies"] is False
    assert (st["steps"], st["warmup"]) == (4, 2)  # the plan's lifecycle driver runs PG_STEPS, PG_WARMUP = 4, 2
    lead = plan["recommendation"]["candidate"]
    same = [o for o in plan["outcomes"] if all(o["candidate"][k] == lead[k]
                                                for k in ("offload", "backend", "score_offload", "order"))]
    # every policy of the PGPolicy enum (the per-group suspend_planned too) was a candidate for the lead setting
    assert {o["candidate"]["pg_policy"] for o in same} == set(PG_POLICIES)
    base = next(o["switch_s"] for o in same if o["candidate"]["pg_policy"] == "none")
    predicted = {o["candidate"]["pg_policy"].upper(): o["switch_s"] - base for o in same}
    for name, w in plan["pg_switch_windows"].items():  # the plan's switch carries exactly the simulated switch cost
        assert predicted[name.upper()] == pytest.approx(w["switch_cost"], abs=1e-6)
        assert w["switch_cost"] == pytest.approx(w["total"] + w["first_use"], abs=1e-9)  # the window + first use
    # this record did not time the first collectives after the wake: its windows are compared with the plan's
    window = {name.upper(): w["total"] for name, w in plan["pg_switch_windows"].items()}
    plan_rank = [o["candidate"]["pg_policy"].upper() for o in same if o["candidate"]["pg_policy"].upper() in measured]
    assert sorted(plan_rank, key=window.get) == sorted(measured, key=measured.get)
    predicted = {k: v for k, v in window.items()}
    for name, total in measured.items():
        if name == "PAUSED_LIVE":
            assert predicted[name] == pytest.approx(total, abs=0.05)
        elif name == "SUSPEND_PLANNED":  # its destroy walk missed one proxy poll (0.5 s) in both steps measured
            assert total - predicted[name] == pytest.approx(0.5, abs=0.05), (predicted[name], total)
        else:
            assert predicted[name] == pytest.approx(total, rel=0.15), (name, predicted[name], total)


def test_a_moe_models_dense_parameters_leave_its_experts_out():
    moe = model_preset("Qwen3-30B-A3B")
    assert moe.dense_params + moe.expert_params == moe.params
    assert 1.4e9 < moe.dense_params < 1.7e9  # attention, norms, routers and embeddings; 29.0B are in the experts
    # dp 8 (FSDP over all of it) and ep 8: eight ranks hold each parameter once, so their shards add up to the model
    lay = Layout(dp=8, ep=8).resolved(moe, 8, 141e9)
    st = role_state(moe, lay, trained=True)
    assert st.replicas == 1
    assert st.bytes["params"] * 8 == pytest.approx(moe.params * 2, rel=1e-6)
    assert st.bytes["optimizer"] * 8 == pytest.approx(moe.params * 12, rel=1e-6)


def test_a_candidate_that_fits_ranks_before_a_faster_one_that_does_not():
    # a strict 100 GiB KV need: offloading nothing leaves 98 GiB (does not fit) and skips the switch (faster)
    p = Planner(PlanInputs(model=model_preset("Qwen2.5-7B"), layout=Layout(dp=8), workload=Workload(kv_gib=100.0)))
    order = p.orders()[0]
    resident = p.evaluate(Candidate((), "local", False, "none", order))
    offloaded = p.evaluate(Candidate(("params", "grads", "optimizer"), "local", False, "none", order))
    assert not resident.feasible and offloaded.feasible and resident.step_s < offloaded.step_s
    ranked = rank([resident, offloaded])
    assert ranked == [offloaded, resident]
    best, why = recommend(ranked)
    assert best is offloaded and "offloading nothing does not fit" in why


def test_plan_fills_in_dp_as_the_gpus_left_over_by_tp_pp_and_cp():
    import argparse

    from sim.commands.plan import add_arguments, inputs_from_args

    def layout(*argv):
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return inputs_from_args(parser.parse_args(["--model", "Qwen3-4B", *argv]))[0].layout

    assert layout().dp == 8  # one node of 8 GPUs
    assert layout("--tp", "2").dp == 4
    assert layout("--tp", "2", "--pp", "2").dp == 2
    assert layout("--pp", "2", "--cp", "2").dp == 2


def test_a_layout_within_the_estimates_error_of_the_fastest_keeps_the_users_own():
    # Qwen3-4B on 2 GPUs, all state offloaded: FSDP over both is a few hundredths of a second faster than the user's
    # DDP layout, far inside the estimate's error, so the plan keeps the user's layout (less to change)
    everything = ("params", "grads", "optimizer")
    inputs = PlanInputs(model=model_preset("Qwen3-4B"), cluster="hgx-h200-8x", gpus_per_node=2,
                        layout=Layout(dp=2, fsdp=1), layouts=[Layout(dp=2, fsdp=2)], workload=Workload(reference=False),
                        allow=lambda off, backend, score, pg: off == everything and pg == "none" and not score)
    rows = {r["layout"]: r for r in make_plan(inputs)["layouts"] if "layout" in r}
    mine, other = rows["dp 2 hsdp 1x2"], rows["dp 2 fsdp 2"]
    assert mine["mine"] and other["step_s"] < mine["step_s"]
    assert mine.get("chosen") and not other.get("chosen")
