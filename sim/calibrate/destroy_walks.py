"""Where a measured switch window's destroy walks spend their time.

A multigpu record (``bench/gpu/multigpu.py``) keeps two views of the lifecycle's
destroy walks on real GPUs:

* ``switch_window.spans``: every lifecycle span (``[name, start s, duration s]``)
  of every step, per policy and per rank. A destroy walk is a
  ``lifecycle.destroy`` span (the destroying policies) or a
  ``lifecycle.plan.apply`` span (``SUSPEND_PLANNED``); it lies in the pause
  (``sleep``) or in the weight sync (``update_weights``).
  :func:`walks_from_spans` lists them with the time from the step's pause
  (``after_pause``): the training step's collectives, the lazy NCCL inits of
  every group the walk destroys, returned right before the pause, so
  ``after_pause`` is how long after the last init the walk ended.
* ``comm_raw.mesh_walk``: per rank, the same 14 groups created, first used one
  after the other (``first_collective_s``) and destroyed in the lifecycle's
  order (``destroy_s``). :func:`replay_mesh_walk` replays that walk with the
  simulator's rule, a destroy waiting for its communicator's next NCCL proxy
  poll timeout ([Note: the proxy's 500 ms poll] in :mod:`sim.presets`), and the
  destroy costs of a preset, so the rule is checked group by group on
  measurements it was not fitted to.

[Note: one poll period more] Under the proxy-poll rule a walk over groups the
training step initialised one after the other ends a whole number of poll
periods after the last init, plus the last destroy's cost: each group's timeout
falls ``proxy_poll`` apart from its own init, and the walk visits the groups in
the order they were initialised. ``after_pause / proxy_poll`` (rounded down) is
that number (:attr:`DestroyWalk.periods`): 3 for a walk of 1.51 s, 4 for one of
2.01 s. The simulator gives 3 for every such walk of the 2 x H200 records.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sim.calibrate.records import RecordError

log = logging.getLogger(__name__)

#: lifecycle spans that are destroy walks (one per walk, around every group's destroy)
WALK_SPANS = ("lifecycle.destroy", "lifecycle.plan.apply")


@dataclass(frozen=True)
class DestroyWalk:
    """One destroy walk of one rank in one RL step, from the lifecycle's spans (seconds, the rank's clock)."""

    policy: str
    rank: int
    #: RL step, counted from 0 by the step's pause
    step: int
    #: ``sleep`` (in the pause) or ``update_weights`` (in the weight sync)
    phase: str
    start: float
    duration: float
    #: walk end minus the step's pause start: the training step's collectives (the inits of the groups a pause walk,
    #: or a SUSPEND_PLANNED sync walk, destroys) returned right before the pause
    after_pause: float
    #: walk end minus the weight sync's start (walks in ``update_weights``; None in ``sleep``)
    after_sync_start: float | None
    #: the weight sync rebuilt groups before this walk (DESTROY/DESTROY_DEFERRED: its groups are not the training
    #: step's, so ``after_pause`` says nothing about their inits)
    rebuilt_first: bool

    def periods(self, poll_s: float = 0.5) -> int:
        """Whole proxy poll periods between the training step's last init and the walk's end ([Note: one poll
        period more] in this module)."""
        return math.floor(self.after_pause / poll_s)


def _spans(data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    sw = data.get("switch_window")
    spans = sw.get("spans") if isinstance(sw, Mapping) else None
    if not isinstance(spans, Mapping) or not spans:
        raise RecordError(f"{where}: no switch_window.spans (bench/gpu/multigpu.py records them since its "
                              "second 2 x H200 run of 2026-11-30); use a record that has them")
    return spans


def walks_from_spans(data: Mapping[str, Any], where: str = "record") -> list[DestroyWalk]:
    """Every destroy walk of every policy, rank and step in a multigpu record's ``switch_window.spans``."""
    out: list[DestroyWalk] = []
    for policy, per_rank in _spans(data, where).items():
        if not isinstance(per_rank, list):
            raise RecordError(f"{where}: switch_window.spans.{policy}: expected a list per rank")
        for rank, rows in enumerate(per_rank):
            try:
                spans = sorted(((str(n), float(a), float(d)) for n, a, d in rows), key=lambda s: s[1])
            except (TypeError, ValueError):
                raise RecordError(f"{where}: switch_window.spans.{policy}[{rank}]: expected [name, start, "
                                      "duration] rows") from None
            out.extend(_rank_walks(policy, rank, spans))
    return out


