"""Process groups a training framework created, adopted by :class:`~refimpl.torch_runtime.TorchRuntime`.

Theory of operation
-------------------
A framework such as Megatron-core makes its process groups itself
(``parallel_state.initialize_model_parallel``) and keeps the group objects:
in module globals, and in the objects built from them (every tensor-parallel
layer's ``tp_group``, the DDP wrapper, its buffers and bucket groups, the
optimizers, the MoE token dispatchers; about 40 holders on a two-layer MoE
GPTModel). :meth:`TorchRuntime.adopt_group` registers such a group under a name
so that :class:`refimpl.comm.PGLifecycle` can keep, suspend, or destroy and
rebuild it like its own groups. A rebuild makes a *new* ``ProcessGroup``
object (torch cannot re-initialise one in place), so an adopted group is
rebuilt *in place* as far as Python can see:

[Note: rebuilt in place] After :meth:`TorchRuntime.recreate_group` made the new
group, every Python reference to the destroyed object is pointed at the new
one: dict values and keys (module globals, instance dicts, plain dicts), list
items, instance attributes (``__dict__`` and ``__slots__``) and closure cells.
The holders are found with one ``gc.get_referrers`` scan over every adopted
group that is down at that moment (it visits every object the garbage collector
tracks; its time is logged at DEBUG), so a walk that rebuilds N groups scans
once, not N times; the scan's result is kept until the next destroy. An
instance attribute is remembered for good (weakly): see :class:`HeldReferences`. The trade-off: the
runtime changes attributes of objects it does not own, where Megatron offers no
way to hand it new groups; what it cannot change (a tuple, the locals of a
running function) is logged as a warning with the holder's type, because a
framework that uses such a reference later would call a destroyed group.
Torch's own registries forget the old object at its destroy, so they are never
touched.

A non-member rank holds no group object (``None``): it takes part in the
rebuild (``dist.new_group`` is called by every rank) and swaps nothing.
"""
from __future__ import annotations

import gc
import logging
import time
import types
import weakref
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Iterable, NamedTuple

import torch
import torch.distributed as dist

from refimpl.runtime.base import GroupError, GroupSpec

log = logging.getLogger(__name__)


@dataclass
class ForeignGroup:
    """An adopted group on this rank: how to re-create it as it was, and the object a rebuild replaces.

    ``create_kwargs``: the ``dist.new_group`` arguments read from the framework's object on a
    member (``pg_options`` of an NCCL group, ``group_desc``); empty on a non-member.
    ``retired``: the destroyed process group, kept until its rebuild has swapped it out.
    """

    create_kwargs: dict[str, Any] = field(default_factory=dict)
    retired: Any = None


def foreign_spec(name: str, handle: Any) -> tuple[GroupSpec, dict[str, Any]]:
    """The :class:`GroupSpec` of a framework's process-group object (ranks, backend, timeout as created) and the
    other ``dist.new_group`` arguments that re-create it (``pg_options`` of NCCL, ``group_desc``)."""
    if not isinstance(handle, dist.ProcessGroup):
        raise GroupError(f"group {name!r}: expected a torch.distributed ProcessGroup, got {type(handle).__name__}")
    backend = str(dist.get_backend(handle))
    kwargs: dict[str, Any] = {}
    timeout_s = 600.0
    options = _backend_options(handle, backend)
    if options is not None:
        timeout = getattr(options, "_timeout", None)
        if isinstance(timeout, timedelta) and timeout.total_seconds() > 0:
            timeout_s = timeout.total_seconds()
        if backend == "nccl":  # high-priority streams, the communicator config: re-created as they were
            kwargs["pg_options"] = options
    desc = getattr(handle, "group_desc", "")
    if desc and desc != "undefined":
        kwargs["group_desc"] = desc
    ranks = tuple(sorted(dist.get_process_group_ranks(handle)))
    return GroupSpec(name, ranks, backend=backend, timeout_s=timeout_s), kwargs


