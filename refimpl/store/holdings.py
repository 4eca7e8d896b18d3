"""What one store holds: its flat layouts by key, which categories are offloaded, and the host-resident tensors
an offload guarded in place. :class:`Holdings` changes only as a whole operation ends (an offload installs its
layouts, a reload settles the categories that came back), so the store's operations read it, never half of it."""
from __future__ import annotations

from typing import Any, Iterable

import torch

from refimpl.store.backends.base import StoreBackend
from refimpl.store.config import Category
from refimpl.store.state.guard import unguard
from refimpl.store.state.layout import FlatLayout, LayoutKey, LayoutState


class Holdings:
    """The layouts one store holds (resident or offloaded), the offloaded categories, and the host-resident
    tensors guarded while their category is offloaded (``Offload.guard_left_in_place``)."""

    def __init__(self) -> None:
        #: every flat layout by key, resident or offloaded
        self.layouts: dict[LayoutKey, FlatLayout] = {}
        #: the categories offloaded now
        self.offloaded: set[Category] = set()
        #: ``(category, tensor)`` of the host-resident tensors guarded in place while their category is offloaded
        self.left_in_place: list[tuple[Category, Any]] = []

    def install(self, cats: frozenset[Category], layouts: dict[LayoutKey, FlatLayout],
                left_in_place: list[tuple[Category, Any]]) -> None:
        """An offload of ``cats`` completed: its layouts replace the ones held for ``cats``."""
        for key in [k for k in self.layouts if k.category in cats]:
            del self.layouts[key]
        self.layouts.update(layouts)
        self.offloaded |= cats
        self.left_in_place += left_in_place

    def settle_back(self, cats: Iterable[Category]) -> None:
        """The categories of ``cats`` none of whose layouts is still offloaded are back: no longer offloaded, and
        their host-resident tensors guarded in place usable again."""
        left = {lay.category for lay in self.layouts.values() if lay.state is LayoutState.OFFLOADED}
        back = set(cats) - left
        self.offloaded -= back
        for _, t in [x for x in self.left_in_place if x[0] in back]:
            unguard(t)
        self.left_in_place = [x for x in self.left_in_place if x[0] not in back]

    def resident(self, cats: Iterable[Category]) -> list[FlatLayout]:
        """The layouts of ``cats`` resident in one flat device buffer (after a reload)."""
        return [lay for lay in self.layouts.values()
                if lay.state is LayoutState.ON_DEVICE and lay.flat_storage is not None and lay.category in cats]

    def offloaded_layouts(self, cats: Iterable[Category]) -> list[FlatLayout]:
        """The layouts of ``cats`` offloaded now."""
        return [lay for lay in self.layouts.values() if lay.state is LayoutState.OFFLOADED and lay.category in cats]

    def partly_offloaded(self, cats: Iterable[Category]) -> list[str]:
        """The offloaded categories of ``cats`` with a layout back on the device (a ``reload(local_only=True)``
        brought back their rank-local layouts), by value, sorted."""
        return sorted(c.value for c in set(cats) & self.offloaded
                      if any(lay.category is c and lay.state is LayoutState.ON_DEVICE for lay in self.layouts.values()))

    def sizes(self) -> dict[str, Any]:
        """What :class:`~refimpl.store.stats.StoreStats` reports of the state held: device bytes by category
        value, the offloaded categories, and how many layouts, storages and tensors."""
        by_cat: dict[str, int] = {}
        for layout in self.layouts.values():
            by_cat[layout.category.value] = by_cat.get(layout.category.value, 0) + layout.data_nbytes
        layouts = self.layouts.values()
        return {"bytes_by_category": by_cat, "offloaded": tuple(sorted(cat.value for cat in self.offloaded)),
                "layouts": len(self.layouts), "storages": sum(len(lay.entries) for lay in layouts),
                "tensors": sum(len(e.refs) for lay in layouts for e in lay.entries)}

    def host_tensors(self, cats: frozenset[Category], backend: StoreBackend) -> dict[str, torch.Tensor]:
        """Host views (no copy) of every offloaded tensor of ``cats`` that ``backend`` holds whole, by name."""
        out: dict[str, torch.Tensor] = {}
        for layout in sorted(self.layouts.values(), key=lambda lay: lay.key.sort_key()):
            if layout.state is not LayoutState.OFFLOADED or layout.dropped or layout.category not in cats:
                continue
            for e in layout.entries:
                host = backend.host_view(layout, e.offset, e.offset + e.numel)
                if host is None:
                    continue
                st = host.untyped_storage()
                for r in e.refs:
                    out[r.name] = torch.empty(0, dtype=layout.dtype).set_(
                        st, host.storage_offset() + r.offset, r.size, r.stride)
        return out


__all__ = ["Holdings"]
