"""What the store moves (:class:`Category`) and how (:class:`StoreConfig`)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Iterable

from refimpl.arguments import ArgumentTypeError, describe, expect_bool, expect_int, expect_name

INCLUDE = ("a category ('params', 'grads', 'optimizer', 'buffers'), a Category, a collection of them, "
           "or None for all")


class Category(enum.Enum):
    """A kind of training state; ``offload(include=...)`` selects by category.

    Fp32 master weights belong to :attr:`OPTIMIZER` (the optimizer owns them in
    mixed-precision training); DDP-style contiguous buffers belong to the
    category of what they hold (a flat param buffer to :attr:`PARAMS`, a flat
    grad buffer to :attr:`GRADS`). A finer label for backends travels as the
    entry's ``kind`` (see :meth:`OffloadStore.attach_tensors`).
    """

    PARAMS = "params"
    GRADS = "grads"
    OPTIMIZER = "optimizer"
    BUFFERS = "buffers"

    @classmethod
    def parse(cls, value: "Category | str") -> "Category":
        """A category from itself or its name/value (``"params"``, ``"PARAMS"``)."""
        if isinstance(value, Category):
            return value
        if not isinstance(value, str):
            raise ArgumentTypeError(f"a state category must be a Category or one of "
                                    f"{[c.value for c in cls]}, got {describe(value)}")
        text = value.strip().lower()
        for c in cls:
            if text in (c.value, c.name.lower()):
                return c
        raise ValueError(f"unknown state category {value!r}; expected one of {[c.value for c in cls]}")

    @classmethod
    def select(cls, include: "Iterable[Category | str] | Category | str | None") -> frozenset["Category"]:
        """The categories ``include`` names; ``None`` means all of them (anything else: ArgumentTypeError)."""
        if include is None:
            return frozenset(cls)
        if isinstance(include, (Category, str)):
            include = [include]
        elif not isinstance(include, Iterable):
            raise ArgumentTypeError(f"include must be {INCLUDE}, got {describe(include)}")
        return frozenset(cls.parse(c) for c in include)


#: order in which layouts of different categories are processed (identical on every rank)
CATEGORY_ORDER: dict[Category, int] = {c: i for i, c in enumerate(Category)}
#: order in which a reload issues its layouts' copies: the order a training step first uses each category
#: (the forward reads params and buffers, the backward writes grads, the optimizer step reads its state), so
#: the tensors a streamed reload hands over first are the first ones needed (see [Note: streamed reload] in
#: refimpl.store.moves.reload). Identical on every rank, like CATEGORY_ORDER, which still orders everything else.
FIRST_USE_ORDER: dict[Category, int] = {Category.PARAMS: 0, Category.BUFFERS: 1, Category.GRADS: 2,
                                        Category.OPTIMIZER: 3}

PIN_FALLBACKS = ("raise", "pageable_warn")
PIN_AHEAD_MODES = ("background", "off")


@dataclass(frozen=True)
class StoreConfig:
    """Options of :class:`~refimpl.store.OffloadStore`. Validated at construction.

    ``alignment_bytes``: every storage starts at a multiple of this many bytes
    inside its flat buffer (a power of two, at least 16).

    ``pin_fallback``: what happens when host memory cannot be pinned
    (``ulimit -l``, no memory). ``"raise"`` (default) raises the runtime's
    ``PinningError``, which names the size; nothing has moved. ``"pageable_warn"``
    warns loudly (``warnings.warn`` and a log warning naming the size) and uses
    pageable memory, which copies at roughly a quarter of the line rate; the
    pageable bytes are reported in :class:`StoreStats`. Never silent.

    ``segment_bytes``: host buffers are pinned in segments of about this size,
    cut at storage boundaries, so the first offload can copy segment k while
    segment k+1 is being pinned. ``pin_threads``: threads that pin segments
    concurrently; ``None`` picks ``min(8, cpus // 2)`` on a CUDA device and 1
    elsewhere (the simulator is single-threaded).

    ``pack_below_bytes``: on an offload where the state is scattered over many
    storages (the first one, or after the framework reallocated tensors),
    storages smaller than this are first packed on the device into a staging
    buffer (a device-to-device copy at HBM speed) and leave in one large D2H
    copy; larger ones are copied directly. ``staging_bytes`` x
    ``staging_buffers`` bounds the extra device memory this needs.

    ``pin_ahead``: when the host memory of the first offload is pinned.
    ``"background"``: every ``attach_*`` call plans the layouts of the state
    attached so far and starts pinning their exact-size host buffers on the
    pool's threads (:meth:`OffloadStore.pin_ahead`), so the first offload finds
    them pinned instead of pinning inside the switch window (registering fresh
    memory runs at a few GB/s, far below the copy). State created after the
    last attach (an optimizer's lazily created ``exp_avg``) is pinned by the
    first offload unless the caller calls ``store.pin_ahead()`` once it exists.
    ``"off"``: pin during the first offload (streamed). ``None`` (default):
    ``"background"`` on a CUDA device, ``"off"`` elsewhere.

    ``empty_cache``: after an offload, return the freed blocks to the driver so
    that ``cudaMemGetInfo`` (and the next role on the GPU) sees them.

    ``stream_chunk_bytes``: a streamed reload (``reload(stream=True)``) copies
    in pieces of at most this many bytes, each with its own completion; a
    tensor's first use waits (on the device) for the pieces holding its bytes.

    ``stream_window_bytes``: a streamed reload keeps at most this many bytes
    of its pieces queued on the device, a feeder thread issuing the next
    window once the last has completed (``Runtime.paced_copies``), so the
    caller's own host-to-device copies wait behind one window at most instead
    of the whole reload (the copy engine serves a stream's queued copies before
    another stream's: see [Note: paced copies] in
    :mod:`refimpl.torch_runtime.copy_stream`). ``None`` (default): every piece
    queued at once (docs/store.md gives the measurements behind the default).

    ``stream_sm_ctas``: a streamed reload's host-to-device copies are made by a
    kernel of this many programs reading the pinned host buffers
    (``Runtime.copies_on_sms``; [Note: copies on SMs] in
    :mod:`refimpl.torch_runtime.sm_copy`) instead of the copy engine, so the
    caller's own copies never queue behind them; a device that cannot read host
    memory directly falls back to the engine. Where both are set, copies on SMs
    are not paced (the engine is free anyway). ``None`` (default): the engine
    (docs/store.md gives the measurements behind the default).
    """

    alignment_bytes: int = 512
    pin_fallback: str = "raise"
    segment_bytes: int = 256 << 20
    pin_threads: int | None = None
    pack_below_bytes: int = 4 << 20
    staging_bytes: int = 64 << 20
    staging_buffers: int = 2
    empty_cache: bool = True
    pin_ahead: str | None = None
    stream_chunk_bytes: int = 64 << 20
    stream_window_bytes: int | None = None
    stream_sm_ctas: int | None = None

    def pin_ahead_mode(self, device_type: str) -> str:
        """The effective :attr:`pin_ahead` mode on a device of this type (``None`` resolved)."""
        if self.pin_ahead is None:
            return "background" if device_type == "cuda" else "off"
        return self.pin_ahead

    def __post_init__(self) -> None:
        self._check_types()
        a = self.alignment_bytes
        if a < 16 or a & (a - 1):
            raise ValueError(f"StoreConfig.alignment_bytes must be a power of two >= 16, got {a}")
        if self.pin_fallback not in PIN_FALLBACKS:
            raise ValueError(f"StoreConfig.pin_fallback must be one of {PIN_FALLBACKS}, got {self.pin_fallback!r}")
        if self.segment_bytes < a:
            raise ValueError(f"StoreConfig.segment_bytes ({self.segment_bytes}) must be >= alignment_bytes ({a})")
        if self.pin_threads is not None and self.pin_threads < 1:
            raise ValueError(f"StoreConfig.pin_threads must be >= 1 or None (auto), got {self.pin_threads}")
        if self.pack_below_bytes < 0:
            raise ValueError(f"StoreConfig.pack_below_bytes must be >= 0, got {self.pack_below_bytes}")
        if self.pack_below_bytes > self.staging_bytes:
            raise ValueError(
                f"StoreConfig.pack_below_bytes ({self.pack_below_bytes}) must be <= staging_bytes "
                f"({self.staging_bytes}): a packed storage has to fit in one staging buffer"
            )
        if self.pin_ahead is not None and self.pin_ahead not in PIN_AHEAD_MODES:
            raise ValueError(f"StoreConfig.pin_ahead must be one of {PIN_AHEAD_MODES} or None (auto), "
                             f"got {self.pin_ahead!r}")
        if self.staging_buffers < 1:
            raise ValueError(f"StoreConfig.staging_buffers must be >= 1, got {self.staging_buffers}")
        if self.stream_window_bytes is not None and self.stream_window_bytes < self.stream_chunk_bytes:
            raise ValueError(f"StoreConfig.stream_window_bytes ({self.stream_window_bytes}) must be None or >= "
                             f"stream_chunk_bytes ({self.stream_chunk_bytes}): a window holds at least one piece")
        if self.stream_sm_ctas is not None and not 1 <= self.stream_sm_ctas <= 4096:
            raise ValueError(f"StoreConfig.stream_sm_ctas must be None or 1..4096 programs, got {self.stream_sm_ctas}")
        if self.stream_chunk_bytes < a:
            raise ValueError(f"StoreConfig.stream_chunk_bytes ({self.stream_chunk_bytes}) must be >= alignment_bytes "
                             f"({a})")

    def _check_types(self) -> None:
        for f in fields(self):
            value, where = getattr(self, f.name), "StoreConfig(...)"
            if f.name == "empty_cache":
                expect_bool(value, where, f.name)
            elif f.name in ("pin_fallback", "pin_ahead"):
                expect_name(value, where, f.name, optional=f.name == "pin_ahead")
            else:
                expect_int(value, where, f.name, optional=f.name in ("pin_threads", "stream_window_bytes",
                                                                         "stream_sm_ctas"))


__all__ = ["CATEGORY_ORDER", "Category", "FIRST_USE_ORDER", "PIN_AHEAD_MODES", "PIN_FALLBACKS", "StoreConfig"]
