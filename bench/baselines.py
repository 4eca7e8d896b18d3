"""The ways of moving a state that the offload benchmark compares, behind one interface.

* :class:`StoreMethod`: this project's :class:`~refimpl.store.OffloadStore` (``local``).
* :class:`PerTensorMethod`: verl's way, ``t.data = t.data.to("cpu", non_blocking=True)`` per
  tensor and back; PyTorch's caching host allocator pins (power-of-two rounded) blocks on
  first use and keeps them.
* :class:`FreshPinMethod`: ROLL's Megatron way, ``t.data = t.data.cpu().pin_memory()``: a
  pageable copy, then a fresh pinned copy every cycle.
* :class:`MemorySaverMethod`: slime/Relax's way, tensors allocated in a
  ``torch_memory_saver`` region with CPU backup, ``pause``/``resume`` (optionally with
  ``retain_cpu_backup``). Only when the package is importable.
* :func:`line_rate`: one large pinned-buffer copy each way: the PCIe line rate.

All device work goes through plain tensor operations and the runtime (``synchronize``,
``empty_cache``, ``memory_info``), so this module runs unchanged on CPU (a dry run).
"""
from __future__ import annotations

import abc
import importlib
import logging
import mmap
import statistics
import time
from typing import Any

import torch

from refimpl.runtime.base import Runtime
from refimpl.store import Category, OffloadStore, StoreConfig

logger = logging.getLogger(__name__)

State = dict[Category, dict[str, torch.Tensor]]


def rss_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``), 0 where unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 0


def sync(rt: Runtime) -> None:
    """Wait for all queued device work."""
    rt.run(rt.synchronize())


class Method(abc.ABC):
    """One way to move a state off the device and back."""

    name: str = ""

    def available(self) -> tuple[bool, str]:
        """``(usable here, why not)``."""
        return True, ""

    @abc.abstractmethod
    def setup(self, rt: Runtime, state: State) -> None:
        """Take over ``state`` (on the device)."""

    @abc.abstractmethod
    def offload(self) -> None:
        """Move the state to the host and free its device memory."""

    @abc.abstractmethod
    def reload(self) -> None:
        """Bring the state back."""

    def tensors(self) -> list[torch.Tensor]:
        """The live state tensors (for the bit-exactness check after the last reload)."""
        return [t for group in self.state.values() for t in group.values()]

    def host_pinned_bytes(self) -> int | None:
        """Pinned host bytes held for the state, when the method can tell."""
        return None

    def details(self) -> dict[str, Any]:
        """Method-specific figures for the report."""
        return {}

    def close(self) -> None:
        """Drop everything."""


class StoreMethod(Method):
    """The offload store with a given config (``label`` names the variant)."""

    def __init__(self, config: StoreConfig | None = None, label: str = "store", *, consolidate: bool = True) -> None:
        self.config = config or StoreConfig()
        self.name = label
        self.consolidate = consolidate
        self.pin_setup_s: float | None = None
        self.consolidate_s: float | None = None

    def setup(self, rt: Runtime, state: State) -> None:
        """Attach each category's tensors, wait for pinning ahead, then (by default) consolidate.

        With ``StoreConfig.pin_ahead="background"`` (the default on CUDA) the
        attach calls start pinning; the time from the first attach until every
        host buffer is pinned is ``pin_setup_s``. ``store.consolidate()`` (one
        offload/reload at setup, ``consolidate_s``) then puts the state in the
        store's flat buffers. Both are paid at setup, as a worker would after its
        first step, not in the measured cycles; the report shows both, and the
        variant key ``consolidate=0`` measures the first cycle without it.
        """
        self.rt, self.state = rt, state
        self.store = OffloadStore(rt, config=self.config)
        t0 = rt.now()
        for cat, tensors in state.items():
            self.store.attach_tensors(cat, tensors, name=cat.value)
        if self.config.pin_ahead_mode(rt.device.type) == "background":
            self.store.pool.wait_all()
            self.pin_setup_s = rt.now() - t0
        if self.consolidate:
            t1 = rt.now()
            self.store.consolidate()
            sync(rt)
            self.consolidate_s = rt.now() - t1

    def offload(self) -> None:
        """``store.offload()``."""
        self.store.offload()

    def reload(self) -> None:
        """``store.reload()``."""
        self.store.reload()

    def host_pinned_bytes(self) -> int | None:
        """From the store's stats."""
        return self.store.stats().host_pinned_bytes

    def details(self) -> dict[str, Any]:
        """Registrations, reuses, copies and phase times of the last offload/reload."""
        s = self.store.stats()
        return {"registrations": s.registrations, "reuses": s.reuses, "copies": s.copies,
                "pageable_bytes": s.host_pageable_bytes, "phases": dict(s.phases),
                "pin_threads": self.store.pool.pin_threads, "pin_setup_s": self.pin_setup_s,
                "consolidate_s": self.consolidate_s,
                "early_releases_last": s.last_early_releases}

    def close(self) -> None:
        """Free the pinned buffers."""
        if hasattr(self, "store"):
            self.store.close()


