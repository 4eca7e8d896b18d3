"""What a new user met across ~45 command lines, one test per finding: each failed before the fix.

Runs the real entry point in-process (:func:`refimpl.cli.main`) and reads what a person reads.
"""
import contextlib
import io
import json
from pathlib import Path

import pytest

from refimpl.cli import main
from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_FAILED

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "configs"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    assert "Traceback" not in out.getvalue() + err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def plan_json(argv):
    rc, out, _err = run(["plan", "--quiet", "--json", *argv])
    return rc, json.loads(out)["data"]


def test_a_candidate_that_overflows_pinned_host_memory_is_an_answer_not_a_crash():
    # Llama-3-70B on one GPU of an 8 x H200 node: offloading everything pins more host memory than the node has
    rc, data = plan_json(["--model", "Llama-3-70B", "--gpus-per-node", "1"])
    assert rc == EXIT_FAILED and data["recommendation"] is None
    reasons = [o["reason"] for o in data["outcomes"]]
    assert any(r.startswith("host pinned memory") and " GiB > " in r for r in reasons), reasons
    assert data["reason"].startswith("does not fit:")
    # the floor a starved rollout is held to is one sequence, not the batch's KV need the header states
    kv = [r for r in reasons if "of KV cache" in r]
    assert kv and all("needs at least" in r and "for one sequence" in r for r in kv), kv


def test_switch_window_with_more_ranks_than_the_preset_has_gpus_is_exit_2():
    rc, _out, err = run(["bench", "switch-window", "--dp", "8", "--tp", "2"])
    assert rc == EXIT_BAD_INPUT
    assert err.strip() == ("error: --dp 8 x --tp 2 = 16 ranks, but --topology calibrated/hgx-h200-8x has 8 GPUs; "
                           "lower --dp or --tp, or pick a larger preset")


def test_tensor_parallel_changes_the_plan():
    two = ["--model", "Qwen3-4B", "--no-reference", "--cluster", "hgx-h200-8x", "--gpus-per-node", "2"]
    _rc, fsdp = plan_json(two)
    _rc, tp2 = plan_json([*two, "--tp", "2"])
    a, b = fsdp["recommendation"], tp2["recommendation"]
    assert b["layout_s"]["actor_train"]["tp"] > 0 and a["layout_s"]["actor_train"]["tp"] == 0
    assert a["layout_s"]["actor_train"]["fsdp"] > 0 or a["layout_s"]["actor_train"]["total"] >= 0
    assert b["step_s"] != pytest.approx(a["step_s"], rel=1e-3)
    # TP shards the activations of the actor's turn; FSDP 2 shards the state as much as TP 2 does
    assert b["memory_gib"]["actor_train"] < a["memory_gib"]["actor_train"]


@pytest.fixture(scope="module")
def starved():
    """Llama-3-70B on one 8 x H200 node with a strict 100 GiB KV need: nothing fits (JSON and the text)."""
    argv = ["--model", "Llama-3-70B", "--kv-gib", "100"]
    rc, data = plan_json(argv)
    rc_text, out, _err = run(["plan", "--quiet", *argv, "--rows", "40"])
    return rc, data, rc_text, out


def test_a_candidate_that_does_not_fit_has_no_step_time(starved):
    rc, data, rc_text, out = starved
    assert rc == rc_text == EXIT_FAILED
    assert all(o["step_s"] is None for o in data["outcomes"] if not o["feasible"])
    numbers = [float(w.replace(",", "")) for line in out.splitlines() for w in line.split()
               if w.replace(".", "", 1).replace(",", "").isdigit()]
    assert max(numbers) < 1e6, max(numbers)


def test_plan_tables_fit_100_columns_and_every_header_has_a_unit(starved):
    out = starved[3]
    assert max(len(line) for line in out.splitlines()) <= 100
    header = next(line for line in out.splitlines() if line.startswith("#"))
    for col in ("step (s)", "switch (s)", "peak (GiB)", "KV (GiB)", "host/node (GiB)"):
        assert col in header
    assert "Pareto" not in out


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "100000"], "--nodes 100000: at most"),
    (["--nodes", "4", "--cluster", "hgx-h200-8x"], "is one node with no network"),
    (["--nodes", "2", "--cluster", "h200-1x"], "is one node with no network"),
])
def test_more_nodes_than_the_preset_can_have_is_refused(argv, words):
    rc, _out, err = run(["plan", "--quiet", *argv])
    assert rc == EXIT_BAD_INPUT and words in err and err.count("\n") == 1


