"""One JSON output convention for ``timeshare sim run``, ``bench`` and ``plan``.

Every JSON document a ``timeshare`` command prints with ``--json`` (or writes as its result
file) is an envelope::

    {"format": "timeshare/1", "command": "plan", "version": "0.1.0", "ok": true,
     "units": {"memory": "GiB in tables, bytes in *_bytes fields", "time": "s", "bandwidth": "GB/s"},
     "data": {...}}

``data`` is the command's own result (documented with each command). Field names say their
unit where it is not seconds: ``*_bytes`` are bytes, ``*_gib`` GiB, ``*_gbps`` GB/s; plain
times (``*_s``) are seconds.
"""
from __future__ import annotations

from typing import Any

FORMAT = "timeshare/1"
UNITS = {"memory": "GiB in tables and *_gib fields, bytes in *_bytes fields", "time": "s",
         "bandwidth": "GB/s (10^9 bytes per second)"}


def envelope(command: str, data: Any, *, ok: bool = True) -> dict[str, Any]:
    """Wrap a command's result in the common envelope (see the module docstring)."""
    from refimpl import __version__

    return {"format": FORMAT, "command": command, "version": __version__, "ok": bool(ok), "units": UNITS,
            "data": data}


__all__ = ["FORMAT", "UNITS", "envelope"]
