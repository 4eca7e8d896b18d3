"""The runtime contract on TorchRuntime over real Gloo processes (2 and 4 ranks)."""
import pytest

from tests._dist import run_distributed
from tests.runtime import contract


def _run_contract(rank, world_size):
    from refimpl.torch_runtime.runtime import TorchRuntime

    rt = TorchRuntime("cpu")  # Gloo on CPU tensors, also on a machine that has GPUs
    assert (rt.rank, rt.world_size) == (rank, world_size)
    return rt.run(contract.run_all(rt))


@pytest.mark.parametrize("world_size", [2, 4])
def test_contract_on_gloo(world_size):
    per_rank = run_distributed(_run_contract, world_size, timeout=180)
    for name in contract.CHECKS:
        contract.verify_agreement(name, [obs[name] for obs in per_rank], world_size)


def test_contract_single_rank_without_distributed():
    """Without torch.distributed the runtime is a one-rank world whose collectives are local."""
    from refimpl.torch_runtime.runtime import TorchRuntime

    rt = TorchRuntime("cpu")
    assert (rt.rank, rt.world_size) == (0, 1)
    out = rt.run(contract.run_all(rt))
    for name in contract.CHECKS:
        contract.verify_agreement(name, [out[name]], 1)
