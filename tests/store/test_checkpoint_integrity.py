"""Checkpoints that verify: a flipped bit or a truncated file fails the load, names the tensor and the file,
and leaves the target model as it was; torch's ``CheckpointException`` (a ``BaseException``) comes out as
the project's ``CheckpointError``. One process for the single-rank cases, two Gloo processes for a bad
file on one rank.
"""
import glob
import os

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from refimpl.store import CheckpointFailedError, CheckpointIntegrityError, OffloadStore, StoreError
from refimpl.torch_runtime import TorchRuntime, dcp
from tests._dist import run_distributed


def _net(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _snapshot(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def _diff(a, b):
    return sorted(k for k in a if not torch.equal(a[k], b[k]))


def _saved(root):
    """An offloaded ``local`` store of a small net saved to ``root``; returns the net's values."""
    net = _net()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(net, name="model")
    ref = _snapshot(net)
    store.offload()
    dcp.save(store, root)
    store.reload()
    return ref


def _item(root, fqn):
    """``(data file, offset, length)`` of the saved item ``fqn``, from the checkpoint's own metadata."""
    meta = FileSystemReader(root).read_metadata()
    info = next(v for k, v in meta.storage_data.items() if k.fqn == fqn)
    return os.path.join(root, info.relative_path), info.offset, info.length


def _flip_bit(path, at):
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def test_a_flipped_bit_fails_the_load_naming_tensor_and_file(tmp_path):
    root = str(tmp_path / "ckpt")
    _saved(root)
    path, offset, length = _item(root, "model.2.weight")
    _flip_bit(path, offset + length // 2)  # inside the tensor's bytes, where torch.load does not notice
    target = _net(seed=1)
    before = _snapshot(target)
    with pytest.raises(CheckpointIntegrityError, match=r"model\.2\.weight in .*__0_0\.distcp: CRC-32") as err:
        dcp.load_into({"model": target.state_dict()}, root)
    assert err.value.tensor == "model.2.weight" and err.value.file == path
    assert _diff(before, _snapshot(target)) == [], "a failed load wrote into the target"


@pytest.mark.parametrize("verify", [True, False])
def test_a_truncated_checkpoint_leaves_the_target_as_it_was(tmp_path, verify):
    root = str(tmp_path / "ckpt")
    ref = _saved(root)
    path, offset, length = _item(root, "model.2.bias")
    last = max(_item(root, k)[1] for k in ("model.0.weight", "model.0.bias", "model.2.weight", "model.2.bias"))
    assert offset == last, "the cut must hit the last item so the earlier ones load first"
    os.truncate(path, offset + length // 2)
    target = _net(seed=1)
    before = _snapshot(target)
    assert _diff(before, ref), "the target must differ from the checkpoint, or 'unchanged' proves nothing"
    expected = CheckpointIntegrityError if verify else CheckpointFailedError
    try:
        dcp.load_into({"model": target.state_dict()}, root, verify=verify)
    except Exception as e:  # noqa: BLE001 - what a user's handler catches; torch's BaseException would pass
        assert isinstance(e, expected) and isinstance(e, StoreError), repr(e)
        if verify:
            assert "truncated" in str(e) and e.tensor == "model.2.bias" and e.file == path
        else:
            assert e.__cause__ is not None and type(e.__cause__).__name__ == "CheckpointException"
    else:
        pytest.fail("a truncated checkpoint loaded")
    assert _diff(before, _snapshot(target)) == [], "a failed load left the target half-written"


def test_a_checkpoint_without_checksums_is_refused_unless_verify_is_off(tmp_path):
    import torch.distributed.checkpoint as tdcp

    root = str(tmp_path / "plain")
    net = _net()
    tdcp.save({"model": net.state_dict()}, checkpoint_id=root)  # torch's own save: no side files
    target = _net(seed=1)
    with pytest.raises(CheckpointIntegrityError, match="no readable checksums.*verify=False"):
        dcp.load_into({"model": target.state_dict()}, root)
    dcp.load_into({"model": target.state_dict()}, root, verify=False)
    assert _diff(_snapshot(net), _snapshot(target)) == []


class _FullDiskWriter(FileSystemWriter):
    """A writer whose write fails, as a full disk would."""

    def write_data(self, plan, planner):
        raise OSError(28, "No space left on device")


def test_a_failed_async_save_is_the_projects_error_and_the_next_offload_goes_on(tmp_path):
    net = _net()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(net, name="model")
    ref = _snapshot(net)
    store.offload()
    res = dcp.async_save(store, storage_writer=_FullDiskWriter(str(tmp_path / "full")))
    with pytest.raises(CheckpointFailedError, match="No space left on device") as err:
        res.future.result(timeout=60)
    assert type(err.value.__cause__).__name__ == "CheckpointException"
    store.reload()
    store.offload()  # waits for the failed save's future: logs it, does not raise torch's BaseException
    store.reload()
    assert _diff(ref, _snapshot(net)) == []
    with pytest.raises(CheckpointFailedError, match="No space left on device"):
        dcp.save(store, storage_writer=_FullDiskWriter(str(tmp_path / "full2")))


def _two_rank_job(rank, world_size, root):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))

    def sharded(seed):
        net = _net(seed)
        fully_shard(net, mesh=mesh)
        return net

    def local(net):
        return {k: v._local_tensor.clone() for k, v in net.state_dict().items()}

    net = sharded(0)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(net, name="model")
    store.offload()
    dcp.save(store, root)
    store.reload()
    torch.distributed.barrier()
    if rank == 1:  # one bit of one rank's file
        path = sorted(glob.glob(os.path.join(root, "__1_*.distcp")))[0]
        offset, length = _first_item_in(root, path)
        _flip_bit(path, offset + length // 2)
    torch.distributed.barrier()
    target = sharded(1)
    before = local(target)
    try:
        dcp.load_into({"model": target.state_dict()}, root)
        outcome = "loaded"
    except CheckpointIntegrityError as e:
        outcome = (type(e).__name__, e.tensor, os.path.basename(e.file or ""))
    return outcome, _diff(before, local(target))


def _first_item_in(root, path):
    """``(offset, length)`` of the first item stored in the data file ``path``."""
    meta = FileSystemReader(root).read_metadata()
    info = min((v for v in meta.storage_data.values() if os.path.join(root, v.relative_path) == path),
               key=lambda v: v.offset)
    return info.offset, info.length


@pytest.mark.slow
def test_a_bad_file_on_one_rank_fails_every_rank_and_no_target_changes(tmp_path):
    results = run_distributed(_two_rank_job, 2, args=(str(tmp_path / "ckpt"),), timeout=120)
    for rank, (outcome, changed) in enumerate(results):
        assert outcome != "loaded", f"rank {rank} loaded a checkpoint with a flipped bit"
        assert outcome[0] == "CheckpointIntegrityError" and outcome[2].startswith("__1_"), (rank, outcome)
        assert changed == [], f"rank {rank}: the failed load wrote {changed} into the target"
