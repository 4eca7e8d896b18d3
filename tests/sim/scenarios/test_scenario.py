"""Scenarios: validated with errors that name the field, run end to end, judged by their invariants."""
import copy
import json
from pathlib import Path

import pytest

from sim.machine.faults import FaultType
from sim.presets import list_scenarios, scenario_path
from sim.presets.models import ARCHITECTURES
from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import BACKENDS, PG_POLICIES, ScenarioError, _TOP, load_scenario, parse_scenario

SCHEMA = json.loads((Path(__file__).parents[3] / "sim" / "schema" / "scenario.schema.json").read_text())

SMALL = {
    "name": "small",
    "topology": "hgx-h200-8x",
    "world_size": 4,
    "mesh": {"dp": 2, "tp": 2},
    "model": {"tensors": [
        {"name": "w", "shape": [512, 64], "dtype": "bfloat16", "category": "params"},
        {"name": "g", "shape": [512, 64], "dtype": "bfloat16", "category": "grads"},
        {"name": "m", "shape": [300, 7], "dtype": "float32", "category": "optimizer"},
        {"name": "step", "shape": [1], "dtype": "int64", "category": "optimizer"},
    ]},
    "offload": {"backend": "local", "include": ["params", "grads", "optimizer"]},
    "workload": {"train_s": 0.1, "rollout_s": 1.0, "rollout_memory_fraction": 0.5,
                 "export": {"group": "tp", "bucket_bytes": 4096, "ipc_s": 0.01}},
    "steps": 2,
    "payload": "real",
}


def _with(**changes):
    raw = copy.deepcopy(SMALL)
    for path, value in changes.items():
        node = raw
        *parents, last = path.split("__")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DROP:
            del node[last]
        else:
            node[int(last) if isinstance(node, list) else last] = value
    return raw


_DROP = object()


@pytest.mark.parametrize("changes, message", [
    ({"world_size": _DROP}, r"^world_size: required"),
    ({"world_size": 0}, r"^world_size: expected an integer >= 1"),
    ({"colour": "blue"}, r"^colour: unknown field"),
    ({"topology": "cray-1"}, r"^topology\.preset: unknown preset 'cray-1'"),
    ({"mesh": {"dp": 3, "tp": 2}}, r"^mesh: sizes .* multiply to 6, not world_size 4"),
    ({"groups": [{"name": "tp", "dims": ["pp"]}]}, r"^groups\[0\]\.dims"),
    ({"model__tensors__1__dtype": "float8"}, r"^model\.tensors\[1\]\.dtype: 'float8'"),
    ({"model__tensors__0__shape": [0, 4]}, r"^model\.tensors\[0\]\.shape"),
    ({"model__preset": "dense-7b"}, r"^model: give exactly one of 'preset'"),
    ({"offload__backend": "nvme"}, r"^offload\.backend: 'nvme' is not one of"),
    ({"pg_policy": "keep"}, r"^pg_policy: 'keep' is not one of"),
    ({"workload__rollout_s": -1}, r"^workload\.rollout_s: expected a number >= 0"),
    ({"workload__export__group": "pp"}, r"^workload\.export\.group: 'pp' is not a group family"),
    ({"faults": [{"kind": "crash", "ranks": [7]}]}, r"^faults\[0\]\.ranks: \[7\] names ranks outside world_size 4"),
    ({"payload": "real", "model": {"preset": "dense-7b"}}, r"^payload: 'real' would allocate"),
    # issue 11: a link that does not exist is named, not a FlowError traceback from inside the run
    ({"faults": [{"kind": "slow_link", "link": "n0/pcisw9", "factor": 0.5, "at_time": 0.0}]},
     r"^faults\[0\]\.link: 'n0/pcisw9' is not a link or element of topology 'hgx-h200-8x-calibrated'"),
    # issue 11: ranks on nodes without NICs, named as such (was a deadlock "waiting for ranks []")
    ({"world_size": 16, "mesh": {"dp": 8, "tp": 2}, "topology": {"preset": "hgx-h200-8x", "nodes": 2},
      "payload": "meta"}, r"^topology\.nodes: 2 nodes of 'calibrated/hgx-h200-8x' have no NICs"),
    ({"topology": {"preset": "hgx-h200-8x", "calibrated": "no"}}, r"^topology\.calibrated: expected true or false"),
])
def test_a_bad_scenario_gets_an_error_naming_the_field(changes, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_with(**changes))


