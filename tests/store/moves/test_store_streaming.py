"""The first offload is streamed: copies start while collection goes on, the layouts equal the batch
plan's, and an error midway leaves the state on the device with no host memory held."""
from collections.abc import Mapping

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.runtime import CopyKind
from refimpl.torch_runtime import TorchRuntime
from refimpl.store import Category, FlatLayout, MixedDtypeError, OffloadStore, StoreConfig
from refimpl.store.state.parking import is_parked
from tests._hypothesis import BUDGET

SMALL = StoreConfig(segment_bytes=4096, pack_below_bytes=512, staging_bytes=2048, alignment_bytes=64)


class WatchedTensors(Mapping):
    """A name->tensor mapping that notes how many D2H copies the runtime had issued at each item read."""

    def __init__(self, rt, tensors):
        self.rt, self.tensors, self.seen = rt, tensors, []

    def __getitem__(self, key):
        return self.tensors[key]

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def items(self):
        for k, v in self.tensors.items():
            self.seen.append(self.rt.copy_stats.count[CopyKind.D2H])
            yield k, v


def test_copies_start_before_collection_ends():
    rt = TorchRuntime("cpu")
    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(200, generator=g) for i in range(100)}  # 800 B each, 5 per segment
    want = {k: v.clone() for k, v in tensors.items()}
    watched = WatchedTensors(rt, tensors)
    store = OffloadStore(rt, config=SMALL)
    store.attach_tensors(Category.PARAMS, watched)
    store.offload()
    assert watched.seen[0] == 0 and watched.seen[-1] > 10, "segments left while later tensors were collected"
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)


@BUDGET.settings(25)
@given(sizes=st.lists(st.tuples(st.integers(1, 3000), st.sampled_from(["f32", "bf16", "i64"])), min_size=1, max_size=30),
       seg=st.sampled_from([256, 4096, 1 << 20]))
def test_streamed_layouts_equal_the_batch_plan(sizes, seg):
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "i64": torch.int64}
    tensors = {f"t{i}": torch.full((n,), i, dtype=dtypes[d]) for i, (n, d) in enumerate(sizes)}
    cfg = StoreConfig(segment_bytes=seg, pack_below_bytes=256, staging_bytes=1024, alignment_bytes=64)
    store = OffloadStore(TorchRuntime("cpu"), config=cfg)
    store.attach_tensors(Category.OPTIMIZER, tensors)
    store.offload()
    for key, layout in store.layouts.items():
        batch = FlatLayout.build(key, [type(e)(e.category, e.kind, e.dtype, e.numel, [], None) for e in layout.entries],
                                 alignment_bytes=cfg.alignment_bytes, segment_bytes=cfg.segment_bytes)
        assert [e.offset for e in layout.entries] == [e.offset for e in batch.entries]
        assert (layout.numel, layout.data_numel, layout.segments) == (batch.numel, batch.data_numel, batch.segments)
        assert store.pool.get(key).segment_numels == layout.segment_numels()
    store.reload()
    assert all(torch.equal(t, torch.full_like(t, i)) for i, t in enumerate(tensors.values()))


def test_error_midway_leaves_state_on_device_and_frees_partial_host_buffers():
    rt = TorchRuntime("cpu")
    tensors = {f"t{i}": torch.full((300,), float(i)) for i in range(60)}
    base = tensors["t0"]
    tensors["bad"] = base.view(torch.int32)  # found last: a second dtype on t0's storage
    store = OffloadStore(rt, config=SMALL)
    store.attach_tensors(Category.PARAMS, tensors)
    with pytest.raises(MixedDtypeError):
        store.offload()
    assert rt.copy_stats.count[CopyKind.D2H] > 0, "copies had been streamed before the error"
    assert all(not is_parked(t) for t in tensors.values())
    assert all(torch.equal(tensors[f"t{i}"], torch.full((300,), float(i))) for i in range(60))
    assert store.stats().host_pinned_bytes == 0 == rt.pinned_bytes, "partial host buffers were freed"
    del tensors["bad"]
    store.offload()
    store.reload()
    assert all(torch.equal(tensors[f"t{i}"], torch.full((300,), float(i))) for i in range(60))
