"""No ``timeshare`` command prints a traceback, for any input (Hypothesis over the arguments and scenario fields).

Each example is one command line, run in-process through the real entry point :func:`refimpl.cli.main`:
``plan`` with any mix of its options and values (numbers out of range, NaN, words where numbers go, unknown
presets and models, a verl or ROLL config with random dotted overrides), ``bench switch-window`` with any mesh
and preset, ``sim run`` of a small scenario with random ``--set`` fields. What holds for every one:

* the exit status is an answer (0), a negative answer (1: nothing fits), bad input (2) or a simulated invariant
  violated (3); never 4, the status of a bug in ``timeshare``;
* nothing on stdout or stderr is a traceback;
* bad input (2) is one ``error:`` line on stderr (argparse's own usage errors are two lines: usage and error).
"""
import contextlib
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refimpl.cli import main
from refimpl.cli_errors import EXIT_BAD_INPUT, EXIT_BUG
from tests._hypothesis import BUDGET

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p) for p in (ROOT / "examples" / "configs").glob("*.yaml"))

numbers = st.one_of(st.integers(-3, 20).map(str), st.sampled_from(["0", "-1", "1e9", "nan", "inf", "x", "", "2.5"]))
# cheap plans: one GPU, or two of a node, so that an example that runs stays under a second
plan_options = st.fixed_dictionaries({}, optional={
    "--cluster": st.sampled_from(["h200-1x", "nosuch", "calibrated/h200-1x", "a6000-4x-nvlink", "hgx-h200-8x-ib"]),
    "--gpus-per-node": st.sampled_from(["1", "2", "0", "99"]),
    "--nodes": st.sampled_from(["1", "2", "0", "100000"]),
    "--model": st.sampled_from(["Qwen3-4B", "Llama-3-70B", "nosuch", "Qwen3-30B-A3B", "/no/such/config.json"]),
    "--params-b": st.sampled_from(["0.5", "0", "-1", "1000", "nan"]),
    "--tp": numbers, "--pp": numbers, "--cp": numbers, "--dp": numbers, "--ep": numbers, "--fsdp": numbers,
    "--prompts": numbers, "--samples": numbers, "--response-len": numbers, "--kv-gib": numbers,
    "--mfu": st.sampled_from(["0.35", "0", "1.5", "nan"]), "--gpu-tflops": st.sampled_from(["989", "0", "-5"]),
    "--rows": numbers, "--layouts": st.sampled_from(["given", "search", "bogus"]),
})
overrides = st.lists(st.sampled_from([
    "trainer.n_gpus_per_node=1", "trainer.nnodes=0", "data.train_batch_size=abc", "data.train_batch_size=2",
    "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.strategy=tpu",
    "actor_rollout_ref.rollout.n=-2", "num_gpus_per_node=2", "actor_train.device_mapping=list(range(0,3))",
    "actor_train.device_mapping=oops", "rollout_batch_size=4", "pretrain=nosuch/model", "=1", "novalue",
    "actor_rollout_ref.model.path=Qwen/Qwen3-4B", "response_length=${nosuch}",
]), max_size=3)


def _argv_plan(opts: dict, config: str | None, sets: list[str]) -> list[str]:
    argv = ["plan", "--quiet"]
    if config:
        argv += [config, *sets, "--gpus-per-node", "1", "--nodes", "1", "--layouts", "given",
                 "--cluster", "h200-1x"]
    elif "--cluster" not in opts:
        opts = {**opts, "--cluster": "h200-1x"}
    for k, v in opts.items():
        argv += [k, v]
    return argv


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's own usage errors (exit 2) and --help (0)
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def _assert_clean_exit(argv: list[str]) -> None:
    rc, out, err = _run(argv)
    assert "Traceback" not in out + err, (argv, err[-2000:])
    assert rc != EXIT_BUG, (argv, err)
    assert rc in (0, 1, 2, 3), (argv, rc, err)
    if rc == EXIT_BAD_INPUT:
        lines = err.strip().splitlines()
        assert lines and (len(lines) == 1 and lines[0].startswith("error:")
                          or lines[0].startswith("usage:")), (argv, err)


@given(opts=plan_options, config=st.sampled_from([None, None, *CONFIGS]), sets=overrides)
@BUDGET.settings(25)
def test_plan_never_crashes(opts, config, sets):
    _assert_clean_exit(_argv_plan(opts, config, sets))


@given(dp=numbers, tp=numbers, topology=st.sampled_from(["hgx-h200-8x", "h200-1x", "nosuch", "", "calibrated/hgx-h200-8x"]),
       policy=st.sampled_from([None, "suspend", "nosuch", "PAUSED_LIVE"]))
@BUDGET.settings(12)
def test_bench_switch_window_never_crashes(dp, tp, topology, policy):
    argv = ["bench", "switch-window", "--steps", "3", "--warmup", "1", "--dp", dp, "--tp", tp, "--topology", topology]
    argv += ["--policy", policy] if policy else ["--policy", "destroy"]
    _assert_clean_exit(argv)


SCENARIO = {"name": "fuzz", "world_size": 2, "topology": "hgx-h200-8x", "payload": "meta",
            "model": {"tensors": [{"name": "w", "shape": [1024], "dtype": "float32"}]},
            "offload": {"include": ["params"]}, "workload": {"rollout_s": 0.1}}
field_values = st.one_of(st.integers(-2, 9), st.sampled_from(['"x"', "null", "[]", "{}", "1e9", "-0.5", "true"]))
fields = st.sampled_from(["world_size", "steps", "topology", "pg_policy", "payload", "workload.rollout_s",
                          "workload.train_s", "offload.backend", "offload.include", "model.tensors", "mesh.tp",
                          "faults", "nodes", "name"])


@given(sets=st.lists(st.tuples(fields, field_values), max_size=3))
@BUDGET.settings(15)
def test_sim_run_never_crashes_on_scenario_fields(sets, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "s.json"
    path.write_text(json.dumps(SCENARIO))
    argv = ["sim", "run", str(path), "--quiet"]
    for k, v in sets:
        argv += ["--set", f"{k}={v}"]
    _assert_clean_exit(argv)


def test_a_bug_is_exit_4_with_one_line_and_a_report_file(monkeypatch, tmp_path):
    # a planted bug in a subcommand (the handler under test is the real entry point's): one line, the report file
    import sim.commands.plan

    def broken(args):
        return 1 / 0

    monkeypatch.setattr(sim.commands.plan, "inputs_from_args", broken)
    monkeypatch.setenv("TIMESHARE_BUG_DIR", str(tmp_path))
    rc, out, err = _run(["plan", "--quiet"])
    assert rc == EXIT_BUG and "Traceback" not in out + err
    line = err.strip()
    assert "\n" not in line and "ZeroDivisionError" in line and "a bug in timeshare" in line
    report = next(tmp_path.glob("timeshare-bug-*.txt"))
    assert str(report) in line and "Traceback" in report.read_text() and "command: timeshare plan" in report.read_text()


@pytest.mark.parametrize("bad", [math.nan, -1])
def test_numbers_out_of_range_are_bad_input(bad):
    rc, _out, err = _run(["plan", "--quiet", "--cluster", "h200-1x", "--mfu", str(bad)])
    assert rc == EXIT_BAD_INPUT and err.startswith("error: --mfu")
