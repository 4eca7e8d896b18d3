"""The vote's records and verdicts (refimpl.runtime.votes): what every rank reads must survive the store."""
import pytest

from refimpl.runtime.votes import Ballot, Verdict, VoteError


def test_ballot_records_round_trip_and_the_first_ballot_of_a_rank_counts():
    ballots = [Ballot(1, "offload.commit", 4, frozenset({3, 9})), Ballot(0, "offload.commit"),
               Ballot(1, "offload.commit", 0), Ballot(7, "offload.commit", 2)]
    text = "".join(b.record() for b in ballots)
    assert Ballot.parse(text) == ballots
    v = Verdict.settle("k/1", (0, 1, 2), Ballot.parse(text), decided_by=0, timeout_s=5.0, complete=False)
    assert v.failures == {1: 4}, "rank 1's first ballot counts; rank 7 is not a voter"
    assert v.absent == (2,) and not v.complete and not v.agreed
    assert v.marks == frozenset({3, 9}) and v.points == {"offload.commit": (0, 1)}
    assert Verdict.decode(v.encode()) == v
    assert "ranks [2] did not arrive within 5 s (rank 0 gave up)" in v.describe()


def test_a_verdict_is_agreed_only_when_complete_without_failures_at_one_point():
    every = [Ballot(0, "reload.begin"), Ballot(1, "reload.begin")]
    assert Verdict.settle("k", (0, 1), every, decided_by=1, timeout_s=1, complete=True).agreed
    split = [Ballot(0, "reload.begin"), Ballot(1, "offload.begin")]
    v = Verdict.settle("k", (0, 1), split, decided_by=1, timeout_s=1, complete=True)
    assert v.complete and not v.agreed and set(v.points) == {"reload.begin", "offload.begin"}


@pytest.mark.parametrize("point", ["", "a|b", "a;b", "a,b"])
def test_points_that_would_break_a_record_are_refused(point):
    with pytest.raises(VoteError, match="point"):
        Ballot(0, point)


def test_malformed_records_and_verdicts_raise_vote_error():
    with pytest.raises(VoteError, match="malformed ballot"):
        Ballot.parse("0|p|x|;")
    with pytest.raises(VoteError, match="malformed verdict"):
        Verdict.decode("{}")
