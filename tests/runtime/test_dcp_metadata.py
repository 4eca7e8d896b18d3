"""A DCP checkpoint's ``.metadata`` is covered by a checksum, and a load that would read outside what was
saved fails on every rank with nothing written: two Gloo ranks, an FSDP2 net sharded over them.

The metadata says where every saved chunk sits in its tensor (offsets and sizes) and in its file (offset and
length). A flipped bit there used to load without error about one time in nine, the uncovered part of a
shard keeping whatever the load's staging buffer held. Here every bit of every integer field of the
metadata (all chunk offsets and sizes, tensor sizes, file offsets and lengths) and a seeded sample of its
other bits is flipped in turn, and each load must fail with ``CheckpointIntegrityError`` on both ranks and
leave both targets as they were. A metadata file whose checksum matches but whose chunks do not cover a
rank's shard (written that way, or loaded with ``verify=False``) fails on both ranks as well.
"""
import os
import pickle
import pickletools
import random

import pytest
import torch

from tests._dist import run_distributed

#: opcodes whose argument is an integer written in the pickle (the fields a flipped bit changes silently)
INT_OPCODES = ("BININT1", "BININT2", "BININT", "LONG1")
SAMPLE_OTHER_BITS = 96


def _net(seed):
    torch.manual_seed(seed)
    # 5 output rows: FSDP2 shards them 3 + 2 over two ranks, so the chunks differ in size
    return torch.nn.Sequential(torch.nn.Linear(8, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _sharded(seed, mesh):
    from torch.distributed.fsdp import fully_shard

    net = _net(seed)
    fully_shard(net, mesh=mesh)
    return net


def _locals(net):
    return {k: v._local_tensor.detach().clone() for k, v in net.state_dict().items()}


def _changed(before, net):
    now = _locals(net)
    return sorted(k for k in before if not torch.equal(before[k], now[k]))


def _save(rank, world_size, root):
    """An offloaded store of the sharded net saved to ``root``; returns the mesh and this rank's saved values."""
    from torch.distributed.device_mesh import init_device_mesh

    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime, dcp

    mesh = init_device_mesh("cpu", (world_size,))
    net = _sharded(0, mesh)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(net, name="model")
    saved = _locals(net)
    store.offload()
    dcp.save(store, root)
    store.reload()
    torch.distributed.barrier()
    return mesh, saved


def _load(mesh, root, verify=True, target=None):
    """``(outcome, tensors the load changed)`` of one load into ``target`` (default: a fresh net, seed 1), which
    is put back as it was afterwards."""
    from refimpl.store import CheckpointError
    from refimpl.torch_runtime import dcp

    target = _sharded(1, mesh) if target is None else target
    before = _locals(target)
    try:
        dcp.load_into({"model": target.state_dict()}, root, verify=verify)
        outcome = "loaded"
    except CheckpointError as e:
        outcome = (type(e).__name__, str(e))
    except BaseException as e:  # noqa: BLE001 - any other outcome is reported, not raised, so every rank reports
        outcome = ("other", f"{type(e).__name__}: {e}")
    changed = _changed(before, target)
    with torch.no_grad():
        for k, v in target.state_dict().items():
            v._local_tensor.copy_(before[k])
    return outcome, changed


def integer_field_bits(data: bytes) -> list[int]:
    """Every bit of every integer argument in the pickle ``data`` (bit ``8 * byte + k``)."""
    ops = list(pickletools.genops(data))
    bits = []
    for (op, _, pos), (_, _, end) in zip(ops, ops[1:] + [(None, None, len(data))]):
        if op.name in INT_OPCODES:
            bits += range(8 * (pos + 1), 8 * end)  # the argument's bytes, after the opcode
    return bits


def _parses(data: bytes) -> bool:
    """True if every length the pickle's opcodes name is there: unpickling it allocates nothing beyond the file."""
    try:
        for _ in pickletools.genops(data):
            pass
    except Exception:  # noqa: BLE001 - any malformed opcode
        return False
    return True


def _flip(path, bit):
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        byte = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([byte ^ (1 << (bit % 8))]))


def bits_to_flip(data: bytes, seed: int = 41) -> list[int]:
    """The integer fields' bits and a seeded sample of the other bits (among flips that leave a pickle whose
    lengths are all there, so that the old unverified load cannot be made to allocate gigabytes)."""
    fields = integer_field_bits(data)
    taken = set(fields)
    others = []
    for b in range(8 * len(data)):
        if b in taken:
            continue
        flipped = bytearray(data)
        flipped[b // 8] ^= 1 << (b % 8)
        if _parses(bytes(flipped)):
            others.append(b)
    return fields + random.Random(seed).sample(others, min(SAMPLE_OTHER_BITS, len(others)))


def _flipped_metadata_job(rank, world_size, root):
    mesh, saved = _save(rank, world_size, root)
    path = os.path.join(root, ".metadata")
    data = open(path, "rb").read()
    meta = pickle.loads(data)
    chunk_ints = sum(2 * len(c.offsets) for md in meta.state_dict_metadata.values() for c in md.chunks)
    bits = bits_to_flip(data)
    target = _sharded(1, mesh)
    clean = _load(mesh, root, target=target)
    results = []
    for bit in bits:
        if rank == 0:
            _flip(path, bit)
        torch.distributed.barrier()
        results.append((bit, *_load(mesh, root, target=target)))
        torch.distributed.barrier()
        if rank == 0:
            _flip(path, bit)  # back
        torch.distributed.barrier()
    return {"clean": clean, "results": results, "field_bits": len(integer_field_bits(data)),
            "chunk_ints": chunk_ints, "bits": len(bits)}


@pytest.mark.slow
def test_every_flipped_bit_of_the_metadata_fails_the_load_on_every_rank_and_changes_nothing(tmp_path):
    reports = run_distributed(_flipped_metadata_job, 2, args=(str(tmp_path / "ckpt"),), timeout=600)
    for rank, rep in enumerate(reports):
        assert rep["clean"] == ("loaded", sorted(rep["clean"][1])) and rep["clean"][1], \
            f"rank {rank}: the unflipped checkpoint must load and change the fresh net: {rep['clean']}"
        assert rep["field_bits"] >= 8 * rep["chunk_ints"], "every chunk offset and size is among the flipped bits"
        assert rep["bits"] >= rep["field_bits"] + 32
        wrong = [(bit, outcome, changed) for bit, outcome, changed in rep["results"]
                 if outcome == "loaded" or outcome[0] != "CheckpointIntegrityError" or changed]
        assert not wrong, (f"rank {rank}: {len(wrong)} of {len(rep['results'])} flipped bits of .metadata did not "
                           f"fail with CheckpointIntegrityError leaving the target unchanged, e.g. {wrong[:5]}")
        assert all(".metadata" in outcome[1] for _, outcome, _ in rep["results"]), "the error names the file"


def _uncovered_shard_job(rank, world_size, root):
    """Rank 1's chunk of ``model.0.weight`` one row short in the metadata: loaded unverified, then verified with
    the metadata's checksum written to match (only the coverage check is left to fail it)."""
    from torch.distributed.checkpoint import FileSystemWriter

    from refimpl.torch_runtime import dcp_checksums

    mesh, saved = _save(rank, world_size, root)
    if rank == 0:
        path = os.path.join(root, ".metadata")
        with open(path, "rb") as f:
            meta = pickle.load(f)
        chunks = meta.state_dict_metadata["model.0.weight"].chunks
        last = max(chunks, key=lambda c: c.offsets[0])
        assert last.offsets[0] > 0, "rank 1's chunk"
        last.sizes = torch.Size([last.sizes[0] - 1, *last.sizes[1:]])
        with open(path, "wb") as f:
            pickle.dump(meta, f)
    torch.distributed.barrier()
    unverified = _load(mesh, root, verify=False)
    if rank == 0:
        dcp_checksums.write_metadata_checksum(FileSystemWriter(root))
    torch.distributed.barrier()
    return {"verify=False": unverified, "verify=True": _load(mesh, root, verify=True)}


@pytest.mark.slow
def test_metadata_that_leaves_part_of_a_shard_unread_fails_the_load_on_every_rank(tmp_path):
    results = run_distributed(_uncovered_shard_job, 2, args=(str(tmp_path / "ckpt"),), timeout=180)
    for rank, loads in enumerate(results):
        for how, (outcome, changed) in loads.items():
            assert outcome != "loaded", f"rank {rank}, {how}: loaded metadata whose chunks leave part of a shard unread"
            name, message = outcome
            assert name == "CheckpointIntegrityError", (rank, how, outcome)
            assert "model.0.weight" in message and "rank 1" in message, (rank, how, message)
            assert changed == [], f"rank {rank}, {how}: the failed load wrote {changed} into the target"
