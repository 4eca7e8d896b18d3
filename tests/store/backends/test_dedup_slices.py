"""Slice arithmetic, content hashes and configuration of ``local_dedup`` (no processes needed)."""
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.store.backends.dedup_config import DedupConfig, MemberSlice
from refimpl.store.backends.replica import ReplicaGroup
from refimpl.store.backends.replica_sync import _DIGEST_COLS, content_digest, shape_fingerprint
from refimpl.store.debug import DEBUG_ENV
from tests._hypothesis import BUDGET


@BUDGET.settings(200)
@given(numel=st.integers(0, 10_000), n=st.integers(1, 16), itemsize=st.sampled_from([1, 2, 4, 8]),
       align=st.sampled_from([1, 16, 64, 256]))
def test_slices_partition_the_layout_and_are_balanced(numel, n, itemsize, align):
    plans = [MemberSlice.balanced(numel, n, i, itemsize=itemsize, align_bytes=align) for i in range(n)]
    covered = []
    for p in plans:
        covered.extend(range(p.start, p.stop))
        # each rank keeps at most ceil(bytes/N) plus one alignment unit
        assert p.valid * itemsize <= math.ceil(numel * itemsize / n) + math.lcm(align, itemsize)
        assert (p.chunk * itemsize) % math.lcm(align, itemsize) == 0
        assert p.padded_numel == n * p.chunk >= numel
    assert covered == list(range(numel))  # disjoint, in order, complete


def test_slice_overlap_maps_tensor_ranges_into_the_slice():
    p = MemberSlice.balanced(100, 4, 1, itemsize=4, align_bytes=4)  # chunk 25: slice [25, 50)
    assert (p.start, p.stop, p.valid) == (25, 50, 25)
    assert p.overlap(0, 10) is None
    assert p.overlap(20, 10) == (5, 0, 5)     # tensor elements 5..9 -> slice 0..4
    assert p.overlap(30, 5) == (0, 5, 5)
    assert p.overlap(45, 20) == (0, 20, 5)
    tail = MemberSlice.balanced(10, 4, 3, itemsize=4, align_bytes=64)  # chunk 16: rank 3 holds only padding
    assert tail.valid == 0 and tail.start == 10


def test_slice_plan_rejects_bad_requests():
    with pytest.raises(ValueError, match="bad slice request"):
        MemberSlice.balanced(10, 2, 2, itemsize=4)
    with pytest.raises(ValueError, match="bad slice request"):
        MemberSlice.balanced(10, 0, 0, itemsize=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.float16])
def test_digest_equal_bytes_equal_hash_and_any_change_shows(dtype):
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 2, (257,), generator=g).to(dtype) if dtype == torch.bool else \
        (torch.randn(257, generator=g) * 50).to(dtype)
    same = base.clone()
    assert torch.equal(content_digest([base]), content_digest([same]))
    flipped = base.clone().view(torch.uint8)
    flipped[100] ^= 1  # one bit
    assert not torch.equal(content_digest([base]), content_digest([flipped.view(dtype)]))
    if dtype != torch.bool:
        swapped = torch.cat([base[128:], base[:128]])  # same multiset of words, other order
        d0, d1 = content_digest([base]), content_digest([swapped])
        assert d0[1] != d1[1]


def test_digest_is_per_tensor_and_zero_for_empty_and_meta():
    a, b = torch.arange(8.0), torch.arange(8.0) + 1
    d = content_digest([a, torch.empty(0), b, torch.empty(4, device="meta")])
    assert d.shape == (8,) and d[2:4].tolist() == [0, 0] and d[6:8].tolist() == [0, 0]
    assert torch.equal(d[:2], content_digest([a])) and torch.equal(d[4:6], content_digest([b]))


def test_shape_fingerprint_is_order_sensitive_and_fits_62_bits():
    f = shape_fingerprint([(3, 4), (5,)])
    assert f == shape_fingerprint([(3, 4), (5,)])
    assert f != shape_fingerprint([(5,), (3, 4)]) and f != shape_fingerprint([(4, 3), (5,)])
    assert 0 <= f < 2**62


def test_config_validation_and_debug_mode(monkeypatch):
    with pytest.raises(ValueError, match="align_bytes"):
        DedupConfig(align_bytes=0)
    with pytest.raises(ValueError, match="local_world_size"):
        DedupConfig(local_world_size=0)
    with pytest.raises(ValueError, match="ReplicaGroup"):
        DedupConfig(groups=((0, 1),))
    cfg = DedupConfig(groups=(ReplicaGroup((2, 3)), ReplicaGroup((0, 1)), ReplicaGroup((5,))))
    assert [g.ranks for g in cfg.groups] == [(0, 1), (2, 3)]  # sorted, trivial groups dropped
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert DedupConfig().verify is False and DedupConfig(verify_replicas=True).verify is True
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert DedupConfig().verify is True and DedupConfig(verify_replicas=False).verify is False
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert DedupConfig().ranks_per_host() == 4 and DedupConfig(local_world_size=8).ranks_per_host() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        DedupConfig().ranks_per_host()


@pytest.mark.parametrize("numel", [_DIGEST_COLS * 3, _DIGEST_COLS * 4 + 17, 1 << 20])
def test_digest_of_tensors_longer_than_a_row_sees_moved_and_changed_words(numel):
    """Past one row of the digest's view the sums run per column in one pass: halves swapped (a power-of-two
    shift included), one word changed in any row, and rows swapped all show."""
    g = torch.Generator().manual_seed(1)
    base = torch.randint(-2**31, 2**31 - 1, (numel,), dtype=torch.int32, generator=g).view(torch.float32)
    d0 = content_digest([base])
    assert torch.equal(d0, content_digest([base.clone()]))
    half = numel // 2
    assert not torch.equal(d0, content_digest([torch.cat([base[half:], base[:half]])]))
    for pos in (0, _DIGEST_COLS, numel - 1):  # first, second row, the tail
        changed = base.clone().view(torch.int32)
        changed[pos] += 1
        assert not torch.equal(d0, content_digest([changed.view(torch.float32)]))
    c = _DIGEST_COLS
    rows = base.clone()
    rows[:c], rows[c:2 * c] = base[c:2 * c], base[:c]  # whole rows swapped: same columns
    assert torch.equal(content_digest([rows]), d0)  # the digest is blind to that by design ...
    wrapped = torch.full((c * 8,), 1 << 30, dtype=torch.int32)  # ... and column sums wrap instead of overflowing
    assert content_digest([wrapped]).tolist() == [0, 0]


def test_digest_of_many_tensors_equals_each_alone():
    """Tensors are hashed in batches; each one's hashes are the same as when it is hashed alone."""
    g = torch.Generator().manual_seed(2)
    ts = [torch.randn(n, generator=g) for n in (1, 5, 1021, 1022, 5000)] + [torch.ones(7, dtype=torch.uint8)]
    d = content_digest(ts)
    for i, t in enumerate(ts):
        assert torch.equal(d[2 * i:2 * i + 2], content_digest([t]))
