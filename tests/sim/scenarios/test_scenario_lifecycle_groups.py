"""Which groups a scenario's lifecycle manages (``lifecycle.min_ranks``) and which groups its export uses
(``workload.export.also_uses``): the two facts of Relax's code the 8 x H20 case rests on (docs/calibration.md)."""
import copy

import pytest

from sim.machine.topology import Topology
from sim.scenarios.runner import run_scenario
from sim.scenarios.scenario import ScenarioError, parse_scenario

BASE = {
    "name": "groups",
    "topology": {"preset": "hgx-h200-8x", "calibrated": False},  # the datasheet constants COMM reads
    "world_size": 4,
    "mesh": {"dp": 2, "tp": 2},
    "groups": [{"name": "tp", "dims": ["tp"]}, {"name": "dp", "dims": ["dp"]}, {"name": "solo", "dims": []}],
    "model": {"tensors": [{"name": "w", "shape": [64, 8], "dtype": "bfloat16", "category": "params"}]},
    "offload": {"backend": "tms", "include": ["params"], "tms_pause_s": 0.1, "tms_resume_s": 0.1},
    "pg_policy": "destroy",
    "lifecycle": {"cooldown_s": 0.5},
    "workload": {"train_s": 0.1, "rollout_s": 1.0, "export": {"group": "tp", "bucket_bytes": 4096, "ipc_s": 0.01}},
    "steps": 2,
    "payload": "meta",
}
COMM = Topology.from_preset("hgx-h200-8x").comm


def _run(**changes):
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        section, field = key.split("__")
        raw[section][field] = value
    result, _, _ = run_scenario(parse_scenario(raw))
    assert result.ok, result.violations
    return result.to_dict()


def test_groups_below_min_ranks_keep_their_communicators_through_the_pause():
    """Relax's reloadable groups are its NCCL groups of two or more ranks: a one-rank group is never destroyed, so its
    communicator (initialised by the training step) still holds its memory in the rollout, and the walks skip it."""
    every = _run()
    multi = _run(lifecycle__min_ranks=2)
    solo_bytes = COMM.memory_bytes + COMM.persistent_bytes  # a one-rank communicator's
    for a, b in zip(every["ranks"], multi["ranks"]):
        assert b["phase_peak_device_bytes"]["rollout"] - a["phase_peak_device_bytes"]["rollout"] == solo_bytes
        # 4 tp/dp groups of 2 ranks and 4 one-rank groups in the world; 2 destroy walks per step (pause, weight sync)
        assert a["lifecycle_stats"]["destroys"] == 2 * 2 * 8
        assert b["lifecycle_stats"]["destroys"] == 2 * 2 * 4


def test_a_group_the_export_also_uses_pays_its_lazy_init_in_update_weights():
    """Relax's export broadcasts the expert weights over the expert-parallel group before its TP all-gather: after a
    rebuild that broadcast is the group's first collective, and its NCCL init lands in update_weights (and the
    walk after the sync then destroys an initialised communicator, not an unused one)."""
    plain = _run()
    also = _run(workload__export={**BASE["workload"]["export"], "also_uses": ["dp"]})
    extra = also["phases"]["update_weights"]["max"] - plain["phases"]["update_weights"]["max"]
    two = COMM.for_size(2)
    assert extra == pytest.approx(two.init_s + two.destroy_s - two.destroy_uninitialized_s, rel=0.01)


def test_also_uses_names_group_families():
    raw = copy.deepcopy(BASE)
    raw["workload"]["export"]["also_uses"] = ["ep"]
    with pytest.raises(ScenarioError, match=r"^workload\.export\.also_uses: 'ep' is not a group family"):
        parse_scenario(raw)
