"""The destroy walks of the 2 x H200 records: the proxy-poll rule replayed group by group on the lazy-wake record's mesh walk, the
walks that ended one poll period late, the destroy-walk probe records of the walk-probes record (the poll phase spread is fitted on
them) and NCCL's own log of its UDS proxy threads (issues 11 and 12).

Nothing of the lazy-wake record is in the calibrated presets' fit set; these tests read it, fit nothing.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from sim.calibrate.destroy_walks import (init_passes, main, mesh_walks, nccl_log_lines, poll_phase_spread,
                               probe_destroys, probe_report, replay_mesh_walk, replay_record, training_walks,
                               uds_report, uds_threads, walks_from_spans)
from sim.calibrate.records import RecordError
from sim.presets import load_preset_data

ROOT = Path(__file__).resolve().parents[3]
LAZY_WAKE = ROOT / "bench" / "results" / "2026-11-30-h200x2-lazy-wake" / "multigpu-2026-11-30-nvidia-h200x2.json"
PRESET = "calibrated/hgx-h200-8x"


@pytest.fixture(scope="module")
def lazy_wake() -> dict:
    return json.loads(LAZY_WAKE.read_text())


def test_lazy_wake_is_outside_the_fit_set():
    assert "h200x2-lazy-wake" not in json.dumps(load_preset_data(PRESET))


def test_replay_waits_for_each_communicators_own_poll_timeout():
    # two one-rank groups initialised 0.1 s apart (ends at 0.1 and 0.2 s), destroyed right after: the first waits for
    # its timeout at 0.6 s (0.4 s), the second for 0.7 s (0.1 s less its predecessor's 0.01 s cost); a non-member
    # takes what it measured
    rows = [{"name": "a", "size": 1, "member": True, "first_collective_s": 0.1, "destroy_s": 0.0},
            {"name": "b", "size": 1, "member": False, "destroy_s": 0.002},
            {"name": "c", "size": 1, "member": True, "first_collective_s": 0.1, "destroy_s": 0.0}]
    got = replay_mesh_walk(rows, poll_s=0.5, destroy_s={1: 0.01})
    assert [d.predicted for d in got] == pytest.approx([0.41, 0.002, 0.098])


def test_the_proxy_poll_rule_predicts_every_destroy_of_the_measured_mesh_walk(lazy_wake):
    """28 destroys (14 groups on each of 2 ranks) as the lifecycle walks them, first used one after the other:
    each within 20 ms with the preset's constants (a destroy's own cost from NCCL's log, nothing of this record),
    each walk within 1%."""
    replay = replay_record(lazy_wake, PRESET)
    members = [d for d in replay if d.member]
    assert len(members) == 28 and {d.size for d in members} == {1, 2}
    assert max(abs(d.predicted - d.measured) for d in members) < 0.025
    for rank in (0, 1):
        mine = [d for d in replay if d.rank == rank]
        assert sum(d.predicted for d in mine) == pytest.approx(sum(d.measured for d in mine), rel=0.01)
        # the first destroy waits for the first group's timeout, 1.5 s after its init: 0.37 s, the longest
        first = next(d for d in mine if d.member)
        # (16 ms over: the preset's own cost of the destroy, where the proxy's last request came 26 ms before the
        # end of the group's first collective, which the simulator takes as the poll's origin)
        assert first.measured == max(d.measured for d in mine) and first.predicted == pytest.approx(first.measured,
                                                                                                     abs=0.02)


def test_suspend_planned_sync_walk_ends_one_poll_period_later_than_the_pause_walks(lazy_wake):
    """The same 14 groups, initialised by the training step right before the pause, destroyed in the same order:
    DESTROY_DEFERRED's pause walk ends 3 poll periods (1.51 s) after the pause in every steady step,
    SUSPEND_PLANNED's weight-sync walk 4 (2.01 s) in every step; the lazy variant's pause walk (13 groups) 3 or 4."""
    tw = training_walks(walks_from_spans(lazy_wake, str(LAZY_WAKE)))
    periods = {k: [math.floor(a / 0.5) for s, a in v if s >= 1] for k, v in tw.items()}
    assert periods[("DESTROY_DEFERRED", "sleep")] == [3, 3, 3]
    assert periods[("SUSPEND_PLANNED", "update_weights")] == [4, 4, 4]
    assert sorted(periods[("SUSPEND_PLANNED_LAZY", "sleep")]) == [3, 3, 4]
    sp = [a for s, a in tw[("SUSPEND_PLANNED", "update_weights")]]
    dd = [a for s, a in tw[("DESTROY_DEFERRED", "sleep")] if s >= 1]
    assert min(sp) - max(dd) == pytest.approx(0.5, abs=0.01)


def test_the_weight_syncs_collective_does_not_restart_the_synced_groups_poll(lazy_wake):
    """The lazy variant's sync walk destroys only the sync's own group, right after the sync's collective on it:
    it ends 0.08-0.09 s after the sync started (the group's timeout, 2 periods after its training init), where a poll
    restarted by that collective would hold the destroy ~0.5 s. So the extra period of SUSPEND_PLANNED's sync walk is
    not the sync's collective on that group."""
    lazy = [w for w in walks_from_spans(lazy_wake) if w.policy == "SUSPEND_PLANNED_LAZY" and w.phase == "update_weights"
            and not w.rebuilt_first]
    assert len(lazy) == 6 and all(0.05 < w.after_sync_start < 0.15 for w in lazy)


def test_missing_sections_are_named(tmp_path, capsys):
    with pytest.raises(RecordError, match=r"switch_window\.spans"):
        walks_from_spans({"switch_window": {"results": []}}, "r.json")
    with pytest.raises(RecordError, match=r"comm_raw\.mesh_walk"):
        mesh_walks({"comm_raw": {"skipped": "no NCCL"}}, "r.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main([str(bad)]) == 2 and "cannot read it as JSON" in capsys.readouterr().err


def test_command_prints_the_walks_and_the_replay(capsys):
    assert main([str(LAZY_WAKE)]) == 0
    out = capsys.readouterr().out
    assert "SUSPEND_PLANNED       update_weights  step 1: 2.014 s (4)" in out
    assert "rank 0: walk 1.5082 s measured, 1.5165 s predicted" in out


def test_probe_records_name_the_destroy_that_waited_a_period_more(tmp_path, capsys):
    """A bench/gpu/destroy_walk_probe.py record (synthetic here: the GPU run is the lead's): a walk is the destroys
    between two agreements; the group whose destroy ends one poll period later after its init than the walk's first
    is named."""
    events = [["collective", "p.control", 0.0], ["collective", "p.a", 0.1], ["collective", "p.b", 0.2],
              ["collective", "p.b", 0.22], ["collective", "p.control", 0.25],
              ["destroy_start", "p.a", 0.25], ["destroy_end", "p.a", 0.61],
              ["destroy_start", "p.x", 0.61], ["destroy_end", "p.x", 0.611],
              ["destroy_start", "p.b", 0.611], ["destroy_end", "p.b", 1.21], ["collective", "p.control", 1.22]]
    rec = {"kind": "destroy_walk_probe", "policy": "SUSPEND_PLANNED", "sync": "tp", "ranks": [{"events": events}]}
    got = probe_destroys(rec)
    assert [(d.group, d.walk, d.periods()) for d in got] == [("p.a", 0, 1), ("p.x", 0, None), ("p.b", 0, 2)]
    assert got[2].since_last == pytest.approx(0.99)
    (line,) = probe_report(rec)
    assert "3 destroys, 0.960 s" in line and "one period more from p.b on" in line
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(rec))
    assert main([str(path)]) == 0 and "SUSPEND_PLANNED (weight sync collective: tp)" in capsys.readouterr().out
    with pytest.raises(RecordError, match="destroy_walk_probe"):
        probe_destroys({"kind": "multigpu"})


def test_command_takes_several_records(tmp_path, capsys):
    rec = {"kind": "destroy_walk_probe", "policy": "DESTROY_DEFERRED", "sync": "none",
           "ranks": [{"events": [["collective", "p.a", 0.1], ["destroy_start", "p.a", 0.2], ["destroy_end", "p.a", 0.6]]}]}
    paths = [tmp_path / f"{k}.json" for k in "ab"]
    for p in paths:
        p.write_text(json.dumps(rec))
    assert main([str(p) for p in paths]) == 0
    assert capsys.readouterr().out.count("DESTROY_DEFERRED (weight sync collective: none)") == 2


PROBES = ROOT / "bench" / "results" / "2026-11-30-h200x2-walk-probes" / "destroy-walk"


def _probe(policy: str, sync: str) -> dict:
    return json.loads((PROBES / f"destroy-walk-2026-11-30-{policy}-sync-{sync}-nvidia-h200x2.json").read_text())


def _walk_lengths(rec: dict) -> list[float]:
    """Each walk over the 14 groups a training step initialised, rank 0: first destroy's start to last's end."""
    destroys = [d for d in probe_destroys(rec) if d.rank == 0]
    out = []
    for w in sorted({d.walk for d in destroys}):
        mine = [d for d in destroys if d.walk == w]
        if sum(d.since_init is not None for d in mine) == 14:
            out.append(mine[-1].end - mine[0].start)
    return out


def test_walk_probes_suspend_planned_walks_end_on_time_and_destroy_deferred_once_late():
    """The walk-probes record (2 x H200, 15:08 UTC): SUSPEND_PLANNED's walk over the 14 groups after the weight sync took 3 poll
    periods in every step, with and without the sync's collective (the all-policies and lazy-wake records: 4 in every step);
    DESTROY_DEFERRED's pause walk one period more in one of six steps. The same walk, late in some runs and steps."""
    for sync in ("tp", "none"):
        sp = _walk_lengths(_probe("suspend_planned", sync))
        assert len(sp) == 6 and all(1.45 < a < 1.55 for a in sp), (sync, sp)
    dd = _walk_lengths(_probe("destroy_deferred", "tp"))
    assert len(dd) == 6 and sorted(round(a * 2) for a in dd) == [3, 3, 3, 3, 3, 4]


def test_the_poll_phase_spread_is_the_range_of_the_init_passes():
    """The training step's lazy inits of 14 groups took 1.19-1.44 s from first to last on rank 1 of the
    DESTROY_DEFERRED / no-sync probe: their poll phases move that much against one another between steps."""
    rec = _probe("destroy_deferred", "none")
    passes = init_passes(rec)
    assert [len(p) for p in passes] == [7, 7] and all(len(x) == 14 for p in passes for x in p)
    spread, how = poll_phase_spread(rec)
    assert spread == pytest.approx(0.2409, abs=0.001) and "rank 1: 7 init passes of 14 groups" in how
    with pytest.raises(RecordError, match="two full init passes"):
        poll_phase_spread({"kind": "destroy_walk_probe", "ranks": [{"events": [["collective", "p.a", 0.1]]}]})


def test_nccls_uds_threads_exit_a_whole_number_of_polls_after_their_last_request():
    """NCCL's own log (INIT,PROXY, microsecond timestamps) of the DESTROY_DEFERRED / no-sync probe: every one of the
    198 UDS proxy threads that exited did so a whole number of 500 ms poll periods after it started or last served
    a request, plus under 10 ms: the mechanism [Note: the proxy's 500 ms poll] charges every destroy with."""
    threads = uds_threads(nccl_log_lines(PROBES / "nccl-log-destroy_deferred-none.tgz"))
    done = [t for t in threads if t.exited is not None]
    assert len(done) == 198 and sum(1 for t in done if t.requests) == 72
    for t in done:
        after = t.exit_after_last_activity()
        k = round(after / 0.5)
        assert k >= 1 and 0 < after - 0.5 * k < 0.010, (t, after)
    assert "198 UDS proxy threads exited (72 had served requests)" in uds_report(threads)
    assert uds_report([]) == "no UDS proxy thread exit in the log"


def test_a_destroys_own_cost_and_the_proxys_last_request_from_nccls_log():
    """[Note: a destroy's own cost, from NCCL's log]: from each UDS thread's exit to the next destroy's proxy stop in a
    walk, 15-18 ms for one- and two-rank communicators alike (what the calibrated presets charge as ``destroy`` beyond
    the wait, and with the proxy waker as the whole destroy); and where the proxy's periods begin: a one-rank thread
    starts about 26 ms before its init completes, a two-rank one serves its last request 3 ms before its connections
    are made."""
    from sim.calibrate.destroy_walks import destroy_costs, destroy_gaps, proxy_leads
    from sim.machine.topology import Topology

    lines = nccl_log_lines(PROBES / "nccl-log-destroy_deferred-none.tgz")
    gaps = destroy_gaps(lines)
    assert {(g.size, g.next_size) for g in gaps} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(0 <= g.seconds < 0.2 for g in gaps) and len({g.pid for g in gaps}) == 2
    costs = destroy_costs(gaps)
    assert costs[1][0] == pytest.approx(0.0178, abs=5e-4) and costs[2][0] == pytest.approx(0.0163, abs=5e-4)
    assert costs[1][1] == 97 and costs[2][1] == 43
    leads = proxy_leads(lines)
    assert 0.02 < statistics.median(leads[1]) < 0.03 and statistics.median(leads[2]) < 0.005
    comm = Topology.from_preset(PRESET).comm
    assert 0.015 < comm.for_size(1).destroy_s < 0.018 and 0.015 < comm.for_size(2).destroy_s < 0.018
    # a log without a walk gives nothing to fit
    assert destroy_costs(destroy_gaps(lines[:100])) == {}
    assert main([str(PROBES / "nccl-log-destroy_deferred-none.tgz")]) == 0
