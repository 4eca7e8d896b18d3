"""bench/vote_probe.py times TorchRuntime.vote on real Gloo processes (what docs/dedup.md quotes per vote)."""
from tests._dist import run_distributed


def _probe(rank, world_size):
    from bench.vote_probe import measure

    return measure(5)


def test_the_vote_probe_times_every_vote_on_every_rank():
    for times in run_distributed(_probe, 2, timeout=120):
        assert len(times) == 5 and all(0 < t < 30 for t in times), times