def test_calibrated_preset_needs_no_gpu_tflops():
    rc, data = plan_json(["--cluster", "calibrated/hgx-h200-8x", "--gpus-per-node", "2", "--model", "Qwen3-4B"])
    assert rc == 0 and data["inputs"]["gpu"]["flops"] == 989e12


def test_differences_inside_the_estimates_error_are_ties_not_a_ranking():
    from sim.planner.plan_rank import Candidate, Outcome, recommend, tie_margin, ties

    def out(off, pg, step, switch):
        return Outcome(Candidate(off, "local", False, pg, ()), True, "", step, switch, {}, 300.0, 50.0, 80.0, 1, 8)

    # the finding: 351.38 vs 351.59 s, the offload one first; the switch model is good to 15%
    a, b = out(("params",), "suspend", 351.38, 2.0), out((), "none", 351.59, 2.2)
    assert 351.59 - 351.38 < tie_margin(a, b)
    best, why = recommend([a, b])
    assert ties([a, b]) == [a, b] and best is b and "a tie" in why  # the one with fewer moving parts
    c = out(("params",), "none", 340.0, 1.0)
    best, why = recommend([c, a, b])
    assert best is c and "margin" in why


def test_pg_policies_compete_on_the_kv_cache_they_give_back():
    # when the rollout is starved of KV cache, a PG policy that frees NCCL memory gets more of it than pg none
    rc, data = plan_json(["--cluster", "calibrated/hgx-h200-8x", "--gpus-per-node", "2", "--model", "Qwen2.5-7B",
                          "--prompts", "1024", "--pg-groups", "megatron", "--gpu-tflops", "989"])
    by_pg = {}
    for o in data["outcomes"]:
        if o["feasible"]:
            by_pg.setdefault(o["candidate"]["pg_policy"], o["rollout_gib"])
    assert by_pg["suspend"] > by_pg["none"]


def test_verl_config_is_read_and_answered_in_verl_keys():
    rc, data = plan_json([str(CONFIGS / "verl_fsdp2_qwen2.5-7b_grpo.yaml"), "data.train_batch_size=64",
                          "--layouts", "given"])
    assert rc == 0
    w = data["inputs"]["workload"]
    assert (w["prompts"], w["samples_per_prompt"], w["prompt_len"], w["response_len"]) == (64, 8, 1024, 2048)
    ans = data["answer"]
    assert ans["framework"] == "verl"
    keys = ans["keys"]
    for k in ("actor_rollout_ref.actor.fsdp_config.param_offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
              "actor_rollout_ref.ref.fsdp_config.param_offload", "actor_rollout_ref.rollout.gpu_memory_utilization"):
        assert k in keys
    assert "param_offload:" in ans["snippet"] and "actor_rollout_ref:" in ans["snippet"]
    # every candidate is one verl can express: no store backends or PG policies it has no key for
    assert {o["candidate"]["pg_policy"] for o in data["outcomes"]} == {"none"}
    assert {o["candidate"]["backend"] for o in data["outcomes"]} == {"local"}


def test_roll_config_is_answered_in_roll_keys(tmp_path):
    rc, data = plan_json([str(CONFIGS / "roll_megatron_qwen3-30b-a3b.yaml"), "--layouts", "given"])
    assert rc == 0
    keys = data["answer"]["keys"]
    # ROLL offloads every role's state or none; it has no store-backend key, and forces offload_nccl off
    assert "is_offload_states" in keys and not any("offload_backend" in k or "offload_nccl" in k for k in keys)
    assert data["inputs"]["gpus"] == 16 and data["inputs"]["layout"]["ep"] == 4


def test_a_70b_that_does_not_fit_one_node_says_why_and_how_many_nodes_it_needs():
    rc, out, _err = run(["plan", str(CONFIGS / "verl_llama3-70b_one_node.yaml"), "--layouts", "given"])
    assert rc == EXIT_FAILED
    assert "answer: does not fit: actor_train needs" in out and "trainer.nnodes=2" in out


