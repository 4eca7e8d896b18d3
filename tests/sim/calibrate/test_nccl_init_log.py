"""A communicator's creation split from NCCL's INFO log (sim.calibrate.nccl_init_log): the parser on a small log
written here, and on the 2 x H200 probes' logs the shipped connection share was read from."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.calibrate.nccl_init_log import (CONNECT_SHARE_2X_H200, PER_EXCHANGE_SHARE_2X_H200, RING_CHANNELS_2X_H200,
                                         WALK_PROBE_LOGS, connect_share, creation_splits, main, per_exchange_share,
                                         splits_in_lines)
from sim.calibrate.records import RecordError

ROOT = Path(__file__).resolve().parents[3]

LOG = """\
[100.000] h:1:1 [0] NCCL INFO [Rank 0] ncclCommInitRankConfig comm 0xaa rank 0 nranks 1 cudaDev 0 - Init START
[100.020] h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xaa rank 0 nranks 1 cudaDev 0 - Init COMPLETE
[100.100] h:1:1 [0] NCCL INFO [Rank 0] ncclCommInitRankConfig comm 0xbb rank 0 nranks 2 cudaDev 0 - Init START
[100.130] h:1:1 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
[100.140] h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xbb rank 0 nranks 2 cudaDev 0 - Init COMPLETE
[100.145] h:1:1 [0] NCCL INFO 64 coll channels, 64 collnet channels, 0 nvls channels, 64 p2p channels, 64 p2p channels per peer
[100.150] h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM
[100.160] h:1:1 [0] NCCL INFO UDS: ClientGetFd handle 0x1 tpRank 1 returned fd 81 sameProcess 0
[100.220] h:1:1 [0] NCCL INFO UDS: ClientGetFd handle 0x2 tpRank 1 returned fd 82 sameProcess 0
[100.280] h:1:1 [0] NCCL INFO UDS: ClientGetFd handle 0x3 tpRank 1 returned fd 81 sameProcess 0
[100.300] h:1:1 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
[100.310] h:1:1 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
[101.000] h:1:1 [0] NCCL INFO [Rank 0] ncclCommInitRankConfig comm 0xcc rank 1 nranks 4 cudaDev 0 - Init START
[101.050] h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0xcc rank 1 nranks 4 cudaDev 0 - Init COMPLETE
[101.250] h:1:1 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
"""


def test_a_log_gives_each_multi_rank_communicators_init_and_connection():
    """The init is START to COMPLETE; the connection is COMPLETE to the first ``Connected all rings`` after it (a
    later one is not the same communicator's); a one-rank communicator has none."""
    s = splits_in_lines(LOG.splitlines())
    assert [(x.comm, x.ranks) for x in s] == [("0xbb", 2), ("0xcc", 4)]
    assert s[0].init_s == pytest.approx(0.040) and s[0].connect_s == pytest.approx(0.160)
    assert s[0].connect_share == pytest.approx(0.8)
    assert s[1].init_s == pytest.approx(0.050) and s[1].connect_s == pytest.approx(0.200)
    # the channel line inside a communicator's init is its own; one outside any init belongs to none
    assert s[0].channels == 24 and s[1].channels is None
    assert connect_share(s) == pytest.approx(0.8)
    # three handle exchanges 60 ms apart: 0.12 s first to last, 0.18 s with one more spacing, of a 0.16-s connection
    # (at most 1); the communicator without exchanges has no share, and a log without any is refused
    assert (s[0].exchanges, s[1].exchanges) == (3, 0)
    assert s[0].exchange_span_s == pytest.approx(0.120) and s[0].per_exchange_share == 1.0
    assert s[1].per_exchange_share is None and per_exchange_share(s) == 1.0
    with pytest.raises(RecordError, match="PROXY"):
        per_exchange_share([s[1]])
    with pytest.raises(RecordError, match="TIMESTAMP"):
        connect_share(splits_in_lines(["NCCL INFO Connected all rings"]))


def test_the_shipped_share_is_the_probes_logs():
    """The constant the ring rule uses is what the 2 x H200 probes' logs give today (two-rank communicators only)."""
    splits = [x for p in WALK_PROBE_LOGS for x in creation_splits(ROOT / p)]
    assert len(splits) > 100 and {x.ranks for x in splits} == {2}
    assert connect_share(splits) == pytest.approx(CONNECT_SHARE_2X_H200, abs=0.0005)
    # every two-rank communicator has 24 ring channels: what the ring rule keeps at any size (docs/calibration.md)
    assert {x.channels for x in splits} == {RING_CHANNELS_2X_H200} == {24}
    # one buffer-handle exchange per channel and direction; the share spent one after another, what a cap scales
    assert {x.exchanges for x in splits} == {2 * RING_CHANNELS_2X_H200}
    assert per_exchange_share(splits) == pytest.approx(PER_EXCHANGE_SHARE_2X_H200, abs=0.0005)


def test_the_command_prints_the_table_and_refuses_a_missing_log(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(LOG)
    assert main([str(log)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 1 | 40.0 | 160.0 | 200.0 | 0.800 | 24 |" in out and "| 4 | 1 | 50.0 | 200.0 | 250.0 | 0.800 | not logged |" in out
    assert main([str(tmp_path / "none.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
