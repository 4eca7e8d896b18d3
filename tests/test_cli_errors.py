"""CLI error hygiene (issue 14 item 7) and the exploration workflow (issue 13): one line, distinct exit codes.

Every case runs the real ``timeshare`` entry point in-process and checks the exit status and that
stderr is exactly one ``error: ...`` line (no traceback).
"""
import json

import pytest

from refimpl.cli import main
from refimpl.cli_errors import EXIT_BAD_INPUT
from refimpl.comm import LifecycleConfig, PGPolicy

TINY = {"name": "tiny", "world_size": 2, "topology": "hgx-h200-8x", "payload": "real",
        "model": {"tensors": [{"name": "w", "shape": [1024], "dtype": "float32"}]},
        "offload": {"include": ["params"]}, "workload": {"rollout_s": 0.1}}


@pytest.fixture
def scenario(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(TINY))
    return path


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("argv, words", [
    (["sim", "run", "{s}", "--out", "{d}/missing/r.json"], ["does not exist"]),
    (["sim", "run", "{s}", "--out", "{d}"], ["is a directory"]),
    (["sim", "run", "{s}", "--png", "{d}/out.txt"], [".png"]),
    (["sim", "run", "{s}", "--set", "steps"], ["KEY=VALUE"]),
    (["sim", "run", "{s}", "--set", "steps=0"], ["steps: expected an integer >= 1"]),
    (["bench", "offload", "--dry-run", "--cycles", "-1"], ["--cycles"]),
    (["bench", "offload", "--dry-run", "--shapes", "foo"], ["--shapes"]),
    (["bench", "offload", "--dry-run", "--device", "tpu"], ["--device", "tpu"]),
    (["bench", "offload", "--dry-run", "--out", "{s}"], ["not a directory"]),
    (["bench", "switch-window", "--dp", "0"], ["--dp"]),
    (["bench", "switch-window", "--topology", "nosuch"], ["--topology", "nosuch"]),
    (["bench", "switch-window", "--policy", "nosuch"], ["--policy", "nosuch"]),
    (["bench", "switch-window", "--json", "{d}/missing/x.json"], ["does not exist"]),
    (["demo", "--device", "tpu"], ["--device"]),
    (["demo", "--layers", "0"], ["--layers"]),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, scenario, tmp_path, capsys):
    argv = [a.format(s=scenario, d=tmp_path) for a in argv]
    assert main(argv) == EXIT_BAD_INPUT
    one_line_error(capsys, *words)
    assert not (tmp_path / "missing").exists()


def test_full_disk_is_one_line(scenario, capsys):
    # /dev/full accepts the open and fails every write with ENOSPC, after the pre-run checks passed
    assert main(["sim", "run", str(scenario), "--quiet", "--out", "/dev/full"]) == EXIT_BAD_INPUT
    one_line_error(capsys, "no space left")


def test_non_utf8_scenario_is_one_line(tmp_path, capsys):
    bad = tmp_path / "latin1.json"
    bad.write_bytes(json.dumps({**TINY, "name": "caf\u00e9"}, ensure_ascii=False).encode("latin-1"))
    assert main(["sim", "run", str(bad)]) == EXIT_BAD_INPUT
    one_line_error(capsys, "not UTF-8", "0xe9")


def test_yaml_scenario_and_set_overrides(tmp_path, capsys):
    yaml = pytest.importorskip("yaml")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert main(["sim", "run", str(path), "--json", "--set", "workload.rollout_s=0.5", "--set", "pg_policy=SUSPEND",
                 "--set", "name=from-yaml"]) == EXIT_BAD_INPUT  # pg_policy strings are lower case in scenarios
    one_line_error(capsys, "pg_policy")
    assert main(["sim", "run", str(path), "--json", "--set", "workload.rollout_s=0.5", "--set", "name=from-yaml"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["format"] == "timeshare/1" and out["command"] == "sim run" and out["ok"]
    assert out["data"]["scenario"] == "from-yaml"
    assert out["data"]["phases"]["rollout"]["mean"] == pytest.approx(0.5)


def test_sim_compare_puts_phases_side_by_side(tmp_path, scenario, capsys):
    result = tmp_path / "a.json"
    assert main(["sim", "run", str(scenario), "--quiet", "--out", str(result)]) == 0
    capsys.readouterr()
    assert main(["sim", "compare", str(result), str(scenario), "--set", "workload.rollout_s=0.3"]) == EXIT_BAD_INPUT
    one_line_error(capsys, "--set applies to scenarios")  # A is a result file: there is nothing to override
    assert main(["sim", "compare", str(scenario), str(scenario), "--set-b", "workload.rollout_s=0.3", "--json"]) == 0
    rows = {r["what"]: r for r in json.loads(capsys.readouterr().out)["data"]["rows"]}
    assert rows["rollout"]["a"] == pytest.approx(0.1) and rows["rollout"]["b"] == pytest.approx(0.3)
    assert rows["rollout"]["ratio"] == pytest.approx(3.0)
    assert main(["sim", "compare", str(result), str(result)]) == 0
    out = capsys.readouterr().out
    assert "sleep (s)" in out and "peak GPU (GiB)" in out and "1.000" in out


def test_policy_names_are_accepted_in_any_spelling():
    assert PGPolicy("suspend") is PGPolicy("SUSPEND") is PGPolicy.parse("Suspend") is PGPolicy.SUSPEND
    assert PGPolicy.parse("destroy-deferred") is PGPolicy.DESTROY_DEFERRED
    assert LifecycleConfig(policy="paused_live").policy is PGPolicy.PAUSED_LIVE
    with pytest.raises(ValueError, match="expected one of"):
        PGPolicy.parse("nosuch")


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("timeshare 0.")