def test_a_machine_with_a_calibrated_preset_gets_it_unless_the_scenario_asks_for_the_datasheet():
    """`timeshare sim list` marks the calibrated presets; a scenario naming the machine runs on its measured
    constants, as `plan` and `bench switch-window` do; `"calibrated": false` keeps the datasheet preset."""
    from sim.presets import load_preset_data

    cal, data = load_preset_data("calibrated/hgx-h200-8x"), load_preset_data("hgx-h200-8x")
    assert cal["comm"] != data["comm"]  # else the test below could not tell them apart
    for topology in ("hgx-h200-8x", {"preset": "hgx-h200-8x", "nodes": 1}):
        scn = parse_scenario(_with(topology=topology))
        assert scn.topology_name == "calibrated/hgx-h200-8x" and scn.topology["comm"] == cal["comm"]
    scn = parse_scenario(_with(topology={"preset": "hgx-h200-8x", "calibrated": False}))
    assert scn.topology_name == "hgx-h200-8x" and scn.topology["comm"] == data["comm"]
    # a machine without a calibrated variant is itself
    assert parse_scenario(_with(topology="hgx-h200-8x-ib")).topology_name == "hgx-h200-8x-ib"


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read the scenario"):
        load_scenario(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"world_size": 4,,}')
    with pytest.raises(ScenarioError, match=r"not valid JSON \(line 1"):
        load_scenario(bad)


