"""The access guard: an offloaded tensor raises a clear error on every use but reading its metadata.

[Note: offload guard]
While its bytes are in host memory a registered tensor is parked (see [Note:
parked tensors] in :mod:`refimpl.store.state.parking`) and *guarded*: its class is
swapped for a subclass (``OffloadedTensor``, ``OffloadedParameter``,
``OffloadedDTensor``, one per original class, made once) whose
``__torch_function__`` raises :class:`OffloadedTensorError` naming the tensor
and saying ``reload() first`` for every torch call but a metadata read
(:data:`METADATA`: shape, dtype, device, ``requires_grad``, ``grad``,
``grad_fn``, ``is_leaf``, strides, the storage object ...). ``repr()``,
``str()`` and ``format()`` return a short text saying the tensor is offloaded:
debuggers and loggers call them. The reload swaps the class back. Default on;
debug mode (``TIMESHARE_DEBUG=1``) adds where the offload was called from.

What reaches ``__torch_function__``: every Python-level torch call with the
tensor in its arguments (also inside lists, as ``torch._foreach_*`` and the
optimizers pass them): methods, ``torch.*``, ``torch.nn.functional``,
``torch.nn.init``, ``torch.ops.*``, indexing (``p[i] = v``), properties
(``p.data``, ``p.T``), ``copy.deepcopy``, and the ``torch.distributed``
collectives (``all_reduce``, ``broadcast``, ``send`` ... handle torch
functions). FSDP2's DTensor parameters and DTensor optimizer states are
guarded as well as their local tensors, since DTensor's
``__torch_dispatch__`` unwraps to the local tensor below the torch-function
layer. So are the views clients park (torch DDP's bucket ``p.grad`` views,
Megatron's views of its buffers), views of a flat buffer kept across an
offload, and host-resident state an offload leaves in place (AdamW's CPU
``step`` counters on a GPU store), so that ``opt.step()`` raises before it
changes anything.

What does not, and why it is harmless:

* C++ callers (the autograd engine's gradient accumulation, c10d's
  ``ProcessGroup`` methods called directly, the ``p.real = x`` /
  ``p.imag = x`` setters, DTensor's dispatch of a DTensor the store does not
  know that wraps a registered local tensor, kernels of compiled graphs) meet
  the placeholder, which is read-only: whatever takes a writable data pointer
  raises torch's "Cannot access data pointer" error (every write; Gloo's
  collectives even when they only send: checked), and a write of more than one
  element raises "more than one element of the written-to tensor refers to a
  single memory location". A backward through a graph recorded before the
  offload raises torch's "modified by an inplace operation" error (the
  re-point bumps the version counter). What remains: a C++ *read* through a
  read-only pointer sees the placeholder's value, NaN for floating dtypes
  (which shows downstream) and 0 for the others. The state itself is never
  changed that way.
* Code running with torch functions disabled
  (``torch._C.DisableTorchFunctionSubclass``, another subclass's
  ``__torch_function__`` that handles every type instead of returning
  ``NotImplemented``): the same placeholder rules.
* A CUDA graph captured before the offload and replayed after it reads the
  released addresses: torch cannot see that (not a guard matter).
* ``p.data = x``, ``p.set_(x)`` and ``p.grad = x`` re-point, read no bytes and
  are allowed: the next reload raises ``TensorChangedError`` (``recover()``
  undoes it).

Subclasses with a torch-function protocol of their own are guarded the same
way: while offloaded their protocol is not consulted (every call but a
metadata read raises; metadata reads answer from the tensor itself), and it
is back with the class on reload.

The seam: ``guard(t, name, on_access=fn)`` makes the first non-metadata torch
call that touches ``t`` call ``fn(t)`` (torch functions disabled inside it),
then unguard ``t`` and run the call, instead of raising; if ``fn`` raises, the
call raises and ``t`` stays guarded. A reload that re-points tensors while their
copies are in flight uses it to wait for a tensor's copy on first use. The
check costs one dict lookup per call on a guarded tensor; the guard itself one
class assignment and one attribute per tensor at park, and their undoing at
reload: two Python calls per tensor each way, about 1-2 us per tensor of CPU
time on a loaded CPU, run while the copies are in flight
(``python3 bench/gpu/guard_cost.py --overhead``; the share of the H200's
steady cycle: ``python3 bench/gpu/guard_cost.py``).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator, Mapping

import torch

logger = logging.getLogger(__name__)


class OffloadedTensorError(RuntimeError):
    """An offloaded tensor was used: its bytes are in host memory until the store that offloaded it reloads."""


OnAccess = Callable[[torch.Tensor], None]
"""``on_access(t)``: called on the first torch call that touches the guarded ``t``; returning lets the call run."""

METADATA = frozenset({
    "shape", "dtype", "device", "layout", "names", "name", "ndim", "dim", "size", "numel", "nelement", "__len__",
    "requires_grad", "requires_grad_", "is_leaf", "grad_fn", "_grad_fn", "grad", "_grad", "_base", "_is_view",
    "_version", "output_nr", "retains_grad", "_backward_hooks", "_post_accumulate_grad_hooks",
    "data=", "grad=", "_grad=", "requires_grad=", "set_",
    "is_cuda", "is_cpu", "is_meta", "is_mps", "is_xpu", "is_sparse", "is_sparse_csr", "is_mkldnn", "is_quantized",
    "is_nested", "is_floating_point", "is_complex", "is_signed", "element_size", "itemsize", "nbytes", "get_device",
    "untyped_storage", "storage_offset", "stride", "is_contiguous", "is_pinned", "__hash__", "__dir__",
})
"""Names of the torch calls an offloaded tensor answers (``name=`` is setting the attribute): metadata
reads, and re-pointing it (``p.data = x``, ``p.set_(x)``; ``p.grad = x``), which reads no bytes and which
the next reload reports as a ``TensorChangedError``. ``untyped_storage()`` returns the read-only placeholder; ``data_ptr()`` is not here:
the tensor has no device address while offloaded."""

_TEXT = frozenset({"__repr__", "__str__", "__format__"})

_NAME = "_timeshare_parked"  # guard() writes these three as plain attributes (no setattr call)
_ON_ACCESS = "_timeshare_on_access"
_WHERE = "_timeshare_where"

_LOCK = threading.Lock()
_GUARD_CLASSES: dict[type, type] = {}
_ORIGINAL_CLASS: dict[type, type] = {}
GUARDED_CLASSES: Mapping[type, type] = _ORIGINAL_CLASS
"""Guard class -> the class it replaced (read it, never write it: ``type(t) in GUARDED_CLASSES`` is
:func:`is_guarded` without the call)."""

_disabled = torch._C.DisableTorchFunctionSubclass
_run_disabled = torch._C._disabled_torch_function_impl  # func(*args, **kwargs) with subclass torch functions off
_ENABLED = [True]


def _func_name(func: Any) -> str:
    name = getattr(func, "__name__", "") or str(func)
    if name in ("__get__", "__set__"):  # a property: the descriptor's name (``shape``, ``data`` ...), ``=`` if set
        attr = getattr(getattr(func, "__self__", None), "__name__", None)
        if attr is not None:
            return attr if name == "__get__" else attr + "="
    return name


def _guarded_in(obj: Any, out: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every guarded tensor in ``obj`` (tensors, lists, tuples, dict values, nested), in order, once each."""
    if isinstance(obj, torch.Tensor):
        if type(obj) in _ORIGINAL_CLASS and not any(o is obj for o in out):
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _guarded_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _guarded_in(x, out)
    return out


