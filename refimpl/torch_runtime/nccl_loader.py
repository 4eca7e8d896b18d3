"""Which NCCL library is loaded in this process: ``/proc/self/maps`` and the global symbol table.

torch reports the NCCL version it was *built* with; with another ``libnccl.so.2``
in ``LD_PRELOAD`` the process runs a different one. So the library is found
where it is mapped: every ``libnccl.so*`` in ``/proc/self/maps``; if several are
mapped, the one that owns the process-wide ``ncclGetVersion`` symbol (where
torch's calls bind); if none is mapped but that symbol exists (NCCL linked
statically and exported), the process itself. The file is opened with
``RTLD_NOLOAD``, so a second copy is never loaded. No torch here.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger(__name__)

MIN_SUSPEND_VERSION: tuple[int, int, int] = (2, 29, 7)
"""First NCCL release with ``ncclCommSuspend`` / ``ncclCommResume`` / ``ncclCommMemStats``."""

_LIBNCCL_RE = re.compile(r"(^|/)libnccl\.so(\.\d+)*$")


class NcclNotLoadedError(RuntimeError):
    """No NCCL library is loaded in this process, so there is nothing to query or call."""


# --------------------------------------------------------------------------- versions


def decode_version(code: int) -> tuple[int, int, int]:
    """``NCCL_VERSION_CODE`` -> ``(major, minor, patch)``.

    NCCL encodes ``X*1000 + Y*100 + Z`` up to 2.8 and ``X*10000 + Y*100 + Z`` after.
    """
    if code <= 0:
        raise ValueError(f"not an NCCL version code: {code}")
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


def format_version(version: Sequence[int]) -> str:
    """``(2, 29, 7)`` -> ``"2.29.7"``."""
    return ".".join(str(v) for v in version)


# --------------------------------------------------------------------------- finding the library


@dataclass(frozen=True)
class MappedRegion:
    """One file-backed region of ``/proc/self/maps``."""

    start: int
    end: int
    path: str


def parse_maps(text: str) -> list[MappedRegion]:
    """The file-backed regions of a ``/proc/<pid>/maps`` text, in address order."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        lo, _, hi = parts[0].partition("-")
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        out.append(MappedRegion(int(lo, 16), int(hi, 16), path))
    return out


def mapped_libraries(maps: Sequence[MappedRegion], pattern: re.Pattern[str] = _LIBNCCL_RE) -> list[str]:
    """Distinct paths matching ``pattern`` among ``maps``, in first-mapped order."""
    seen: dict[str, None] = {}
    for m in maps:
        if pattern.search(m.path):
            seen.setdefault(m.path, None)
    return list(seen)


def owner_of(address: int, maps: Sequence[MappedRegion]) -> str | None:
    """Path of the file whose mapping contains ``address``, if any."""
    for m in maps:
        if m.start <= address < m.end:
            return m.path
    return None


def _read_maps() -> list[MappedRegion]:
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            return parse_maps(f.read())
    except OSError:  # not Linux: fall back to the global symbol lookup only
        return []


def _global_symbol_address(name: str) -> int | None:
    try:
        fn = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def open_loaded(path: str) -> ctypes.CDLL:
    """``dlopen`` a library that is already mapped, without loading a second copy."""
    noload = getattr(os, "RTLD_NOLOAD", 0)
    try:
        return ctypes.CDLL(path, mode=noload | os.RTLD_LAZY)
    except OSError:
        # RTLD_NOLOAD matches by name or inode; a path spelled differently in maps still
        # names the mapped file, so opening it takes another reference to the same object.
        log.debug("RTLD_NOLOAD open of %s failed; opening it normally", path)
        return ctypes.CDLL(path)


def find_loaded_nccl() -> tuple[str, ctypes.CDLL]:
    """Path and handle of the NCCL library this process's NCCL calls go to.

    Raises :class:`NcclNotLoadedError` when none is loaded.
    """
    maps = _read_maps()
    candidates = mapped_libraries(maps)
    global_addr = _global_symbol_address("ncclGetVersion")
    if len(candidates) > 1:
        owner = owner_of(global_addr, maps) if global_addr else None
        chosen = owner if owner in candidates else candidates[0]
        log.warning("several NCCL libraries are mapped (%s); using %s", ", ".join(candidates), chosen)
        return chosen, open_loaded(chosen)
    if candidates:
        return candidates[0], open_loaded(candidates[0])
    if global_addr:
        owner = owner_of(global_addr, maps) or "<process global namespace>"
        return owner, ctypes.CDLL(None)
    raise NcclNotLoadedError(
        "no NCCL library is loaded in this process (no libnccl.so in /proc/self/maps and no "
        "ncclGetVersion symbol): import a CUDA build of torch (or create an NCCL process group) "
        "before checking NCCL; CPU-only builds have no NCCL"
    )


__all__ = [
    "MIN_SUSPEND_VERSION",
    "MappedRegion",
    "NcclNotLoadedError",
    "decode_version",
    "find_loaded_nccl",
    "format_version",
    "mapped_libraries",
    "open_loaded",
    "owner_of",
    "parse_maps",
]