def _check(instance, schema, path="$"):
    """A small JSON Schema checker for the keywords the scenario schema uses."""
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not _errors(instance, s, path)]
        assert len(ok) == 1, f"{path}: matches {len(ok)} of oneOf"
    if "not" in schema:
        assert _errors(instance, schema["not"], path), f"{path}: matches 'not'"
    if "enum" in schema:
        assert instance in schema["enum"], f"{path}: {instance!r} not in enum"
    types = schema.get("type")
    if types:
        types = types if isinstance(types, list) else [types]
        py = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
              "integer": int, "number": (int, float)}
        assert any(isinstance(instance, py[t]) and not (t in ("integer", "number") and isinstance(instance, bool))
                   for t in types), f"{path}: not {types}"
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        assert instance >= schema.get("minimum", instance), f"{path}: below minimum"
        assert instance <= schema.get("maximum", instance), f"{path}: above maximum"
    if isinstance(instance, dict):
        for k in schema.get("required", []):
            assert k in instance, f"{path}: missing {k}"
        props = schema.get("properties", {})
        for k, v in instance.items():
            if k in props:
                _check(v, props[k], f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                raise AssertionError(f"{path}.{k}: not allowed")
            elif isinstance(schema.get("additionalProperties"), dict):
                _check(v, schema["additionalProperties"], f"{path}.{k}")
    if isinstance(instance, list) and "items" in schema:
        for i, v in enumerate(instance):
            _check(v, schema["items"], f"{path}[{i}]")


def _errors(instance, schema, path):
    try:
        _check(instance, schema, path)
    except AssertionError as exc:
        return str(exc)
    return None


def test_the_shipped_schema_matches_the_loader_and_every_example_scenario():
    props = SCHEMA["properties"]
    assert set(props) == _TOP
    assert props["pg_policy"]["enum"] == list(PG_POLICIES)
    assert props["offload"]["properties"]["backend"]["enum"] == list(BACKENDS)
    assert props["model"]["properties"]["preset"]["enum"] == sorted(ARCHITECTURES)
    assert props["faults"]["items"]["properties"]["kind"]["enum"] == [k.value for k in FaultType]
    assert {"default", "relax_4xa6000_qwen3_4b", "relax_4xa6000_qwen3_4b_baseline", "scale_1024"} <= set(list_scenarios())
    for name in list_scenarios():
        raw = json.loads(scenario_path(name).read_text())
        _check(raw, SCHEMA, name)
        parse_scenario(raw)
    _check(SMALL, SCHEMA)
    assert _errors({"world_size": 2, "pg_policy": "keep"}, SCHEMA, "$")
    assert _errors({"world_size": 2, "workload": {"rollout_memory_gib": 1, "rollout_memory_fraction": 0.1}}, SCHEMA, "$")


def test_real_payload_round_trip_is_bitwise_equal_and_memory_comes_back():
    result, world, _ = run_scenario(parse_scenario(SMALL))
    assert result.ok, result.violations
    d = result.to_dict()
    assert d["ok"] and d["violations"] == []
    for r in d["ranks"]:
        assert r["status"] == "finished" and r["bitwise_equal"] is True
        # the phases, and what the train phase's first collectives after the wake added (part of the switch cost)
        assert set(r["phases"]) == {"train", "sleep", "update_weights", "rollout", "wake_up", "first_use_extra"}
        assert 0 <= r["phases"]["first_use_extra"] <= r["phases"]["train"]
        assert len(r["phases_by_step"]) == 2
        assert r["peak_host_pinned_bytes"] > 0
        # the engine's half of the GPU shows in the rollout phase, after the state left
        assert r["phase_peak_device_bytes"]["rollout"] >= 0.5 * 141e9
    for rank in range(4):  # after the last reload only the state, the world communicator and nothing else
        holders = world.memory.holders(rank)
        assert "rollout engine" not in holders and not any(k.startswith("export") for k in holders)
    json.dumps(d)  # the result is JSON


def test_a_tensor_that_comes_back_different_is_an_invariant_violation(monkeypatch):
    import refimpl.store.store as store_mod

    real_reload = store_mod.OffloadStore.reload_async

    async def corrupting_reload(self, include=None):
        await real_reload(self, include)
        if self.rt.rank == 2:  # flip one element of one tensor on one rank after a reload
            for c in self._collectors:
                for t in getattr(c, "tensors", {}).values():
                    t.view(-1)[0] += 1
                    return

    monkeypatch.setattr(store_mod.OffloadStore, "reload_async", corrupting_reload)
    result, _, _ = run_scenario(parse_scenario(_with(steps=1)))
    assert not result.ok and result.exit_code == 3
    assert any(v.startswith("rank 2: tensors not bitwise equal") for v in result.violations)


def test_injected_crash_is_reported_not_a_violation_but_a_hang_that_blocks_peers_is_a_deadlock():
    crash = _with(faults=[{"kind": "crash", "ranks": [1], "at_point": "store.offload.begin"}], steps=1,
                  workload={"rollout_s": 1.0})
    result, _, _ = run_scenario(parse_scenario(crash))
    ranks = result.to_dict()["ranks"]
    assert ranks[1]["status"] == "crashed" and result.to_dict()["faults_fired"][0]["kind"] == "crash"
    assert result.ok  # ranks 0, 2, 3 do not need rank 1 here (no collective after the crash)
    hang = _with(faults=[{"kind": "hang", "ranks": [0], "at_point": "store.offload.begin"}], steps=2,
                 comm={"watchdog": False})  # without the watchdog a hang is a deadlock with its waits-for cycle
    result, _, _ = run_scenario(parse_scenario(hang))
    assert not result.ok and result.exit_code == 3
    error = result.to_dict()["error"]
    assert error["kind"] == "deadlock" and error["absent"] == {"0": "rank 0 hung at point 'store.offload.begin' (injected fault)"}
    assert {r["status"] for r in result.to_dict()["ranks"][1:]} == {"blocked"}


def test_ranks_issuing_different_collectives_are_reported_as_a_mismatch(monkeypatch):
    import torch

    import sim.scenarios.runner as runner

    real_use = runner._use_group

    async def odd_rank_broadcasts(rt, world, name):
        if rt.rank == 1:  # rank 1 takes another path: a broadcast where its peers all-reduce
            await rt.broadcast(torch.ones(1), src=rt.group_spec(name).ranks[0], group=name)
            return
        await real_use(rt, world, name)

    monkeypatch.setattr(runner, "_use_group", odd_rank_broadcasts)
    result, _, _ = run_scenario(parse_scenario(_with(steps=1)))
    error = result.to_dict()["error"]
    assert not result.ok and error["kind"] == "collective_mismatch"
    assert "broadcast" in error["ops"]["1"]
    assert any("all_reduce" in op for rank, op in error["ops"].items() if rank != "1")


def test_an_inline_topology_graph_runs_like_its_preset():
    from sim.presets import load_preset_data

    inline = load_preset_data("h200-1x")
    inline["name"] = "my-box"
    raw = _with(world_size=1, topology=inline, steps=1)
    raw.pop("mesh")
    raw["workload"] = {"rollout_s": 0.5}
    result, _, _ = run_scenario(parse_scenario(raw))
    d = result.to_dict()
    assert result.ok and d["topology"]["name"] == "my-box" and d["ranks"][0]["bitwise_equal"]
    broken = copy.deepcopy(inline)
    broken["node"]["links"][0]["bandwidth"] = 55.2
    with pytest.raises(ScenarioError, match=r"^topology\.node\.links\[0\]\.bandwidth: bare number"):
        parse_scenario(dict(raw, topology=broken))
    with pytest.raises(ScenarioError, match=r"^world_size: 2 ranks do not fit topology 'my-box' with 1 GPUs"):
        parse_scenario(dict(raw, world_size=2))


@pytest.mark.parametrize("raw, message", [
    ({"world_size": "4"}, r"^world_size: expected an integer >= 1, got '4'$"),
    ({"world_size": 2, "steps": 0}, r"^steps: expected an integer >= 1, got 0$"),
    ({"world_size": 2, "model": {"preset": "dense-7b", "scale": 2}}, r"^model\.scale: expected a number between 0 and 1"),
    ({"world_size": 2, "faults": [{"kind": "crash", "nth": 0}]}, r"^faults\[0\]\.nth: expected an integer >= 1, got 0$"),
    ({"world_size": 2, "lifecycle": {"cooldown": 1}}, r"^lifecycle\.cooldown: unknown field \(expected one of"),
    ({"world_size": 2, "model": {"tensors": [{"shape": [2]}]}}, r"^model\.tensors\[0\]\.name: required$"),
])
def test_the_json_schema_is_what_checks_a_scenario_first(raw, message):
    """sim/schema/scenario.schema.json through jsonschema, in the project's phrasing (issue 11)."""
    from sim.presets.schemas import check

    with pytest.raises(ScenarioError, match=message):
        check(raw, "scenario", ScenarioError)
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(raw)


def test_the_shipped_schemas_are_valid_json_schemas():
    import jsonschema

    from sim.presets.schemas import SCHEMA_DIR

    files = sorted(SCHEMA_DIR.glob("*.schema.json"))
    assert files
    for path in files:
        schema = json.loads(path.read_text())
        jsonschema.validators.validator_for(schema).check_schema(schema)  # raises SchemaError naming the fault


def test_with_the_watchdog_on_by_default_a_hang_times_its_peers_out_instead_of_deadlocking():
    hang = _with(faults=[{"kind": "hang", "ranks": [0], "at_point": "store.offload.begin"}], steps=2)
    result, _, _ = run_scenario(parse_scenario(hang))
    d = result.to_dict()
    assert d["error"] is None, "no deadlock: the peers' collectives time out after the group's timeout (600 s)"
    ranks = d["ranks"]
    assert ranks[0]["status"] == "hung"
    assert all(r["status"] == "failed" and "timed out" in (r["error"] or "") for r in ranks[1:]), ranks[1:]
    assert result.ok, result.violations  # a failure the fault plan caused is an outcome, not a violation



def test_finished_ranks_in_different_lifecycle_states_are_a_violated_invariant():
    from sim.scenarios.result import RankOutcome, judge
    from sim.scenarios.runner import build_world

    scn = parse_scenario(_with(steps=1))
    world, plan = build_world(scn, scn.topo)
    world.run(lambda rt: rt.sleep(1.0))
    same = [RankOutcome(rank=r, finished=True, state="ACTIVE") for r in range(scn.world_size)]
    assert judge(scn, scn.topo, world, plan, same, None, 0.0).ok
    split = [RankOutcome(rank=r, finished=True, state="ACTIVE" if r else "FAILED") for r in range(scn.world_size)]
    result = judge(scn, scn.topo, world, plan, split, None, 0.0)
    assert not result.ok and result.violations == [
        "finished ranks ended in different lifecycle states: ['ACTIVE', 'FAILED']"]
