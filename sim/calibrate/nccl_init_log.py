"""A communicator's creation split as NCCL's own log times it: the init call, and the connection at the first collective.

With ``NCCL_DEBUG=INFO`` NCCL logs, per process, each communicator's ``ncclCommInitRankConfig ... - Init START`` and
``... - Init COMPLETE`` (bootstrap, topology, graphs: what the init call does) and, with the connections made at
the first collective (NCCL's runtime connect, the default), the channels' ``via P2P/...`` lines and then
``Connected all rings`` once every ring channel has its buffers registered with its neighbours. Lines carry a
``[seconds]`` timestamp (``NCCL_DEBUG_TIMESTAMP_FORMAT``, as the probes of ``bench/gpu/run_destroy_walk.sh`` set it).
:func:`creation_splits` reads, per communicator of two or more ranks, the init (START to COMPLETE) and the
connection (COMPLETE to the first ``Connected all rings`` after it in the same process); :func:`connect_share` is the
median share of the connection in their sum, the input of the "ring" size rule ([Note: communicator costs by
size] in :mod:`sim.presets`). A one-rank communicator connects nothing and logs no ring.

Logging at INFO slows NCCL down (each line is a write), so the log's absolute times are not the communicator's
costs; the share is what is taken from it.

    python -m sim.calibrate.nccl_init_log NCCL_LOG_OR_TGZ [...]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from sim.calibrate.records import RecordError

#: the NCCL logs of the 2 x H200 destroy-walk probes (NCCL 2.32.3, runtime connect, INFO with timestamps)
WALK_PROBE_LOGS = (
    "bench/results/2026-11-30-h200x2-walk-probes/destroy-walk/nccl-log-destroy_deferred-none.tgz",
    "bench/results/2026-11-30-h200x2-walk-probes/destroy-walk/nccl-log-destroy_deferred-tp.tgz",
)
#: :func:`connect_share` of :data:`WALK_PROBE_LOGS` (144 two-rank communicators: init 39.3 ms, connection 155.6 ms,
#: medians; ``python -m sim.calibrate.nccl_init_log``); ``tests/sim/calibrate/test_nccl_init_log.py`` reads the logs
#: again and checks it
CONNECT_SHARE_2X_H200 = 0.799
#: the ring channels of every communicator in :data:`WALK_PROBE_LOGS` (the ``coll channels`` line of each init): the
#: channels the connection share was measured at, which a channel cap scales ([Note: a communicator's channels] in
#: :mod:`sim.presets`); the same test checks it
RING_CHANNELS_2X_H200 = 24
#: :func:`per_exchange_share` of :data:`WALK_PROBE_LOGS`: the share of a two-rank connection spent one buffer-handle
#: exchange after another (48 exchanges 2.86 ms apart, median), what a channel cap scales; the rest (the proxy
#: connections set up before the first exchange, the rings' completion after the last) is kept whole. The same test
#: checks it
PER_EXCHANGE_SHARE_2X_H200 = 0.889

_INIT = re.compile(r"^\[(\d+(?:\.\d+)?)\].*ncclCommInitRank\w* comm (0x[0-9a-f]+) rank \d+ nranks (\d+) .*- Init "
                   r"(START|COMPLETE)")
_RINGS = re.compile(r"^\[(\d+(?:\.\d+)?)\].*Connected all rings")
_CHANNELS = re.compile(r".*NCCL INFO (\d+) coll channels,")
#: one exchange of a cuMem buffer's handle through the proxy (a channel's connection in one direction)
_EXCHANGE = re.compile(r"^\[(\d+(?:\.\d+)?)\].*UDS: ClientGetFd ")


@dataclass(frozen=True)
class CreationSplit:
    """One communicator's creation as its process's log times it: ``init_s`` (the init call), ``connect_s`` (from
    the init's end to its rings connected at the first collective)."""

    source: str
    comm: str
    ranks: int
    init_s: float
    connect_s: float
    #: its ring channels (the ``N coll channels`` line of its init), what a rank connects a send and a receive for;
    #: None where the log has no such line
    channels: int | None = None
    #: the buffer handles its connection exchanged through the proxy (``UDS: ClientGetFd``; NCCL_DEBUG_SUBSYS with
    #: PROXY), one per channel and direction, and the seconds from the first to the last (0 where not logged)
    exchanges: int = 0
    exchange_span_s: float = 0.0

    @property
    def per_exchange_share(self) -> float | None:
        """The share of the connection spent one handle exchange after another: the span from the first exchange to
        the last, extended by one spacing (``n / (n - 1)``), over the connection (at most 1); None with fewer than
        two exchanges logged. What a channel cap takes off in proportion ([Note: a communicator's channels])."""
        if self.exchanges < 2 or self.connect_s <= 0:
            return None
        return min(1.0, self.exchange_span_s * self.exchanges / (self.exchanges - 1) / self.connect_s)

    @property
    def connect_share(self) -> float:
        """The connection's share of the creation."""
        total = self.init_s + self.connect_s
        return self.connect_s / total if total > 0 else 0.0


def splits_in_lines(lines: Iterable[str], source: str = "log") -> list[CreationSplit]:
    """The splits of one process's log lines, in order: a communicator's ring connection is the first ``Connected all
    rings`` after its ``Init COMPLETE`` and before the next communicator's ``Init START``."""
    out: list[CreationSplit] = []
    start: dict[str, float] = {}
    channels: dict[str, int] = {}
    initing: str | None = None  # the communicator between its Init START and COMPLETE
    pending: tuple[str, int, float, float] | None = None  # comm, ranks, start, complete
    exchanges: list[float] = []  # the handle exchanges since the pending communicator's init completed
    for line in lines:
        m = _INIT.match(line)
        if m:
            t, comm, ranks, what = float(m.group(1)), m.group(2), int(m.group(3)), m.group(4)
            if what == "START":
                start[comm] = t
                initing, pending = comm, None
            elif comm in start and ranks > 1:
                pending = (comm, ranks, start[comm], t)
                initing = None
                exchanges = []
            continue
        x = _EXCHANGE.match(line)
        if x and pending is not None:
            exchanges.append(float(x.group(1)))
            continue
        c = _CHANNELS.match(line)
        if c and initing is not None:
            channels[initing] = int(c.group(1))
            continue
        r = _RINGS.match(line)
        if r and pending is not None:
            comm, ranks, t0, t1 = pending
            out.append(CreationSplit(source, comm, ranks, t1 - t0, float(r.group(1)) - t1, channels.get(comm),
                                     len(exchanges), exchanges[-1] - exchanges[0] if exchanges else 0.0))
            pending = None
    return out


def creation_splits(path: str | Path) -> list[CreationSplit]:
    """Every split in an NCCL log file, or in each ``.log`` member (one process each) of a tar archive of them."""
    from sim.calibrate.destroy_walks import nccl_log_files

    return [s for name, lines in nccl_log_files(path) for s in splits_in_lines(lines, name)]


def connect_share(splits: list[CreationSplit]) -> float:
    """The median connection share of ``splits``; refuses none (a log without timestamps, INFO or a first
    collective says nothing of the split)."""
    if not splits:
        raise RecordError("no communicator of two or more ranks with its init and its rings connected in the log "
                          "(NCCL_DEBUG=INFO with NCCL_DEBUG_TIMESTAMP_FORMAT, and a first collective, are needed)")
    return statistics.median(s.connect_share for s in splits)


def channels_in_lines(lines: Iterable[str]) -> list[int]:
    """The ``coll channels`` of every communicator whose init NCCL's INFO log lines report, in order (one-rank
    communicators too, which :func:`splits_in_lines` leaves out: they connect nothing)."""
    return [int(m.group(1)) for m in map(_CHANNELS.match, lines) if m]


def per_exchange_share(splits: list[CreationSplit]) -> float:
    """The median :attr:`CreationSplit.per_exchange_share` of ``splits``; refuses a log without the exchanges
    (NCCL_DEBUG_SUBSYS with PROXY is needed)."""
    shares = [s.per_exchange_share for s in splits if s.per_exchange_share is not None]
    if not shares:
        raise RecordError("no communicator with two or more buffer-handle exchanges in the log (UDS: ClientGetFd; "
                          "NCCL_DEBUG_SUBSYS must include PROXY)")
    return statistics.median(shares)


def summary(splits: list[CreationSplit]) -> str:
    """Per communicator size: how many, the medians of the init, the connection, their sum (the creation as the
    log times it, to set beside a preset's lazy-init constant) and the share, and the ring channels they have (the
    ring rule holds while a larger communicator has as many)."""
    rows = ["| ranks | communicators | init (median ms) | connection at the first collective (median ms) | "
            "creation (median ms) | connection share (median) | ring channels |", "|---|---|---|---|---|---|---|"]
    for n in sorted({s.ranks for s in splits}):
        same = [s for s in splits if s.ranks == n]
        chans = sorted({s.channels for s in same if s.channels is not None})
        rows.append(f"| {n} | {len(same)} | {statistics.median(s.init_s for s in same) * 1e3:.1f} | "
                    f"{statistics.median(s.connect_s for s in same) * 1e3:.1f} | "
                    f"{statistics.median(s.init_s + s.connect_s for s in same) * 1e3:.1f} | "
                    f"{connect_share(same):.3f} | {', '.join(map(str, chans)) or 'not logged'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """CLI: the splits of the given logs (default: the 2 x H200 destroy-walk probes' logs) as a table."""
    ap = argparse.ArgumentParser(description="A communicator's creation split into the init call and the "
                                 "connection at its first collective, from NCCL's INFO log")
    ap.add_argument("logs", nargs="*", help="NCCL log files or .tgz archives of them (default: the 2 x H200 "
                    "destroy-walk probes' logs in the repository)")
    a = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    paths = a.logs or [str(root / p) for p in WALK_PROBE_LOGS]
    try:
        splits = [s for p in paths for s in creation_splits(p)]
        connect_share(splits)
    except RecordError as e:
        print(f"sim.calibrate.nccl_init_log: {e}", file=sys.stderr)
        return 2
    print(summary(splits))
    return 0


__all__ = ["CONNECT_SHARE_2X_H200", "PER_EXCHANGE_SHARE_2X_H200", "RING_CHANNELS_2X_H200", "CreationSplit",
           "WALK_PROBE_LOGS", "channels_in_lines", "connect_share", "creation_splits", "per_exchange_share",
           "splits_in_lines", "summary", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
