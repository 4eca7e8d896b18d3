"""A view attached without its base: the base is attached with it, so it stays valid.

``store.attach_tensors("params", {"v": w.t()})`` (or ``w.view(...)``, ``w[:]``) with ``w`` itself not attached:
before, the offload counted ``w`` (the view's autograd base) as attached but never parked it, released the
storage under it, and reading ``w`` afterwards read freed memory (the process died of SIGSEGV). Now the base is
parked with the view (using it raises ``OffloadedTensorError`` naming it ``params.v#base``) and re-pointed
with it on reload: exact bytes, still the view's base, sharing its storage. A view whose base is attached is
the legitimate case and stays as it was; a base of another dtype is refused with nothing moved.

The assertions on ``w`` read its metadata first (``is_parked``) into plain booleans, so on a store that leaves it
on freed memory they fail before anything (a failure message's ``repr``) reads it.
"""
from __future__ import annotations

import pytest
import torch

from refimpl.store import OffloadedTensorError, OffloadStore, is_parked
from refimpl.store.state.grouping import BASE_SUFFIX
from refimpl.torch_runtime import TorchRuntime

VIEWS = {"t": lambda w: w.t(), "view": lambda w: w.view(-1), "slice": lambda w: w[:], "rows": lambda w: w[2:5]}


def _names(store) -> set[str]:
    return {r.name for lay in store.layouts.values() for e in lay.entries for r in e.refs}


@pytest.mark.parametrize("how", sorted(VIEWS))
def test_the_base_of_an_attached_view_is_parked_and_comes_back_exact(how):
    w = torch.randn(8, 6)
    want = w.clone()
    v = VIEWS[how](w)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors("params", {"v": v}, name="params")
    for cycle in range(3):  # the first (streamed) offload, then the steady ones
        store.offload()
        parked = is_parked(w) and is_parked(v)
        assert parked, f"cycle {cycle}: the base is parked with its view"
        with pytest.raises(OffloadedTensorError, match=rf"params\.v{BASE_SUFFIX} is offloaded.*reload\(\) first"):
            w.sum()
        store.reload()
        assert not is_parked(w) and torch.equal(w, want), f"cycle {cycle}: the base's exact bytes"
        assert torch.equal(v, VIEWS[how](want)) and v._base is w, f"cycle {cycle}: still its view"
        assert v.untyped_storage()._cdata == w.untyped_storage()._cdata
        with torch.no_grad():
            w.add_(1.0)  # a write through the base shows in the view: they share bytes
        want += 1.0
        assert torch.equal(v, VIEWS[how](want))
    assert f"params.v{BASE_SUFFIX}" in _names(store)


def test_a_parameter_trained_through_an_attached_view_matches_training_without_the_store():
    def run(offload: bool):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(6, 4))
        opt = torch.optim.AdamW([w], lr=1e-2)
        store = None
        if offload:
            store = OffloadStore(TorchRuntime("cpu"))
            store.attach_tensors("params", {"wt": w.t()}, name="params")  # only the view is attached
            store.attach_optimizer(opt)
        g = torch.Generator().manual_seed(1)
        for _ in range(4):
            (torch.randn(3, 6, generator=g) @ w).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if store is not None:
                store.offload()
                parked = is_parked(w)
                assert parked, "the parameter (the attached view's base) is parked"
                store.reload()
        return w.detach().clone(), [v.clone() for s in opt.state.values() for v in s.values()]

    ref, got = run(False), run(True)
    assert torch.equal(got[0], ref[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


def test_a_view_whose_base_is_attached_too_keeps_sharing_and_adds_nothing():
    w = torch.randn(8, 6)
    want = w.clone()
    v = w.t()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors("params", {"w": w, "v": v}, name="params")
    store.offload()
    assert is_parked(w) and is_parked(v)
    store.reload()
    assert torch.equal(w, want) and torch.equal(v, want.t())
    assert v.untyped_storage()._cdata == w.untyped_storage()._cdata
    assert _names(store) == {"params.w", "params.v"}, "a base attached by the caller is not attached twice"
    store.offload()
    assert store.stats().last_offload_path == "steady"
    store.reload()
    assert torch.equal(w, want)