def offloaded_text(t: torch.Tensor) -> str:
    """What ``repr()`` of the guarded ``t`` says: its registered name, shape, dtype and device."""
    with _disabled():
        shape, dtype, device = tuple(t.shape), t.dtype, t.device
    return (f"<offloaded tensor {getattr(t, _NAME, '<unnamed>')}: shape {shape}, {dtype}, {device}; "
            f"its bytes are in host memory, reload() first>")


def _error(blocked: list[torch.Tensor], func_name: str) -> OffloadedTensorError:
    names = ", ".join(getattr(t, _NAME, "<unnamed>") for t in blocked[:3])
    more = f" and {len(blocked) - 3} more" if len(blocked) > 3 else ""
    one = len(blocked) == 1
    use = f"setting .{func_name[:-1]}" if func_name.endswith("=") else f"{func_name}()"
    where = getattr(blocked[0], _WHERE, None)
    detail = f" (offloaded at {where})" if where else ""
    return OffloadedTensorError(
        f"{names}{more} {'is' if one else 'are'} offloaded{detail}: {'its' if one else 'their'} bytes are in "
        f"host memory, and {use} needs them; reload() first (on the store that offloaded "
        f"{'it' if one else 'them'}). Shape, dtype, device and requires_grad can be read while offloaded")


