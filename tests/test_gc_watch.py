"""The RL step's collector ([Note: the collector in the switch] in bench/rl/gc_watch.py): the setup's survivors frozen
so a full collection walks only what came after, and every collection of the steps timed into the record."""
from __future__ import annotations

import gc
import time

import pytest

from bench.rl.gc_watch import GcWatch, freeze_setup


@pytest.fixture
def _unfrozen():
    yield
    gc.unfreeze()


def test_a_watch_times_each_collection_on_the_steps_clock():
    t0 = time.perf_counter()
    watch = GcWatch(t0).start()
    watch.start()  # idempotent: one callback
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        watch.stop()
        watch.stop()
    gc.collect(2)  # after stop: not counted
    s = watch.summary()
    assert s["count"][2] == 1 and s["count"][0] == 1 and s["s"][2] > 0
    full = [c for c in watch.collections() if c["generation"] == 2]
    assert len(full) == 1 and 0 <= full[0]["at_s"] <= time.perf_counter() - t0 and s["max_s"] >= full[0]["s"] > 0


def test_freezing_the_setup_leaves_a_full_collection_only_what_came_after(_unfrozen):
    """What a full collection walks (``gc.get_objects()``: the tracked objects of generations 0-2): after the freeze
    none of the setup's, only what came after; cyclic garbage made before it is collected first, made after it is
    collected by the next full collection."""
    import weakref

    class Node:
        pass

    before = Node()
    before.me = before
    gone_before = weakref.ref(before)
    del before
    setup = [[i] for i in range(20_000)]  # a setup's worth of tracked objects
    frozen = freeze_setup()
    assert gone_before() is None  # collected before the freeze, not frozen as garbage
    assert frozen >= len(setup) and gc.get_freeze_count() == frozen and len(gc.get_objects()) < 1_000
    after = Node()
    after.me = after
    gone_after = weakref.ref(after)
    del after
    gc.collect(2)
    assert gone_after() is None
    assert len(setup) == 20_000  # the frozen setup stays reachable and whole


def test_the_step_freezes_by_default_and_the_flag_turns_it_off():
    from bench.rl import StepConfig
    from bench.rl.command import parse_args

    assert StepConfig().gc_freeze is True
    assert parse_args(["--no-gc-freeze"]).gc_freeze is False


def test_the_pause_bench_runs_and_reports_both_figures(capsys):
    pytest.importorskip("transformers")
    from bench.gc_pause import main

    assert main(["--tiny", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "objects tracked" in out and "one full collection:" in out and "after freezing" in out
    assert gc.get_freeze_count() == 0  # the bench leaves the collector as it found it
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