def test_bad_config_input_is_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("actor_rollout_ref: {model: {path: Qwen/Qwen2.5-7B}}\ntrainer: {n_gpus_per_node: eight}\n")
    rc, _out, err = run(["plan", "--quiet", str(bad)])
    assert rc == EXIT_BAD_INPUT and err.strip() == f"error: {bad}: trainer.n_gpus_per_node: expected an integer, got 'eight'"
    rc, _out, err = run(["plan", "--quiet", str(CONFIGS / "verl_fsdp2_qwen2.5-7b_grpo.yaml"), "novalue"])
    assert rc == EXIT_BAD_INPUT and "KEY=VALUE" in err


def test_bench_offload_dry_run_writes_to_the_current_directory_and_checks_no_gpu_targets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, _err = run(["bench", "offload", "--dry-run", "--shapes", "dense", "--cycles", "1", "--no-check",
                         "--methods", "store"])
    assert rc == 0
    assert [p.name for p in tmp_path.glob("*-offload.json")] and not (tmp_path / "bench").exists()
    assert "MISSED" not in out and "targets not checked" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_demo_on_cpu_reports_no_negative_memory_returned():
    rc, out, _err = run(["demo", "--device", "cpu", "--layers", "1", "--hidden", "32", "--vocab", "64"])
    assert rc == 0 and "returned per the driver: -" not in out and "no device memory to" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_worker_memory_figures_are_named_by_their_unit():
    import inspect

    from refimpl.worker import control

    src = inspect.getsource(control)
    assert "used_gib" in src and "used_gb" not in src


def _header_of(out):
    """The lines of a table's header (above its rule)."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if set(line.strip()) == {"─"})
    return "\n".join(lines[:rule])


def test_sim_run_and_compare_tables_fit_100_columns_with_a_unit_in_every_header(tmp_path):
    rc, out, _err = run(["sim", "run", "default", "--out", str(tmp_path / "r.json")])
    assert rc == 0 and max(len(line) for line in out.splitlines()) <= 100
    header = _header_of(out)
    for phase in ("train", "sleep", "rollout"):
        assert phase in header
    assert header.count("(s)") == 5 and header.count("(GiB)") == 3  # five phases, three memory peaks
    assert "0-7" in out  # eight ranks with the same figures: one row
    rc, out, _err = run(["sim", "compare", str(tmp_path / "r.json"), str(tmp_path / "r.json")])
    assert rc == 0 and max(len(line) for line in out.splitlines()) <= 100 and "B/A (x)" in out


def test_the_fastest_candidate_alone_is_not_marked_as_a_tie():
    from sim.commands.plan_report import candidate_table

    def outcome(label, step):
        return {"candidate": {"label": label}, "step_s": step, "switch_s": 0.1, "feasible": True, "peak_gpu_gib": 1.0,
                "rollout_gib": 1.0, "pinned_node_gib": 1.0, "pinned_rank_gib": 1.0, "layout_s": {}, "reason": ""}

    plan = {"outcomes": [outcome("a", 10.0), outcome("b", 12.0)], "ties": ["a"]}
    first = next(line for line in candidate_table(plan, 5).splitlines() if line.startswith("1"))
    assert not first.startswith("1=")
    plan["ties"] = ["a", "b"]
    assert [line[:2] for line in candidate_table(plan, 5).splitlines() if line[:1] in "12"] == ["1=", "2="]


def test_the_plan_picture_gives_no_colour_two_meanings():
    from sim.commands.plan_report import CAPACITY_COLOUR, SEGMENT_COLOURS
    from sim.scenarios.trace import PHASE_COLOURS

    for colours in (SEGMENT_COLOURS, PHASE_COLOURS):
        assert len(set(colours.values())) == len(colours)
    assert CAPACITY_COLOUR not in SEGMENT_COLOURS.values()


def test_the_readme_and_the_guide_list_every_exit_code():
    import re

    from refimpl import cli_errors

    codes = {v for k, v in vars(cli_errors).items() if k.startswith("EXIT_")}
    readme = (ROOT / "README.md").read_text()
    said = readme[readme.index("Exit codes:"):].split("\n\n")[0]
    assert {int(c) for c in re.findall(r"\b(\d) (?:done|a |bad|an )", said)} == codes, said
    guide = (ROOT / "docs" / "guide.md").read_text()
    assert {int(c) for c in re.findall(r"^\| (\d) \|", guide, re.MULTILINE)} == codes
