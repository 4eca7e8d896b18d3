"""A progress bar with the time left on anything over a few seconds: drawn on stderr when it is a terminal, never on
stdout, and off with ``--quiet`` / ``--json`` or when stderr is not a terminal (a log file, a pipe).

Each command runs in-process through the real entry point with a stderr that says it is a terminal.
"""
import contextlib
import io

import pytest

from refimpl.cli import main


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as an interactive shell's is."""

    def isatty(self) -> bool:
        return True


def run(argv, *, tty=True):
    out, err = io.StringIO(), (Terminal() if tty else io.StringIO())
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def drew_a_bar(text: str) -> bool:
    """The bar's own marks: its 'time left' column and the bar characters."""
    return "time left" in text and "━" in text


PLAN = ["plan", "--cluster", "h200-1x", "--model", "Qwen3-4B", "--no-reference"]


def test_plan_draws_its_bar_on_stderr_and_never_on_stdout():
    rc, out, err = run(PLAN)
    assert rc == 0 and drew_a_bar(err)
    assert "\x1b" not in out and "━" not in out and "recommendation:" in out


@pytest.mark.parametrize("extra", [["--quiet"], ["--json"]], ids=" ".join)
def test_quiet_and_json_draw_no_bar(extra):
    rc, out, err = run([*PLAN, *extra])
    assert rc == 0 and not drew_a_bar(err) and "\x1b" not in out + err


def test_sim_run_draws_a_bar_over_the_ranks_phases():
    rc, out, err = run(["sim", "run", "default", "--set", "steps=2"])
    assert rc == 0 and drew_a_bar(err) and "simulating default" in err
    assert "\x1b" not in out and "result: OK" in out


def test_sim_run_without_a_terminal_draws_no_bar():
    rc, _out, err = run(["sim", "run", "default"], tty=False)
    assert rc == 0 and not drew_a_bar(err) and "\x1b" not in err


def test_bench_offload_draws_a_bar_over_the_methods(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(["bench", "offload", "--dry-run", "--shapes", "dense", "--cycles", "1", "--no-check",
                        "--methods", "store,per_tensor"])
    assert rc == 0 and drew_a_bar(err) and "bench offload" in err
    assert "\x1b" not in out


def test_the_sim_run_bar_counts_every_rank_s_phases():
    from sim.scenarios.scale import Progress, run_auto
    from sim.scenarios.scenario import parse_scenario
    from sim.scenarios.scenario_io import read_scenario_raw

    scn = parse_scenario(read_scenario_raw("default"))
    seen = []
    with Progress(lambda line: None, bar=lambda done, total, label: seen.append((done, total)), steps=scn.steps,
                  bar_every_s=0.01) as progress:
        run_auto(scn, fold=False, on_world=progress.watch)
    assert progress.phases() == (scn.world_size * scn.steps * 5, scn.world_size * scn.steps * 5)
    assert seen and all(d <= t for d, t in seen)


def test_plan_draws_a_bar_while_it_looks_for_the_nodes_a_model_needs():
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "examples" / "configs" / "verl_llama3-70b_one_node.yaml"
    rc, out, err = run(["plan", str(config), "--layouts", "given"])
    assert rc == 1 and "trainer.nnodes=2" in out
    assert drew_a_bar(err.split("plan: on more nodes", 1)[-1]) and "plan: on more nodes" in err