class AdoptedGroups:
    """The groups a :class:`~refimpl.torch_runtime.TorchRuntime` adopted, by name, and where Python holds them."""

    def __init__(self) -> None:
        self._groups: dict[str, ForeignGroup] = {}
        self._held = HeldReferences()

    def adopt(self, rank: int, spec: GroupSpec, handle: Any) -> GroupSpec:
        """Check and record an adoption on ``rank`` (``handle``: the framework's object, None on a non-member);
        returns the spec to keep (a member's names the backend the object was made with)."""
        member = rank in spec.ranks
        if member != (handle is not None):
            raise GroupError(f"group {spec.name!r} {spec.ranks}: rank {rank} "
                             f"{'is a member but passed no group object' if member else 'is no member but passed one'}")
        kwargs: dict[str, Any] = {}
        if handle is not None:
            own, kwargs = foreign_spec(spec.name, handle)
            if own.ranks != spec.ranks:
                raise GroupError(f"group {spec.name!r}: the object passed has ranks {own.ranks}, the spec {spec.ranks}")
            spec = replace(spec, backend=spec.backend or own.backend)  # a non-member's spec names none
        self._groups[spec.name] = ForeignGroup(kwargs)
        return spec

    def create_kwargs(self, name: str) -> dict[str, Any] | None:
        """The extra ``dist.new_group`` arguments that re-create adopted group ``name`` (None: not adopted)."""
        g = self._groups.get(name)
        return g.create_kwargs if g is not None else None

    def retire(self, name: str, pg: Any) -> None:
        """Adopted group ``name`` was destroyed: keep its object (None on a non-member) until its rebuild."""
        g = self._groups.get(name)
        if g is not None:
            g.retired = pg
            self._held.forget()

    def rebuilt(self, name: str, pg: Any) -> None:
        """Adopted group ``name`` was re-created as ``pg``: point every reference to its old object at ``pg``."""
        g = self._groups.get(name)
        if g is None or g.retired is None or pg is None:
            return
        records = list(self._groups.values())
        down = [r.retired for r in records if r.retired is not None]
        changed = self._held.swap(g.retired, pg, down, internal=[*records, down, self._groups])
        g.retired = None
        log.debug("group %r rebuilt in place: %d references re-pointed", name, changed)


def _backend_options(handle: Any, backend: str) -> Any:
    """The backend's options object (its timeout, NCCL's config), or None where this torch build hides it."""
    device = torch.device("cuda" if backend == "nccl" else "cpu")
    try:
        return handle._get_backend(device).options
    except (AttributeError, RuntimeError, ValueError) as e:
        log.debug("no backend options for a %s group (%s); the rebuild uses the defaults", backend, e)
        return None


class _Place(NamedTuple):
    """One place that held an adopted group: a dict value or key, a list item, a cell, an attribute."""

    holder: Any  # the container, or a weak reference to an instance
    kind: str
    key: Any

    def container(self) -> Any:
        """The holder (None once a weakly held instance is gone)."""
        return self.holder() if isinstance(self.holder, weakref.ref) else self.holder


