"""The pipelined ``local_dedup`` reload: a chunk larger than one piece is all-gathered piece by piece.

Gloo processes with a tiny ``segment_bytes`` so every layout spans many pieces (the last one short, the
last rank's slice ending in padding): the reload must be bitwise, issue one all-gather per piece on
every rank, and hold no staging buffer afterwards.
"""
import torch

from tests._dist import run_distributed


def _job(rank, world_size, numels):
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.store.backends.dedup_config import DedupConfig
    from refimpl.store.backends.replica import MeshReplica, MeshTopology, ReplicaPolicy

    rt = TorchRuntime()
    g = torch.Generator().manual_seed(5)  # same bytes on every rank: replicated
    tensors = {f"w{i}": torch.randn(n, generator=g) for i, n in enumerate(numels)}
    tensors["h"] = torch.randint(-1000, 1000, (3001,), generator=g, dtype=torch.int32).to(torch.bfloat16)
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(rt, backend="local_dedup", config=StoreConfig(alignment_bytes=16, segment_bytes=4096),
                         dedup=DedupConfig(policy=ReplicaPolicy(overrides={
                             "*": MeshReplica(MeshTopology((world_size,), ("ddp",)), ("ddp",))})))
    store.attach_tensors("params", tensors, name="p")
    out = []
    for _ in range(2):
        store.offload()
        rt.spans.clear()
        store.reload()
        out.append(dict(gathers=sum(1 for s in rt.spans if s[0] == "dedup.all_gather"),
                        h2d=sum(1 for s in rt.spans if s[0] == "dedup.h2d"),
                        equal=all(torch.equal(tensors[k], want[k]) for k in want)))
    host = store.backend.host_bytes()
    store.close()
    return {"cycles": out, "host": host, "bytes": sum(v.numel() * v.element_size() for v in want.values())}


def test_pipelined_reload_is_bitwise_with_one_gather_per_piece():
    results = run_distributed(_job, 3, args=([5000, 2311],), timeout=120)
    gathers = {c["gathers"] for r in results for c in r["cycles"]}
    assert len(gathers) == 1, f"ranks issued different numbers of all-gathers: {gathers}"
    # fp32: 7311 elements over 3 ranks, chunks of 2448 (9792 B) in pieces of 4096 // 4 // 3 = 336 -> 8 pieces;
    # bf16: 3001 elements, chunks of 1008 in pieces of 672 -> 2 pieces
    assert gathers == {8 + 2}, gathers
    for rank, r in enumerate(results):
        assert all(c["equal"] for c in r["cycles"]), f"rank {rank}: reload not bitwise"
        assert r["host"] <= r["bytes"] / 3 + 2 * 64, f"rank {rank}: keeps {r['host']} of {r['bytes']} B"
