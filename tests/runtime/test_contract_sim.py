"""The runtime contract on the simulator's SimRuntime, for 2, 3, 8 and 64 simulated ranks.

The same checks as ``test_contract_torch.py`` run here unchanged: the protocol
code and the contract are one, only the runtime differs.
"""
import pytest

import sim
from tests.runtime import contract


@pytest.mark.parametrize("world_size", [2, 3, 8, 64])
@pytest.mark.parametrize("name", list(contract.CHECKS))
def test_contract_in_simulator(name, world_size):
    check = contract.CHECKS[name]
    world = sim.SimWorld(world_size, payload="real", seed=0)
    per_rank = world.run(lambda rt: check(rt))
    contract.verify_agreement(name, list(per_rank), world_size)
