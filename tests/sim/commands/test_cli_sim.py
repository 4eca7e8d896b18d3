"""The ``timeshare sim`` command: the README's main job, scenario files in, JSON/trace/PNG out."""
import json
import re

from refimpl.cli import main


def test_timeshare_sim_alone_runs_the_default_scenario_on_8_ranks(capsys):
    assert main(["sim"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if re.match(r"\d+(-\d+)?\s", line)]
    ranks = []  # ranks with identical figures share a row ("0-7")
    for line in lines:
        a, _, b = line.split()[0].partition("-")
        ranks += list(range(int(a), int(b or a) + 1))
    assert ranks == list(range(8))
    header = " ".join(out.split("\u2500")[0].split())  # the header rows above the rule, words joined
    for phase in ("train", "sleep", "rollout", "wake_", "peak", "pinned"):
        assert phase in header
    assert "result: OK" in out and "hgx-h200-8x" in out
    # 13.5 GB per rank through a PCIe switch uplink shared by two GPUs: about half a second
    sleep = float(lines[0].split()[2])  # rank, train, sleep
    assert 0.45 < sleep < 0.55
    assert main([]) == 0  # `timeshare` with no command is the same main job


def test_sim_run_writes_result_trace_and_png(tmp_path, capsys):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({
        "name": "cli", "world_size": 2, "topology": "hgx-h200-8x", "payload": "real",
        "model": {"tensors": [{"name": "w", "shape": [4096], "dtype": "float32"}]},
        "offload": {"include": ["params"]}, "workload": {"rollout_s": 0.1}}))
    out, trace, png = tmp_path / "r.json", tmp_path / "t.json", tmp_path / "t.png"
    assert main(["sim", "run", str(scenario), "--out", str(out), "--trace", str(trace), "--png", str(png)]) == 0
    result = json.loads(out.read_text())
    assert result["ok"] and [r["bitwise_equal"] for r in result["ranks"]] == [True, True]
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "perfetto.dev" in capsys.readouterr().out


def test_invalid_scenario_exits_2_naming_the_field(tmp_path, capsys):
    scenario = tmp_path / "bad.json"
    scenario.write_text(json.dumps({"world_size": 2, "steps": 0}))
    assert main(["sim", "run", str(scenario)]) == 2
    assert "steps: expected an integer >= 1" in capsys.readouterr().err


def test_violated_invariant_exits_3(tmp_path, capsys):
    scenario = tmp_path / "hang.json"
    scenario.write_text(json.dumps({
        "world_size": 2, "payload": "real", "model": {"tensors": [{"name": "w", "shape": [64]}]},
        "faults": [{"kind": "hang", "ranks": [1], "at_point": "store.offload.begin"}], "steps": 2,
        "comm": {"watchdog": False}}))  # without the watchdog the hang is a deadlock: an invariant violated
    assert main(["sim", "run", str(scenario), "--quiet"]) == 3
    assert "INVARIANT VIOLATED" in capsys.readouterr().out


def test_sim_list_names_presets_and_examples(capsys):
    assert main(["sim", "list"]) == 0
    out = capsys.readouterr().out
    for name in ("hgx-h200-8x", "a6000-4x-nvlink", "relax_4xa6000_qwen3_4b", "scale_1024"):
        assert name in out
