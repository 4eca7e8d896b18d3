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


class ProgressBar:
    """A progress bar with the time left (rich), drawn on stderr while stderr is a terminal; a no-op otherwise.

    Off a terminal (a log file, a pipe) and when not ``enabled`` (``--quiet``, ``--json``) it draws nothing, so
    output stays clean; stdout is never touched. The bar is transient: it is gone from the terminal when the work
    ends. Use as a context manager; call :meth:`advance` per item done or :meth:`update` with a count.
    """

    def __init__(self, what: str, total: int, *, enabled: bool = True, stream: Any = None):
        self.what, self.total = what, max(int(total), 0)
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.drawing = bool(enabled and callable(isatty) and isatty())
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> "ProgressBar":
        if self.drawing:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("time left"), TimeRemainingColumn(), transient=True,
                                 console=Console(file=self.stream, stderr=True))
            self._bar.__enter__()
            self._task = self._bar.add_task(self.what, total=self.total or None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    def _describe(self, label: str) -> str:
        return f"{self.what}: {label}"[:48] if label else self.what

    def advance(self, n: int = 1, label: str = "") -> None:
        """``n`` more items done (the total grows if the count passes it, so the bar never overflows)."""
        if self._bar is None:
            return
        done = int(self._bar.tasks[0].completed) + n
        self._bar.update(self._task, completed=done, description=self._describe(label),
                         total=max(self.total, done) or None)

    def update(self, completed: int, total: int | None = None, label: str = "") -> None:
        """Set the count done (and the total, when it became known or changed)."""
        if self._bar is None:
            return
        if total is not None:
            self.total = max(int(total), 0)
        self._bar.update(self._task, completed=completed, description=self._describe(label),
                         total=max(self.total, completed) or None)


@contextlib.contextmanager
def progress_bar(total: int, what: str, *, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """A :class:`ProgressBar` over ``total`` items; yields ``tick(label)`` to call once per item done."""
    with ProgressBar(what, total, enabled=enabled and total > 0) as bar:
        yield lambda label="": bar.advance(1, label)


__all__ = ["COLUMNS", "FORMAT", "ProgressBar", "UNITS", "WIDE_COLUMNS", "envelope", "progress_bar", "table", "wrap"]
