"""A DeviceMesh on groups the runtime made (refimpl.torch_runtime.mesh_groups), on 2 and 4 Gloo ranks.

FSDP2 trains a small model over the mesh while every mesh group is destroyed and rebuilt between steps; a second
model on a mesh of its own, never rebuilt, trains beside it. Checked: the two train to the same bits; while the
groups are down torch holds no process group of the mesh; after each rebuild the mesh, every FSDP2 state and (on
the 2-D mesh) a third model sharded over the sub-mesh ``mesh["shard"]`` resolve to the rebuilt groups
(``problems()`` is empty and the names changed) and train on; the world group carries no collective; and with the
hook removed a rebuild leaves the mesh naming a destroyed group, which ``problems()`` reports and a gather refuses
(the check can fail). Wrong shapes are refused."""
import pytest

from tests._dist import run_distributed

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _model(mesh):
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _train(rank, m, opt, step):
    import torch

    x = torch.linspace(-1, 1, 16).view(2, 8) * (rank + 1 + step)
    loss = m(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _bits(m):
    import torch

    return [p.full_tensor().contiguous().view(torch.int32).tolist() for p in m.parameters()]


def _mesh_run(rank, world_size, shape):
    import torch.distributed as dist

    from refimpl.runtime import GroupError
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.torch_runtime.mesh_groups import build_mesh_groups

    rt = TorchRuntime("cpu")
    dims = ("replicate", "shard")[-len(shape):]
    refused = []
    for bad_shape, bad_dims in (((world_size + 1,), ("shard",)), ((world_size,), ("a", "b"))):
        try:
            build_mesh_groups(rt, bad_shape, bad_dims, prefix="bad")
        except ValueError as e:
            refused.append(str(e))
    moved = build_mesh_groups(rt, shape, dims, prefix="moved")
    still = build_mesh_groups(rt, shape, dims, prefix="still")
    m1, o1 = _model(moved.mesh)
    m2, o2 = _model(still.mesh)
    moved.follow(m1)
    sub = None
    if len(shape) == 2:  # FSDP over a sub-mesh sliced before any destroy, and the same over the mesh never rebuilt
        sub, o3 = _model(moved.mesh["shard"])
        twin, o4 = _model(still.mesh["shard"])
        moved.follow(sub)
    out = {"names": moved.names, "mine": moved.mine, "refused": refused, "losses": [], "same_bits": [],
           "down": [], "problems": [], "renamed": [], "held": []}
    for step in range(3):
        out["losses"].append((_train(rank, m1, o1, step), _train(rank, m2, o2, step)))
        out["same_bits"].append(_bits(m1) == _bits(m2))
        if sub is not None:
            _train(rank, sub, o3, step), _train(rank, twin, o4, step)
            out["held"].append(_bits(sub) == _bits(twin))
        before = list(moved.mesh._dim_group_names)
        for name in moved.names:
            rt.run(rt.destroy_group(name))
        out["down"].append([g["name"] for g in rt.live_process_groups() if g["name"].startswith("moved.")])
        for name in moved.names:
            rt.run(rt.recreate_group(name))
        out["problems"].append(moved.problems(m1) + (moved.problems(sub) if sub is not None else []))
        now = list(moved.mesh._dim_group_names)
        out["renamed"].append(all(a != b for a, b in zip(before, now)) and
                              now == [str(moved.group_of(d).group_name) for d in dims])
    out["world_collectives"] = dist.group.WORLD._get_sequence_number_for_group()
    moved.close()  # no longer followed: a rebuild leaves the mesh's names naming destroyed groups
    for name in moved.names:
        rt.run(rt.destroy_group(name))
    for name in moved.names:
        rt.run(rt.recreate_group(name))
    out["stale"] = moved.problems(m1)
    try:
        _bits(m1)
        out["stale_gather"] = "gathered"
    except (RuntimeError, ValueError, GroupError) as e:
        out["stale_gather"] = type(e).__name__
    return out


@pytest.mark.parametrize("world_size, shape", [(2, (2,)), (4, (2, 2))], ids=["fsdp-2-ranks", "hsdp-4-ranks"])
def test_mesh_on_runtime_groups_follows_every_rebuild(world_size, shape):
    outs = run_distributed(_mesh_run, world_size, args=(shape,), timeout=240)
    for rank, out in enumerate(outs):
        assert len(out["refused"]) == 2 and "needs" in out["refused"][0] and "one name per" in out["refused"][1]
        assert out["same_bits"] == [True] * 3  # rebuilt every step, trained to the same bits
        assert all(a == b for a, b in out["losses"])
        assert out["down"] == [[]] * 3  # torch held no group of the mesh while it was down
        assert out["problems"] == [[]] * 3 and out["renamed"] == [True] * 3
        assert out["world_collectives"] == 0
        assert out["stale"] and out["stale_gather"] != "gathered"
        if len(shape) == 2:
            assert out["held"] == [True] * 3
            assert out["names"] == ("moved.replicate0", "moved.replicate1", "moved.shard0", "moved.shard1")
            assert out["mine"] == {"replicate": f"moved.replicate{rank % 2}", "shard": f"moved.shard{rank // 2}"}
        else:
            assert out["names"] == ("moved.shard",)
