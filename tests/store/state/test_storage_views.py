"""The fallback walk over every tensor alive (:func:`refimpl.store.state.storage_views.find_views`)."""
from __future__ import annotations

import weakref

import torch

from refimpl.store.state.storage_views import find_views


def test_find_views_skips_weak_proxies_dead_or_alive():
    """A dead ``weakref.proxy`` of a tensor (torch.compile leaves such proxies behind) raises ReferenceError on
    ``isinstance``; a live one passes it. The walk neither raises nor returns a proxy, and still finds the views."""
    base = torch.arange(16, dtype=torch.float32)
    view = base[4:8]
    gone = torch.zeros(3)
    dead = weakref.proxy(gone)
    del gone
    alive = weakref.proxy(view)
    sid = base.untyped_storage()._cdata
    found = find_views(sid, {id(base)})
    assert any(t is view for t in found)
    assert all(type(t) is not weakref.ProxyType for t in found)
    assert not any(t is base for t in found)
    del dead, alive