def _rank_walks(policy: str, rank: int, spans: list[tuple[str, float, float]]) -> list[DestroyWalk]:
    pauses = [s for s in spans if s[0] == "lifecycle.pause"]
    syncs = [s for s in spans if s[0] == "lifecycle.weight_sync"]
    out = []
    for step, (_, p0, pdur) in enumerate(pauses):
        sync = next((s for s in syncs if s[1] >= p0 + pdur - 1e-9), None)
        step_end = sync[1] + sync[2] if sync else p0 + pdur
        for name, a, d in spans:
            if name not in WALK_SPANS or not (p0 <= a <= step_end):
                continue
            in_sync = sync is not None and a >= sync[1]
            rebuilt = in_sync and any(n == "lifecycle.rebuild" and sync[1] <= b < a for n, b, _ in spans)
            out.append(DestroyWalk(policy=policy, rank=rank, step=step, phase="update_weights" if in_sync else "sleep",
                                   start=a, duration=d, after_pause=a + d - p0,
                                   after_sync_start=(a + d - sync[1]) if in_sync else None, rebuilt_first=rebuilt))
    return out


def training_walks(walks: Sequence[DestroyWalk]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """``(policy, phase) -> [(step, slowest rank's after_pause)]`` for the walks over the training step's groups
    (every walk but those after a rebuild in the same weight sync)."""
    by: dict[tuple[str, str, int], float] = {}
    for w in walks:
        if not w.rebuilt_first:
            key = (w.policy, w.phase, w.step)
            by[key] = max(by.get(key, 0.0), w.after_pause)
    out: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for (policy, phase, step), after in sorted(by.items()):
        out.setdefault((policy, phase), []).append((step, after))
    return out


# --------------------------------------------------------------------------- the mesh walk


@dataclass(frozen=True)
class MeshDestroy:
    """One group's destroy in ``comm_raw.mesh_walk``: measured and replayed with the proxy-poll rule (seconds)."""

    rank: int
    group: str
    size: int
    member: bool
    measured: float
    predicted: float


def replay_mesh_walk(rows: Sequence[Mapping[str, Any]], *, poll_s: float, destroy_s: Mapping[int, float],
                     rank: int = 0, gap_s: float = 0.0) -> list[MeshDestroy]:
    """Replay one rank's mesh walk: the member groups' first collectives one after the other (their inits, as
    measured), then every group destroyed in order, ``gap_s`` after the last init.

    A member's destroy waits for its communicator's next poll timeout (``poll_s`` apart from the end of its init)
    and then takes ``destroy_s[size]``; a non-member's (no communicator on this rank) takes what it measured.
    """
    inits: dict[str, float] = {}
    t = 0.0
    for i, g in enumerate(rows):
        if not isinstance(g, Mapping) or "name" not in g or "destroy_s" not in g:
            raise RecordError(f"mesh_walk[{rank}].groups[{i}]: expected name, size, member, destroy_s")
        if g.get("member"):
            if "first_collective_s" not in g:
                raise RecordError(f"mesh_walk[{rank}].groups[{i}] ({g['name']}): a member needs first_collective_s")
            t += float(g["first_collective_s"])
            inits[str(g["name"])] = t
    t += gap_s
    out = []
    for g in rows:
        size = int(g.get("size", 1))
        start = t
        if g.get("member"):
            if size not in destroy_s:
                raise RecordError(f"mesh_walk[{rank}]: no destroy cost for groups of {size} rank(s)")
            t += (inits[str(g["name"])] - t) % poll_s + destroy_s[size]
        else:
            t += float(g["destroy_s"])
        out.append(MeshDestroy(rank, str(g["name"]), size, bool(g.get("member")), float(g["destroy_s"]), t - start))
    return out


def mesh_walks(data: Mapping[str, Any], where: str = "record") -> list[list[Mapping[str, Any]]]:
    """Each rank's ``comm_raw.mesh_walk`` groups."""
    raw = data.get("comm_raw")
    mesh = raw.get("mesh_walk") if isinstance(raw, Mapping) else None
    if not isinstance(mesh, list) or not mesh or any(not isinstance(m, Mapping) or "groups" not in m for m in mesh):
        raise RecordError(f"{where}: no comm_raw.mesh_walk (bench/gpu/multigpu.py records it since its "
                              "second 2 x H200 run of 2026-11-30); use a record that has it")
    return [list(m["groups"]) for m in mesh]


def replay_record(data: Mapping[str, Any], topology: str, where: str = "record") -> list[MeshDestroy]:
    """Every rank's mesh walk replayed with ``topology``'s proxy poll and destroy costs (no constant fitted here)."""
    from sim.machine.topology import Topology

    comm = Topology.from_preset(topology).comm
    if comm.proxy_poll_s <= 0:
        raise RecordError(f"preset {topology!r} does not simulate the proxy poll; use calibrated/hgx-h200-8x")
    costs = {1: comm.for_size(1).destroy_s, 2: comm.for_size(2).destroy_s}
    out = []
    for rank, rows in enumerate(mesh_walks(data, where)):
        sizes = {int(g.get("size", 1)) for g in rows}
        costs.update({s: comm.for_size(s).destroy_s for s in sizes})
        out.extend(replay_mesh_walk(rows, poll_s=comm.proxy_poll_s, destroy_s=costs, rank=rank))
    log.debug("%s: mesh walk replayed on %s with destroy costs %s", where, topology, costs)
    return out


# --------------------------------------------------------------------------- the destroy-walk probe


@dataclass(frozen=True)
class ProbeDestroy:
    """One destroy in a ``bench/gpu/destroy_walk_probe.py`` record, against its group's collectives (seconds)."""

    rank: int
    walk: int
    group: str
    start: float
    end: float
    #: the destroy's end minus the group's first collective since it was (re)built (its lazy init); None: never used
    since_init: float | None
    #: the destroy's end minus the group's last collective; None: never used
    since_last: float | None

    def periods(self, poll_s: float = 0.5) -> int | None:
        """Whole proxy poll periods from the group's init to the destroy's end (None: never initialised)."""
        return None if self.since_init is None else math.floor(self.since_init / poll_s)


def _probe_events(data: Mapping[str, Any], where: str) -> list[list]:
    """Each rank's ``[kind, group, time]`` events of a destroy-walk probe record; RecordError names what is wrong."""
    ranks = data.get("ranks")
    if data.get("kind") != "destroy_walk_probe" or not isinstance(ranks, list):
        raise RecordError(f"{where}: not a bench/gpu/destroy_walk_probe.py record (kind destroy_walk_probe, ranks)")
    out = []
    for rank, r in enumerate(ranks):
        events = r.get("events") if isinstance(r, Mapping) else None
        if not isinstance(events, list):
            raise RecordError(f"{where}: ranks[{rank}].events: expected [kind, group, time] rows")
        out.append(events)
    return out


def probe_destroys(data: Mapping[str, Any], where: str = "record", control: str = "control") -> list[ProbeDestroy]:
    """Every destroy of a destroy-walk probe record, numbered by walk: a walk is the destroys between two of the
    lifecycle's agreements (collectives on the group whose name ends with ``control``)."""
    out: list[ProbeDestroy] = []
    for rank, events in enumerate(_probe_events(data, where)):
        init: dict[str, float] = {}
        last: dict[str, float] = {}
        started: dict[str, float] = {}
        walk, in_walk = 0, False
        for kind, group, t in events:
            if kind == "collective":
                if str(group).endswith(control):
                    if in_walk:
                        walk, in_walk = walk + 1, False
                    continue
                init.setdefault(group, t)
                last[group] = t
            elif kind == "destroy_start":
                started[group], in_walk = t, True
            elif kind == "destroy_end" and group in started:
                i, l = init.pop(group, None), last.pop(group, None)
                out.append(ProbeDestroy(rank, walk, str(group), started.pop(group), t,
                                        None if i is None else t - i, None if l is None else t - l))
    return out


def init_passes(data: Mapping[str, Any], where: str = "record", control: str = "control") -> list[list[dict[str, float]]]:
    """Per rank of a destroy-walk probe record, its training steps' init passes: for each pass in which every group of
    the rank ran its first collective since it was (re)built (its lazy NCCL init), ``{group: when that collective
    returned}`` (host seconds). A pass ends at a destroy or at a group's second collective."""
    out = []
    for events in _probe_events(data, where):
        passes: list[dict[str, float]] = []
        cur: dict[str, float] = {}
        for kind, group, t in events:
            if kind == "collective" and not str(group).endswith(control):
                if group in cur:
                    passes.append(cur)
                    cur = {}
                cur[str(group)] = float(t)
            elif kind == "destroy_start" and cur:
                passes.append(cur)
                cur = {}
        if cur:
            passes.append(cur)
        full = max((len(p) for p in passes), default=0)
        out.append([p for p in passes if len(p) == full and full > 1])
    return out


def poll_phase_spread(data: Mapping[str, Any], where: str = "record") -> tuple[float, str]:
    """How far the proxy poll phases of a rank's communicators move against one another from step to step: the range,
    over the record's full init passes (:func:`init_passes`), of the time from the pass's first init to its last,
    the largest over ranks; and a sentence saying what it was computed from. [Note: one poll period more]"""
    worst, how = -1.0, ""
    for rank, passes in enumerate(init_passes(data, where)):
        if len(passes) < 2:
            continue
        spans = [max(p.values()) - min(p.values()) for p in passes]
        if max(spans) - min(spans) > worst:
            worst = max(spans) - min(spans)
            how = (f"rank {rank}: {len(passes)} init passes of {len(passes[0])} groups took "
                   f"{min(spans):.3f}-{max(spans):.3f} s from first to last init")
    if worst < 0:
        raise RecordError(f"{where}: no rank has two full init passes (every group's first collective) to compare")
    return worst, how


def late_walks(data: Mapping[str, Any], where: str = "record", poll_s: float = 0.5) -> tuple[int, int, str]:
    """``(late, walks, how)`` of a destroy-walk probe record: of its walks over every group the training step had
    just initialised (the walks with the most initialised destroys), slowest rank per walk, how many took more than
    half a poll period longer than the record's median such walk (a whole period late: [Note: one poll period
    more]). What ``timeshare sim calibrate`` fits the late-walk rate on."""
    destroys = probe_destroys(data, where)
    walks: dict[int, dict[int, list[ProbeDestroy]]] = {}
    for d in destroys:
        walks.setdefault(d.walk, {}).setdefault(d.rank, []).append(d)
    used = {w: max(sum(d.since_init is not None for d in ds) for ds in by_rank.values()) for w, by_rank in walks.items()}
    full = max(used.values(), default=0)
    if full < 2:
        raise RecordError(f"{where}: no walk destroys two or more initialised groups; no late walks to count")
    slowest = [max(ds[-1].end - ds[0].start for ds in walks[w].values()) for w in sorted(walks) if used[w] == full]
    median = statistics.median(slowest)
    late = sum(t > median + poll_s / 2 for t in slowest)
    return late, len(slowest), (f"{late} of {len(slowest)} walks over the {full} groups just initialised took over "
                                f"{median + poll_s / 2:.3f} s (median {median:.3f} s + half a period)")


def probe_report(data: Mapping[str, Any], where: str = "record", poll_s: float = 0.5) -> list[str]:
    """Per rank and walk of a probe record: its destroys, duration, and the destroys that waited one poll period
    more after their init than the walk's first initialised one (the missed timeouts)."""
    lines = []
    destroys = probe_destroys(data, where)
    for rank, walk in sorted({(d.rank, d.walk) for d in destroys}):
        mine = [d for d in destroys if d.rank == rank and d.walk == walk]
        used = [d for d in mine if d.periods(poll_s) is not None]
        line = f"rank {rank} walk {walk}: {len(mine)} destroys, {mine[-1].end - mine[0].start:.3f} s"
        if used:
            first = used[0].periods(poll_s)
            late = [d for d in used if d.periods(poll_s) > first]
            line += (f"; {len(used)} of initialised groups, the first ending {first} poll period(s) after its init"
                     + (f"; one period more from {late[0].group} on (it ended {late[0].since_init:.3f} s after its init, "
                        f"{late[0].since_last:.3f} s after its last collective)" if late else ""))
        lines.append(line)
    return lines


#: one NCCL log line with ``NCCL_DEBUG_TIMESTAMP_FORMAT="[%s.%6f] "``: time, host, pid, tid, message
_NCCL_LINE = re.compile(r"\[(\d+\.\d+)\] [^:\s]+:(\d+):(\d+) \[\d+\] NCCL INFO (.*)")


@dataclass(frozen=True)
class UdsThread:
    """One communicator's UDS proxy thread in an NCCL log: when it started, served requests and exited (seconds)."""

    pid: int
    tid: int
    started: float
    requests: tuple[float, ...]
    exited: float | None

    def exit_after_last_activity(self) -> float | None:
        """Seconds from the thread's start or last request, whichever is later, to its exit (None: no exit)."""
        return None if self.exited is None else self.exited - max((self.started, *self.requests))


def uds_threads(lines: Iterable[str]) -> list[UdsThread]:
    """The UDS proxy threads of an NCCL log written with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY`` and
    ``NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT="[%s.%6f] "`` (``bench/gpu/run_destroy_walk.sh``):
    a thread starts at ``[Proxy Service UDS] Device``, serves ``proxyUDSRecvReq`` requests, and logs its exit."""
    started: dict[tuple[int, int], float] = {}
    requests: dict[tuple[int, int], list[float]] = {}
    exited: dict[tuple[int, int], float] = {}
    for line in lines:
        m = _NCCL_LINE.match(line)
        if not m:
            continue
        t, key, msg = float(m[1]), (int(m[2]), int(m[3])), m[4]
        if msg.startswith("[Proxy Service UDS] Device"):
            started[key] = t
        elif msg.startswith("proxyUDSRecvReq"):
            requests.setdefault(key, []).append(t)
        elif msg.startswith("[Proxy Service UDS] exit"):
            exited[key] = t
    return [UdsThread(pid, tid, t0, tuple(requests.get((pid, tid), ())), exited.get((pid, tid)))
            for (pid, tid), t0 in sorted(started.items(), key=lambda kv: kv[1])]


@dataclass(frozen=True)
class DestroyGap:
    """From one destroy's UDS proxy thread exit to the next destroy's proxy stop, in one process (seconds): the first
    destroy's work after its join and the next one's before its stop, no poll wait in it."""

    pid: int
    #: ranks of the communicator whose thread exited, and of the next one (2: its proxy closed peer connections)
    size: int
    next_size: int
    seconds: float


#: a gap longer than this is not inside one walk (an agreement, a step, a training phase in between)
WALK_GAP_S = 0.2


def destroy_gaps(lines: Iterable[str]) -> list[DestroyGap]:
    """[Note: a destroy's own cost, from NCCL's log] ``ncclCommDestroy`` stops the communicator's proxy (the service
    thread logs ``Received and initiated operation=Stop``; a multi-rank one first ``operation=Close`` for each peer
    connection) and joins its UDS thread, which exits (``[Proxy Service UDS] exit``) at its next poll timeout. What
    follows the exit, to the next destroy's stop in a walk, is the rest of the first destroy and the start of the
    next: the destroy's own cost without the poll wait, which the simulator charges as ``destroy``. Gaps over
    :data:`WALK_GAP_S` (the walk's end) are left out."""
    by_pid: dict[int, list[tuple[str, float, int]]] = {}
    closes: dict[int, int] = {}
    for line in lines:
        m = _NCCL_LINE.match(line)
        if not m:
            continue
        t, pid, msg = float(m[1]), int(m[2]), m[4]
        if msg.startswith("Received and initiated operation=Close"):
            closes[pid] = closes.get(pid, 0) + 1
        elif msg.startswith("Received and initiated operation=Stop"):
            by_pid.setdefault(pid, []).append(("stop", t, 2 if closes.pop(pid, 0) else 1))
        elif msg.startswith("[Proxy Service UDS] exit"):
            by_pid.setdefault(pid, []).append(("exit", t, 0))
    out = []
    for pid, ev in sorted(by_pid.items()):
        for a, b, c in zip(ev, ev[1:], ev[2:]):
            if a[0] == "stop" and b[0] == "exit" and c[0] == "stop" and 0 <= c[1] - b[1] < WALK_GAP_S:
                out.append(DestroyGap(pid, a[2], c[2], c[1] - b[1]))
    return out


def proxy_leads(lines: Iterable[str]) -> dict[int, list[float]]:
    """``{size: [seconds]}``: for each communicator initialised in an NCCL log, how long before the end of its init
    its UDS proxy thread last served a request (or started, if it served none), where its poll periods begin. The
    end of a one-rank init is its ``Init COMPLETE`` line (its first collective then runs at once, with no peer to
    connect); a multi-rank communicator connects at its first collective, so its end is ``Connected all rings``."""
    out: dict[int, list[float]] = {1: [], 2: []}
    last: dict[tuple[int, int], float] = {}
    current: dict[int, tuple[int, int]] = {}
    for line in lines:
        m = _NCCL_LINE.match(line)
        if not m:
            continue
        t, pid, tid, msg = float(m[1]), int(m[2]), int(m[3]), m[4]
        if msg.startswith("[Proxy Service UDS] Device"):
            last[pid, tid] = t
            current[pid] = (pid, tid)
        elif msg.startswith("proxyUDSRecvReq") and (pid, tid) in last:
            last[pid, tid] = t
        elif pid in current and "Init COMPLETE" in msg and " nranks 1 " in msg:
            out[1].append(t - last[current[pid]])
        elif pid in current and msg.startswith("Connected all rings"):
            out[2].append(t - last[current[pid]])
    return {k: v for k, v in out.items() if v}


def destroy_costs(gaps: Sequence[DestroyGap]) -> dict[int, tuple[float, int]]:
    """``{size: (seconds, n)}``: a destroy's own cost by communicator size (1, 2), the median of the gaps between
    destroys of that size ([Note: a destroy's own cost, from NCCL's log]); a size with no such pair is left out."""
    out = {}
    for size in (1, 2):
        same = [g.seconds for g in gaps if g.size == g.next_size == size]
        if same:
            out[size] = (statistics.median(same), len(same))
    return out


def nccl_log_files(path: str | Path) -> list[tuple[str, list[str]]]:
    """(name, lines) of an NCCL log file, or of every ``.log`` member of a tar archive of them (one process each;
    a member is named ``archive:member``)."""
    import tarfile

    path = Path(path)
    try:
        if path.name.endswith((".tgz", ".tar.gz")):
            with tarfile.open(path) as tar:
                return [(f"{path.name}:{m.name}", tar.extractfile(m).read().decode(errors="replace").splitlines())
                        for m in tar.getmembers() if m.isfile() and m.name.endswith(".log")]
        return [(path.name, path.read_text(errors="replace").splitlines())]
    except (OSError, tarfile.TarError) as exc:
        raise RecordError(f"{path}: cannot read it as an NCCL log or an archive of them ({exc})") from None


def nccl_log_lines(path: str | Path) -> list[str]:
    """Every line of an NCCL log file, or of every ``.log`` member of a tar archive of them, in order."""
    return [line for _, lines in nccl_log_files(path) for line in lines]


def uds_report(threads: Sequence[UdsThread], poll_s: float = 0.5) -> str:
    """How the UDS threads' exits fall against their poll: each exit comes a whole number of poll periods after the
    thread's last activity (start or request), plus what the kernel's timer adds. [Note: the proxy's 500 ms poll]"""
    done = [th for th in threads if th.exited is not None]
    if not done:
        return "no UDS proxy thread exit in the log"
    after = [th.exit_after_last_activity() for th in done]
    periods = [round(a / poll_s) for a in after]
    late = [(a - k * poll_s) * 1e3 for a, k in zip(after, periods)]
    served = sum(1 for th in done if th.requests)
    return (f"{len(done)} UDS proxy threads exited ({served} had served requests): each {min(periods)}-{max(periods)} "
            f"whole {poll_s * 1e3:g} ms poll periods after its last activity, plus {min(late):.2f}-{max(late):.2f} ms")


# --------------------------------------------------------------------------- the idle-destroy probe, simulated


def simulate_idle_destroys(topology: str, *, groups: int, idle_s: float, phase_s: float,
                           wake_proxies: bool = False) -> list[float]:
    """``bench/gpu/idle_destroy_probe.py`` on one simulated GPU of ``topology``: ``groups`` one-rank groups created,
    each first used (its lazy init) one after the other, ``idle_s + phase_s`` idle, then destroyed one by one;
    each destroy's seconds. Without the proxy waker (the probe destroys with ``dist.destroy_process_group``) the
    first waits for its communicator's next poll timeout, and each next one the spacing of the inits, as long as
    that is longer than a destroy's own cost ([Note: a destroy, with and without the proxy waker] in
    :mod:`sim.machine.collectives`)."""
    import torch

    from refimpl.runtime import GroupSpec, ReduceOp
    from sim.machine.collectives import NcclComm, TopologyCollectiveCost
    from sim.machine.topology import Topology
    from sim.presets import first_gpus, load_preset_data
    from sim.world import SimWorld

    topo = Topology(first_gpus(load_preset_data(topology), 1), where=f"preset {topology!r}, one GPU")
    world = SimWorld(1, trace=False, collective_cost=TopologyCollectiveCost(topo),
                     comm=NcclComm(topo, lazy_init=True, init_at_collective=True, proxy_wake=wake_proxies))

    async def probe(rt):
        names = [f"g{i}" for i in range(groups)]
        for name in names:
            await rt.new_group(GroupSpec(name, (0,), backend="nccl"))
        for name in names:
            await rt.all_reduce(torch.ones(1), ReduceOp.SUM, name)
        await rt.sleep(idle_s + phase_s)
        out = []
        for name in names:
            t0 = rt.now()
            await rt.destroy_group(name)
            out.append(rt.now() - t0)
        return out

    return world.run(probe)[0]


# --------------------------------------------------------------------------- command line


def report(path: str | Path, topology: str = "calibrated/hgx-h200-8x") -> str:
    """The text ``python -m sim.calibrate.destroy_walks RECORD`` prints: the record's walks, and its mesh walk replayed; for an
    NCCL log (``.log``, or a ``.tgz`` of them as ``bench/gpu/run_destroy_walk.sh`` writes) :func:`uds_report`."""
    path = Path(path)
    if path.name.endswith((".log", ".tgz", ".tar.gz")):
        lines = nccl_log_lines(path)
        costs = destroy_costs(destroy_gaps(lines))
        own = "; ".join(f"{k}-rank {v * 1e3:.1f} ms (median of {n})" for k, (v, n) in costs.items())
        lead = "; ".join(f"{k}-rank {statistics.median(v) * 1e3:.1f} ms (median of {len(v)})"
                         for k, v in proxy_leads(lines).items())
        return (f"{path}: " + uds_report(uds_threads(lines))
                + (f"\n  a destroy's own cost, from each UDS exit to the next destroy's proxy stop: {own}" if own else "")
                + (f"\n  the proxy thread's last request before the end of its init: {lead}" if lead else ""))
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RecordError(f"{path}: cannot read it as JSON ({exc})") from None
    where = str(path)
    if isinstance(data, Mapping) and data.get("kind") == "destroy_walk_probe":
        return "\n".join([f"{where}: {data.get('policy')} (weight sync collective: {data.get('sync', 'tp')}), each "
                          "destroy walk per rank"] + probe_report(data, where))
    lines = [f"{where}: destroy walks over the groups the training step initialised, slowest rank; time from the "
             "pause (the training step's last init) to the walk's end, and whole 0.5 s proxy poll periods in it"]
    walks = walks_from_spans(data, where)
    for (policy, phase), steps in training_walks(walks).items():
        cells = ", ".join(f"step {s}: {a:.3f} s ({math.floor(a / 0.5)})" for s, a in steps)
        lines.append(f"  {policy:<22}{phase:<16}{cells}")
    after_sync = [w for w in walks if w.phase == "update_weights" and not w.rebuilt_first]
    for w in after_sync:
        if w.rank == 0:
            lines.append(f"  {w.policy} step {w.step}: the sync walk ended {w.after_sync_start:.3f} s after the weight "
                         "sync (its collective) started")
    try:
        replay = replay_record(data, topology, where)
    except RecordError as exc:
        lines.append(f"mesh walk: {exc}")
        return "\n".join(lines)
    lines.append(f"comm_raw.mesh_walk replayed on {topology} (proxy poll and destroy costs as fitted, nothing fitted "
                 "on this record): group, size, measured s, predicted s")
    for rank in sorted({d.rank for d in replay}):
        mine = [d for d in replay if d.rank == rank]
        worst = max(mine, key=lambda d: abs(d.predicted - d.measured))
        lines.append(f"  rank {rank}: walk {sum(d.measured for d in mine):.4f} s measured, "
                     f"{sum(d.predicted for d in mine):.4f} s predicted; largest difference "
                     f"{worst.predicted - worst.measured:+.4f} s ({worst.group})")
        lines.extend(f"    {d.group:<10}{d.size:>2}{d.measured:>9.4f}{d.predicted:>9.4f}" for d in mine if d.member)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sim.calibrate.destroy_walks RECORD... [--topology PRESET]``: print :func:`report` of each; exit 2 on a bad
    record."""
    p = argparse.ArgumentParser(prog="python -m sim.calibrate.destroy_walks", description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", metavar="RECORD", help="a multigpu record with switch_window.spans (and "
                   "comm_raw.mesh_walk), a bench/gpu/destroy_walk_probe.py record, or an NCCL log (.log, .tgz) "
                   "written with microsecond timestamps by bench/gpu/run_destroy_walk.sh")
    p.add_argument("--topology", default="calibrated/hgx-h200-8x", help="preset whose proxy poll and destroy costs "
                   "replay the mesh walk (default calibrated/hgx-h200-8x)")
    args = p.parse_args(argv)
    try:
        texts = [report(r, args.topology) for r in args.records]
    except RecordError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n\n".join(texts))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["proxy_leads", "simulate_idle_destroys", "DestroyGap", "WALK_GAP_S", "destroy_costs", "destroy_gaps", "late_walks", "DestroyWalk", "MeshDestroy", "ProbeDestroy", "UdsThread", "WALK_SPANS", "init_passes",
           "main", "mesh_walks", "nccl_log_files", "nccl_log_lines", "poll_phase_spread", "probe_destroys", "probe_report", "replay_mesh_walk", "replay_record", "report", "training_walks",
           "uds_report", "uds_threads", "walks_from_spans"]
