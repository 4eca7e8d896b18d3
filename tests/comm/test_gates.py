"""Static eligibility gates: failing ones are reported by name; a raising gate fails, never breaks."""
from __future__ import annotations

import pytest

from refimpl.comm.gates import RELAX_GATES, Gate, GateContext, fact_gate, failing_gates, unique_names
from refimpl.comm.states import PGPolicy

RELAX_OK = {
    "role": "actor", "colocate": True, "offload_train": True, "per_step_rollout": True, "uses_tms": True,
    "use_critic": False, "fully_async": False, "enable_weights_backuper": True,
    "weight_updater": "UpdateWeightFromTensor", "pipeline_parallel_size": 1, "context_parallel_size": 1,
    "expert_parallel_size": 1, "is_klx": False,
}


def ctx(facts):
    return GateContext(PGPolicy.PAUSED_LIVE, ("tp", "dp"), facts, rank=3)


def test_relax_gates_pass_on_the_relax_configuration_and_name_each_failure():
    assert failing_gates(RELAX_GATES, ctx(RELAX_OK)) == []
    bad = dict(RELAX_OK, pipeline_parallel_size=2, use_critic=True)
    assert failing_gates(RELAX_GATES, ctx(bad)) == ["no_critic", "pp_1"]
    missing = {k: v for k, v in RELAX_OK.items() if k != "colocate"}
    assert failing_gates(RELAX_GATES, ctx(missing)) == ["colocate"], "a missing fact fails its gate"


def test_a_raising_gate_counts_as_failed(caplog):
    gates = [Gate("boom", lambda c: 1 / 0), fact_gate("ok", "x", 1)]
    assert failing_gates(gates, ctx({"x": 1})) == ["boom"]
    assert "gate 'boom' raised" in caplog.text


def test_gate_names_are_required_and_unique():
    with pytest.raises(ValueError, match="needs a name"):
        Gate("", lambda c: True)
    with pytest.raises(ValueError, match="duplicate gate name 'a'"):
        unique_names([Gate("a", lambda c: True), Gate("a", lambda c: False)])
    unique_names(RELAX_GATES)
