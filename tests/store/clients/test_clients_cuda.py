"""The client tests on a real GPU with NCCL (one rank: the world one GPU allows), no device shim:
torch DDP in both ``gradient_as_bucket_view`` modes and Megatron-core (distributed optimizer and not,
dense and MoE with its all-to-all dispatcher on EP=1), bitwise equal to training without offload, and
Megatron's process groups through the lifecycle (destroyed and rebuilt on NCCL)."""
import pytest
import torch

from tests._dist import run_distributed
from tests._megatron import needs_megatron

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def _ddp(rank, world_size):
    from tests.store.clients.test_clients_ddp import _ddp_rank

    return _ddp_rank(rank, world_size, device="cuda")


def test_ddp_on_cuda_nccl_bitwise_both_bucket_modes():
    from tests.store.clients.test_clients_ddp import check_ddp

    check_ddp(run_distributed(_ddp, 1, backend="nccl", timeout=300))


def _megatron(rank, world_size):
    from tests._megatron import init_parallel
    from tests.store.clients.test_clients_megatron import _train

    ps = init_parallel(ep=1)
    out = {}
    for experts in (0, 4):
        for dist_opt in (True, False):
            ref = _train(rank, dist_opt, experts, None, device="cuda")
            for backend in ("local", "local_dedup"):
                got = _train(rank, dist_opt, experts, backend, device="cuda")
                out[(experts, dist_opt, backend)] = {
                    "losses": ref["losses"] == got["losses"], "parked": got["parked"], "n": len(ref["state"]),
                    "diffs": [k for k in ref["state"] if ref["state"][k] != got["state"].get(k)][:5]}
    ps.destroy_model_parallel()
    return out


@needs_megatron
def test_megatron_on_cuda_nccl_bitwise():
    (out,) = run_distributed(_megatron, 1, backend="nccl", timeout=500)
    for case, r in out.items():
        assert r["n"] > 20 and r["parked"], case
        assert r["losses"] and r["diffs"] == [], f"{case}: {r['diffs']} differ from the run without offload"


def _megatron_groups(rank, world_size):
    from tests.store.clients.test_clients_megatron_groups import lifecycle_rank

    return lifecycle_rank(rank, world_size, 1, "cuda")


@needs_megatron
def test_megatron_groups_through_the_lifecycle_on_cuda_nccl():
    """Megatron's groups destroyed and rebuilt by the lifecycle on NCCL, where a destroyed communicator
    no longer works: training after each wake is bitwise the run without the lifecycle."""
    from tests.store.clients.test_clients_megatron_groups import check_lifecycle

    check_lifecycle(run_distributed(_megatron_groups, 1, backend="nccl", timeout=500))