class PerTensorMethod(Method):
    """verl: ``p.data = p.data.to("cpu", non_blocking=True)`` per tensor, then back."""

    name = "per_tensor"

    def setup(self, rt: Runtime, state: State) -> None:
        """Keep the tensors."""
        self.rt, self.state = rt, state
        self.device = rt.device

    def offload(self) -> None:
        """Per-tensor non-blocking D2H into (caching-allocator) pinned memory, then free the cache."""
        for t in self.tensors():
            t.data = t.data.to("cpu", non_blocking=True)
        sync(self.rt)
        self.rt.empty_cache()

    def reload(self) -> None:
        """Per-tensor non-blocking H2D."""
        for t in self.tensors():
            t.data = t.data.to(self.device, non_blocking=True)


class FreshPinMethod(Method):
    """ROLL Megatron: ``t.data = t.data.cpu().pin_memory()`` every cycle, then back."""

    name = "fresh_pin"

    def setup(self, rt: Runtime, state: State) -> None:
        """Keep the tensors."""
        self.rt, self.state = rt, state
        self.device = rt.device

    def offload(self) -> None:
        """Pageable D2H, then a fresh pinned copy, per tensor."""
        pin = self.device.type == "cuda"
        for t in self.tensors():
            host = t.data.cpu()
            t.data = host.pin_memory() if pin else host.clone()
        self.rt.empty_cache()

    def reload(self) -> None:
        """Per-tensor non-blocking H2D."""
        for t in self.tensors():
            t.data = t.data.to(self.device, non_blocking=True)


class MemorySaverMethod(Method):
    """slime/Relax: tensors in a ``torch_memory_saver`` region with CPU backup; pause/resume."""

    def __init__(self, retain_cpu_backup: bool = False) -> None:
        self.retain = retain_cpu_backup
        self.name = "memory_saver_retain" if retain_cpu_backup else "memory_saver"
        self.tag = f"bench-{self.name}-{id(self)}"
        self._tms: Any = None

    def available(self) -> tuple[bool, str]:
        """Only with CUDA and the package installed."""
        try:
            mod = importlib.import_module("torch_memory_saver")
        except Exception as e:  # noqa: BLE001 - any import failure means "not available"
            return False, f"torch_memory_saver not importable ({type(e).__name__}: {e})"
        self._tms = getattr(mod, "torch_memory_saver", None)
        if self._tms is None:
            return False, "torch_memory_saver has no torch_memory_saver singleton (unsupported version)"
        return True, ""

    def setup(self, rt: Runtime, state: State) -> None:
        """Re-create every tensor inside a region with CPU backup and drop the originals."""
        if rt.device.type != "cuda":
            raise RuntimeError("torch_memory_saver needs a CUDA device")
        tms = self._tms
        try:
            tms.hook_mode = "torch"  # no LD_PRELOAD needed; only settable before the first region
        except (AssertionError, AttributeError):  # already initialised by an earlier method: keep its mode
            pass
        self.rt = rt
        self.state = {}
        with tms.region(tag=self.tag, enable_cpu_backup=True):
            for cat, tensors in state.items():
                self.state[cat] = {}
                for name, t in tensors.items():
                    self.state[cat][name] = t.clone()
        sync(rt)
        for tensors in state.values():
            for t in tensors.values():
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        tms.retain_cpu_backup = self.retain

    def offload(self) -> None:
        """``pause(tag)``."""
        sync(self.rt)
        self._tms.pause(self.tag)
        self.rt.empty_cache()

    def reload(self) -> None:
        """``resume(tag)``."""
        self._tms.resume(self.tag)

    def close(self) -> None:
        """Drop the region's tensors and the retention policy."""
        self.state = {}
        if self._tms is not None and hasattr(self, "rt"):
            self._tms.retain_cpu_backup = False
            self.rt.empty_cache()


