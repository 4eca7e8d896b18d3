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

import contextlib
import io
import sys
from typing import Any, Callable, Iterator, Sequence

#: columns of a table by default (``--wide``: :data:`WIDE_COLUMNS`)
COLUMNS, WIDE_COLUMNS = 100, 220

FORMAT = "timeshare/1"
UNITS = {"memory": "GiB in tables and *_gib fields, bytes in *_bytes fields", "time": "s",
         "bandwidth": "GB/s (10^9 bytes per second)"}


def envelope(command: str, data: Any, *, ok: bool = True) -> dict[str, Any]:
    """Wrap a command's result in the common envelope (see the module docstring)."""
    from refimpl import __version__

    return {"format": FORMAT, "command": command, "version": __version__, "ok": bool(ok), "units": UNITS,
            "data": data}


def wrap(text: str, *, wide: bool = False, indent: str = "") -> str:
    """``text`` wrapped to the table width (:data:`COLUMNS`, or :data:`WIDE_COLUMNS` with ``wide``)."""
    import textwrap

    return textwrap.fill(text.lstrip(), width=WIDE_COLUMNS if wide else COLUMNS, subsequent_indent=indent + "  ",
                         initial_indent=indent, break_on_hyphens=False)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, wide: bool = False, title: str | None = None,
          right: Sequence[int] = (), min_widths: dict[int, int] | None = None) -> str:
    """A plain-text table (every ``timeshare`` table goes through here: one library, rich).

    Headers carry their unit (``step (s)``, ``peak GPU (GiB)``). At most :data:`COLUMNS` columns wide
    unless ``wide`` (cells wrap to fit); the columns in ``right`` are right-aligned numbers that never wrap;
    ``min_widths`` keeps a column (by index) at least that wide.
    """
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False, show_edge=False,
              padding=(0, 1, 0, 0), collapse_padding=True)
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i in right else "left", overflow="fold", no_wrap=i in right,
                     min_width=(min_widths or {}).get(i))
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    buf = io.StringIO()
    Console(file=buf, width=WIDE_COLUMNS if wide else COLUMNS, color_system=None, force_terminal=False,
            legacy_windows=False, soft_wrap=False).print(t)
    return "\n".join(line.rstrip() for line in buf.getvalue().rstrip("\n").splitlines())


@contextlib.contextmanager
def progress_bar(total: int, what: str, *, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A progress bar with the time left on stderr (when it is a terminal); yields ``tick(label)`` to call per item.

    Off a terminal (a log file, a pipe, ``--json``) it draws nothing, so output stays clean.
    """
    if not enabled or total <= 0 or not sys.stderr.isatty():
        yield lambda _label="": None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("left"),
                  TimeRemainingColumn(), transient=True, console=None) as bar:
        task = bar.add_task(what, total=total)

        def tick(label: str = "") -> None:
            bar.update(task, advance=1, description=f"{what}: {label}"[:40] if label else what,
                       total=max(total, int(bar.tasks[0].completed) + 1))

        yield tick


__all__ = ["COLUMNS", "FORMAT", "UNITS", "WIDE_COLUMNS", "envelope", "progress_bar", "table", "wrap"]