class HeldReferences:
    """The places Python holds adopted groups in, found by a scan after each destroy; re-pointed one group at a time.

    See [Note: rebuilt in place] in this module. The places of the last scan are held until the
    next one. An instance attribute is also remembered (weakly, by its instance) for good: once an
    instance's attributes were read as a dict, a dict of atomic values only (process groups, strings,
    numbers) may stop being tracked by the garbage collector, and a later scan would not see it.
    """

    def __init__(self) -> None:
        self._recent: dict[tuple[int, str, Any], _Place] = {}
        self._attrs: dict[tuple[int, str, Any], _Place] = {}
        self._scanned = False

    def forget(self) -> None:
        """A group was destroyed: the next :meth:`swap` scans again for places that hold it."""
        self._scanned = False

    def swap(self, old: Any, new: Any, down: Iterable[Any], internal: Iterable[Any] = ()) -> int:
        """Point every place that holds ``old`` at ``new``; returns how many were changed.

        ``down``: every adopted object that is down now (``old`` among them), scanned together by
        the first swap after a destroy. ``internal``: the runtime's own records, never changed.
        """
        # no comprehension may close over ``old`` here: its cell would be a holder, and swapped
        if not self._scanned:
            handles = [old]
            for h in down:
                if h is not old:
                    handles.append(h)
            self._scan(handles, internal)
            self._scanned = True
        changed = 0
        for k, place in list({**self._attrs, **self._recent}.items()):
            holder = place.container()
            if holder is None:
                self._attrs.pop(k, None)
            else:
                changed += _swap_one(holder, place.kind, place.key, old, new)
        return changed

    def _scan(self, handles: list[Any], internal: Iterable[Any]) -> None:
        start = time.perf_counter()
        ids = {id(h) for h in handles}
        skip = {id(x) for x in internal} | {id(handles), id(self._recent)}
        self._recent = {}
        fixed: list[str] = []
        for holder in gc.get_referrers(*handles):
            if id(holder) in skip or isinstance(holder, types.FrameType):
                continue  # a running function's locals are not ours to change
            slots = _slots_in(holder, ids)
            if not slots:
                fixed.append(type(holder).__name__)
            for kind, key in slots:
                self._recent[(id(holder), kind, key)] = _Place(holder, kind, key)
                if kind == "attr":
                    try:
                        self._attrs[(id(holder), kind, key)] = _Place(weakref.ref(holder), kind, key)
                    except TypeError:  # not weakly referenceable: found by the scans only
                        pass
        if fixed:
            log.warning("references to process groups being rebuilt that cannot be re-pointed, held by: %s; "
                        "whoever uses them later calls a destroyed group", ", ".join(sorted(set(fixed))))
        log.debug("scanned for %d groups that are down in %.3f s: %d places hold them (%d instance attributes known)",
                  len(handles), time.perf_counter() - start, len(self._recent), len(self._attrs))


def _slots_in(holder: Any, ids: set[int]) -> list[tuple[str, Any]]:
    """``(kind, key)`` for every place in ``holder`` that holds one of ``ids`` and can be re-pointed."""
    if isinstance(holder, dict):
        out = [("value", k) for k, v in holder.items() if id(v) in ids]
        return out + ([("keys", None)] if any(id(k) in ids for k in holder) else [])
    if isinstance(holder, list):
        return [("item", i) for i, v in enumerate(holder) if id(v) in ids]
    if isinstance(holder, types.CellType):
        try:
            v = holder.cell_contents
        except ValueError:  # an empty cell
            return []
        return [("cell", None)] if id(v) in ids else []
    out: list[tuple[str, Any]] = []
    attrs = getattr(holder, "__dict__", None)
    if isinstance(attrs, dict):
        out += [("attr", k) for k, v in attrs.items() if id(v) in ids]
    for name in _slot_names(type(holder)):
        if id(getattr(holder, name, None)) in ids:
            out.append(("slot", name))
    return out


def _has_key(holder: dict, old: Any) -> bool:
    for k in list(holder):  # by identity; a loop, not a generator closing over ``old`` (see HeldReferences.swap)
        if k is old:
            return True
    return False


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return names


def _swap_one(holder: Any, kind: str, key: Any, old: Any, new: Any) -> int:
    """Re-point one place if it holds ``old`` now; 1 if it did."""
    if kind == "value" and holder.get(key) is old:
        holder[key] = new
    elif kind == "keys" and _has_key(holder, old):
        holder[new] = holder.pop(old)
    elif kind == "item" and key < len(holder) and holder[key] is old:
        holder[key] = new
    elif kind == "cell" and holder.cell_contents is old:
        holder.cell_contents = new
    elif kind == "attr" and vars(holder).get(key) is old:
        vars(holder)[key] = new  # the instance dict itself: no __setattr__ hooks (nn.Module, frozen dataclasses)
    elif kind == "slot" and getattr(holder, key, None) is old:
        object.__setattr__(holder, key, new)
    else:
        return 0
    return 1


__all__ = ["AdoptedGroups", "ForeignGroup", "HeldReferences", "foreign_spec"]