def line_rate(rt: Runtime, nbytes: int, repeats: int = 3, *, phase_gap_s: float = 0.0) -> dict[str, float]:
    """Median D2H and H2D GB/s of one ``nbytes`` copy between a device buffer and a pinned buffer.

    ``h2d_fresh_gbps``: H2D into a device buffer allocated after ``empty_cache``, the allocation
    included, as a reload does, ``phase_gap_s`` after the previous buffer went back to the driver;
    ``h2d_fresh_b2b_gbps``: the same right after the free, while the driver still scrubs the
    freed memory (see :mod:`bench.offload`).
    """
    dev = torch.empty(nbytes, dtype=torch.uint8, device=rt.device)
    host = rt.alloc_host(nbytes, torch.uint8, pinned=True, tag="bench.line_rate")
    try:
        out: dict[str, list[float]] = {"d2h_gbps": [], "h2d_gbps": []}
        for _ in range(repeats + 1):  # the first pair warms up
            sync(rt)
            t0 = rt.now()
            host.copy_(dev, non_blocking=True)
            sync(rt)
            t1 = rt.now()
            dev.copy_(host, non_blocking=True)
            sync(rt)
            t2 = rt.now()
            out["d2h_gbps"].append(nbytes / max(t1 - t0, 1e-9) / 1e9)
            out["h2d_gbps"].append(nbytes / max(t2 - t1, 1e-9) / 1e9)
        rates = {k: statistics.median(v[1:]) for k, v in out.items()}
        fresh: dict[str, list[float]] = {"h2d_fresh_gbps": [], "h2d_fresh_b2b_gbps": []}
        for key, gap in (("h2d_fresh_gbps", phase_gap_s), ("h2d_fresh_b2b_gbps", 0.0)):
            for _ in range(repeats):
                del dev
                rt.empty_cache()
                sync(rt)
                if gap:
                    time.sleep(gap)
                t0 = rt.now()
                dev = rt.alloc_device(nbytes, torch.uint8, tag="bench.line_rate.fresh")
                dev.copy_(host, non_blocking=True)
                sync(rt)
                fresh[key].append(nbytes / max(rt.now() - t0, 1e-9) / 1e9)
        del dev
        rates |= {k: statistics.median(v) for k, v in fresh.items()}
        return rates | {"bytes": float(nbytes), "phase_gap_s": phase_gap_s}
    finally:
        rt.free_host(host)
        rt.empty_cache()
        rt.empty_cache()


def make_method(name: str, store_variants: dict[str, StoreConfig], no_consolidate: frozenset[str] = frozenset()) -> Method:
    """A method by name: a store variant label, ``per_tensor``, ``fresh_pin``, ``memory_saver[_retain]``.

    Store variants consolidate at setup (``store.consolidate()``) unless named in ``no_consolidate``."""
    if name in store_variants:
        return StoreMethod(store_variants[name], label=name, consolidate=name not in no_consolidate)
    if name == "per_tensor":
        return PerTensorMethod()
    if name == "fresh_pin":
        return FreshPinMethod()
    if name in ("memory_saver", "memory_saver_retain"):
        return MemorySaverMethod(retain_cpu_backup=name.endswith("retain"))
    raise ValueError(f"unknown method {name!r}; store variants: {sorted(store_variants)}, baselines: "
                     f"per_tensor, fresh_pin, memory_saver, memory_saver_retain")


__all__ = [
    "FreshPinMethod",
    "MemorySaverMethod",
    "Method",
    "PerTensorMethod",
    "StoreMethod",
    "line_rate",
    "make_method",
    "rss_bytes",
    "sync",
]
