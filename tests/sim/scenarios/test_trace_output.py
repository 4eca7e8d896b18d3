"""Pictures and traces a person reads: one colour per phase in every run, every mark in the legend, and a
Chrome trace whose memory counters hold each value once."""
import json

from sim.scenarios.trace import PHASE_COLOURS, memory_changes, phase_colour


def test_a_phase_has_the_same_colour_in_every_run_whatever_else_the_run_has():
    assert phase_colour("rollout") == PHASE_COLOURS["rollout"]
    # before: colours were handed out in the sorted order of the names one run had, so "sleep" changed colour
    # between a run with lifecycle spans and one without
    assert phase_colour("lifecycle.destroy") == phase_colour("lifecycle.destroy")
    assert len({phase_colour(n) for n in PHASE_COLOURS}) == len(PHASE_COLOURS)


def test_memory_counters_keep_each_value_once():
    samples = [(0.0, 1), (0.0, 2), (1.0, 2), (2.0, 2), (3.0, 5), (4.0, 5)]
    assert memory_changes(samples) == [(0.0, 2), (3.0, 5), (4.0, 5)]


def test_the_default_scenarios_trace_has_no_repeated_counters(tmp_path):
    from refimpl.cli import main

    trace = tmp_path / "t.json"
    assert main(["sim", "run", "default", "--quiet", "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    by_rank = {}
    for e in events:
        if e["ph"] == "C":
            by_rank.setdefault(e["pid"], []).append(e["args"]["GiB"])
    for values in by_rank.values():  # the last sample closes the track at the run's end
        assert all(a != b for a, b in zip(values[:-1], values[1:-1]))
    assert sum(len(v) for v in by_rank.values()) < 400  # 23,416 before (99% repeats)


def test_every_mark_of_the_png_is_in_the_legend(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sim.scenarios.trace import RankTimeline, Timeline, write_png

    tl = Timeline([RankTimeline(0, spans=[("train", 0.0, 1.0), ("sleep", 1.0, 2.0)],
                                copies=[("d2h", 10, 1.0, 1.5)], faults=[(1.2, "crash", "sleep")])], end=2.0)
    seen = {}
    real_savefig = plt.Figure.savefig

    def grab(fig, *a, **kw):
        seen["labels"] = [t.get_text() for ax in fig.axes for lg in [ax.get_legend()] if lg for t in lg.get_texts()]
        return real_savefig(fig, *a, **kw)

    plt.Figure.savefig = grab
    try:
        write_png(tl, tmp_path / "t.png")
    finally:
        plt.Figure.savefig = real_savefig
    assert seen["labels"] == ["train", "sleep", "host/device copy", "fault injected"]