def _torch_function(cls, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
    name = _func_name(func)
    if name in METADATA:  # the fast path: a name lookup, a set lookup, one C call
        return _run_disabled(func, types, args, kwargs or {})
    found = _guarded_in((args, kwargs), [])
    blocked = [t for t in found if getattr(t, _ON_ACCESS, None) is None]
    if blocked or not found:
        if name in _TEXT and blocked and args and args[0] is blocked[0]:
            return offloaded_text(blocked[0])
        raise _error(blocked, name) if blocked else OffloadedTensorError(
            f"an offloaded tensor is used by {name}(); reload() first")
    for t in found:
        on_access = getattr(t, _ON_ACCESS)
        with _disabled():
            on_access(t)
        unguard(t)
    return func(*args, **(kwargs or {}))


def guard_class(cls: type) -> type:
    """The guard subclass of ``cls`` (made once per class); a guard class is its own."""
    g = _GUARD_CLASSES.get(cls)
    if g is not None:
        return g
    if cls in _ORIGINAL_CLASS:
        return cls
    with _LOCK:
        g = _GUARD_CLASSES.get(cls)
        if g is None:
            g = type(f"Offloaded{cls.__name__}", (cls,), {
                "__slots__": (), "__module__": __name__, "__torch_function__": classmethod(_torch_function)})
            _ORIGINAL_CLASS[g] = cls
            _GUARD_CLASSES[cls] = g
    return g


def guard(t: torch.Tensor, name: str, on_access: OnAccess | None = None, where: str | None = None) -> bool:
    """Guard ``t``: every torch call on it but a metadata read raises :class:`OffloadedTensorError` naming
    ``name`` (see [Note: offload guard]); with ``on_access``, the first such call runs ``on_access(t)``,
    unguards ``t`` and proceeds instead. ``where``: a debug detail for the message. Returns False (and
    logs) if ``t``'s class cannot be swapped; guarding a guarded tensor replaces its name and callback."""
    g = _GUARD_CLASSES.get(type(t))
    try:
        if g is not None:  # the steady path: one class assignment, one attribute, no further call
            t.__class__ = g
        elif type(t) not in _ORIGINAL_CLASS:
            t.__class__ = guard_class(type(t))
        else:  # guarded again: a new name, callback and site
            t.__dict__.pop(_ON_ACCESS, None)
            t.__dict__.pop(_WHERE, None)
        t._timeshare_parked = name
    except (TypeError, AttributeError) as e:
        logger.warning("cannot guard %s (%s): it stays parked unguarded (writes raise, reads see NaN)", name, e)
        return False
    if on_access is not None:
        t._timeshare_on_access = on_access
    if where is not None:
        t._timeshare_where = where
    return True


def unguard(t: torch.Tensor) -> None:
    """Undo :func:`guard` (nothing for a tensor that is not guarded)."""
    orig = _ORIGINAL_CLASS.get(type(t))
    if orig is not None:
        t.__class__ = orig
        d = t.__dict__
        if _NAME in d:
            del d[_NAME]
        if _ON_ACCESS in d:
            del d[_ON_ACCESS]
        if _WHERE in d:
            del d[_WHERE]


def is_guarded(t: torch.Tensor) -> bool:
    """True if ``t`` carries the guard."""
    return type(t) in _ORIGINAL_CLASS


def guard_enabled() -> bool:
    """False only inside :func:`unguarded_parking` (the guard's own benchmark)."""
    return _ENABLED[0]


@contextlib.contextmanager
def unguarded_parking() -> Iterator[None]:
    """Offloads inside park tensors without the guard: for ``bench/gpu/guard_cost.py``, which measures what
    the guard costs. Never in training: an unguarded offloaded tensor reads NaN silently."""
    _ENABLED[0] = False
    try:
        yield
    finally:
        _ENABLED[0] = True


__all__ = [
    "GUARDED_CLASSES",
    "METADATA",
    "OffloadedTensorError",
    "OnAccess",
    "guard",
    "guard_class",
    "guard_enabled",
    "is_guarded",
    "offloaded_text",
    "unguard",
    "unguarded_parking",
]
