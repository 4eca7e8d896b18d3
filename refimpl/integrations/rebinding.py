"""Names rebound in a framework's modules and classes, and put back: what ``patch()``/``unpatch()`` do.

A framework worker usually imports a helper by name (``from verl.utils.fsdp_utils import
offload_fsdp_model_to_cpu``), so the name lives in the importing module too; replacing it in the
defining module alone leaves the worker calling the original. :class:`Rebinding` replaces a name in
every module given to it *and* in every module already loaded whose attribute of that name is the
original object, and remembers each replacement so that :meth:`Rebinding.undo` restores exactly
those.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

logger = logging.getLogger(__name__)

#: the original of a name the owner did not define itself (it inherited it): undo deletes the name
_INHERITED = object()


@dataclass
class Rebinding:
    """The replacements made so far: (owner, name, original), in order; :meth:`undo` reverts them."""

    done: list[tuple[Any, str, Any]] = field(default_factory=list)

    def replace(self, owner: Any, name: str, new: Any) -> None:
        """Set ``owner.name = new`` (a module or a class), remembering the original (a class that inherited
        ``name`` gets it deleted again on :meth:`undo`)."""
        original = owner.__dict__.get(name, _INHERITED)
        setattr(owner, name, new)
        self.done.append((owner, name, original))

    def replace_everywhere(self, original: Any, name: str, new: Any, modules: Iterable[Any]) -> list[str]:
        """Replace ``name`` in ``modules`` and in every loaded module whose ``name`` is ``original``;
        returns the dotted names rebound."""
        rebound, seen = [], set()
        candidates = list(modules) + [m for m in list(sys.modules.values()) if m is not None]
        for mod in candidates:
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            try:
                current = mod.__dict__.get(name)
            except AttributeError:  # an odd object in sys.modules
                continue
            if current is original:
                self.replace(mod, name, new)
                rebound.append(f"{mod.__name__}.{name}")
        return rebound

    def undo(self) -> int:
        """Put every original back, last replacement first; returns how many."""
        n = 0
        while self.done:
            owner, name, original = self.done.pop()
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
            n += 1
        return n


__all__ = ["Rebinding"]
