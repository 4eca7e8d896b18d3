"""Flat layouts: aligned offsets, host segments cut at storage boundaries, and config validation."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refimpl.store import Category, FlatLayout, LayoutKey, StorageEntry, StoreConfig
from tests._hypothesis import BUDGET


def _entries(sizes, dtype=torch.float32):
    return [StorageEntry(Category.PARAMS, "param", dtype, n, [], None) for n in sizes]


@BUDGET.settings(60)
@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    align=st.sampled_from([16, 64, 512]),
    seg=st.sampled_from([512, 4096, 65536]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.uint8]),
)
def test_layout_is_aligned_disjoint_and_segments_cover_whole_storages(sizes, align, seg, dtype):
    entries = _entries(sizes, dtype)
    layout = FlatLayout.build(LayoutKey(Category.PARAMS, dtype), entries, alignment_bytes=align, segment_bytes=seg)
    item = dtype.itemsize
    prev_end = 0
    for e in entries:
        assert (e.offset * item) % align == 0, "every storage starts aligned"
        assert e.offset >= prev_end, "storages do not overlap and keep their order"
        prev_end = e.offset + e.numel
    assert layout.data_numel == prev_end <= layout.numel
    assert (layout.numel * item) % align == 0
    # segments partition [0, numel) and never cut through a storage
    assert layout.segments[0][0] == 0 and layout.segments[-1][1] == layout.numel
    assert all(a[1] == b[0] for a, b in zip(layout.segments, layout.segments[1:]))
    for e in entries:
        layout.segment_of(e.offset, e.offset + e.numel)  # raises if it spans two
    # padding stays below one alignment unit per storage
    assert layout.numel * item - sum(sizes) * item < len(sizes) * align + align
    # a segment exceeds the target only when it holds a single storage larger than it
    for a, b in layout.segments:
        inside = [e for e in entries if a <= e.offset < b]
        assert (b - a) * item <= max(seg, align) + align or len(inside) == 1


def test_pad_to_extends_last_segment_and_refuses_to_shrink():
    layout = FlatLayout.build(LayoutKey(Category.PARAMS, torch.float32), _entries([100, 200]),
                              alignment_bytes=64, segment_bytes=1 << 20)
    layout.pad_to(1000)
    assert layout.numel == 1000 and layout.segments[-1][1] == 1000
    with pytest.raises(ValueError, match="cannot shrink"):
        layout.pad_to(10)


def test_entry_of_wrong_dtype_is_rejected():
    with pytest.raises(ValueError, match="does not belong"):
        FlatLayout.build(LayoutKey(Category.PARAMS, torch.bfloat16), _entries([4], torch.float32),
                         alignment_bytes=64, segment_bytes=4096)


def test_layout_keys_sort_the_same_way_everywhere():
    keys = [LayoutKey(Category.OPTIMIZER, torch.float32), LayoutKey(Category.PARAMS, torch.float32),
            LayoutKey(Category.PARAMS, torch.bfloat16), LayoutKey(Category.GRADS, torch.bfloat16)]
    order = [k.label() for k in sorted(keys, key=LayoutKey.sort_key)]
    assert order == ["params/bfloat16", "params/float32", "grads/bfloat16", "optimizer/float32"]


def test_category_parsing_and_selection():
    assert Category.parse("params") is Category.PARAMS and Category.parse("GRADS") is Category.GRADS
    assert Category.select(None) == frozenset(Category)
    assert Category.select(["optimizer", Category.BUFFERS]) == {Category.OPTIMIZER, Category.BUFFERS}
    assert Category.select("grads") == {Category.GRADS}
    with pytest.raises(ValueError, match="unknown state category"):
        Category.parse("activations")


@pytest.mark.parametrize("kwargs, match", [
    ({"alignment_bytes": 100}, "power of two"),
    ({"pin_fallback": "silent"}, "pin_fallback"),
    ({"segment_bytes": 8}, "segment_bytes"),
    ({"pin_threads": 0}, "pin_threads"),
    ({"pack_below_bytes": 1 << 30}, "pack_below_bytes"),
    ({"staging_buffers": 0}, "staging_buffers"),
])
def test_bad_config_is_refused_with_the_field_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StoreConfig(**kwargs)


def test_every_layout_transition_follows_its_row_of_the_table_and_refuses_any_other_state():
    from refimpl.store.errors import StoreStateError
    from refimpl.store.state.layout import LAYOUT_TRANSITIONS, FlatLayout, LayoutKey, LayoutState

    flat = torch.zeros(0)
    from refimpl.store.state.parking import Parking

    calls = {"park": lambda lay: lay.park(None, Parking()), "unpark": FlatLayout.unpark,
             "mark_offloaded": lambda lay: lay.mark_offloaded(False), "repoint": lambda lay: lay.repoint(flat),
             "repark": FlatLayout.repark, "mark_resident": lambda lay: lay.mark_resident(flat)}
    assert {op for op, _ in LAYOUT_TRANSITIONS} == set(calls)
    for (op, before), after in LAYOUT_TRANSITIONS.items():
        for state in LayoutState:
            lay = FlatLayout(LayoutKey(Category.PARAMS, torch.float32), [], 0, 0, ((0, 0),), state=state)
            if state is before:
                calls[op](lay)
                assert lay.state is after, (op, state)
            else:
                with pytest.raises(StoreStateError, match=f"cannot {op}"):
                    calls[op](lay)
                assert lay.state is state
