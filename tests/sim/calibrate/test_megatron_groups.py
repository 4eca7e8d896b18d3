"""The switch-window driver's Megatron group families against megatron-core's own RankGenerator."""
from __future__ import annotations

import warnings

import pytest

from sim.calibrate.switch_window import MeshError, megatron_groups, mesh_groups

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # no Transformer Engine / Apex here: megatron-core says so on import
    RankGenerator = pytest.importorskip(  # the optional `megatron` extra
        "megatron.core.parallel_state", reason="needs megatron-core (pip install -e '.[megatron]')").RankGenerator

#: our family -> megatron-core's token (dense generator, order tp-cp-ep-dp-pp)
DENSE = {"tp": "tp", "dp": "dp", "dp_cp": "dp-cp", "mp": "tp-pp", "tp_dp": "tp-dp", "tp_dp_cp": "tp-dp-cp",
         "tp_cp": "tp-cp", "pp": "pp", "cp": "cp"}
#: our expert family -> token of the expert generator (tp = etp, dp = edp, order tp-ep-dp-pp)
EXPERT = {"ep": "ep", "etp": "tp", "edp": "dp"}


def _ours(specs) -> dict[str, list[list[int]]]:
    out: dict[str, list[list[int]]] = {}
    for s in specs:
        out.setdefault(s.name.rstrip("0123456789"), []).append(list(s.ranks))
    return out


@pytest.mark.parametrize("tp,cp,dp,pp,ep,etp", [
    (4, 2, 1, 1, 8, 1),  # the Relax report's 8 x H20 Qwen3-30B-A3B: TP=4, CP=2, EP=8
    (2, 2, 2, 1, 2, None), (1, 2, 2, 2, 4, None), (2, 1, 2, 2, 2, 2), (2, 1, 4, 1, 1, None), (1, 1, 8, 1, 8, None),
])
def test_every_family_is_megatron_cores(tp, cp, dp, pp, ep, etp):
    world = tp * cp * dp * pp
    ours = _ours(megatron_groups(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp))
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    e_tp = etp if etp is not None else tp
    expert = RankGenerator(tp=e_tp, ep=ep, dp=world // (e_tp * ep * pp), pp=pp, cp=1, order="tp-ep-dp-pp")
    for fam, token in DENSE.items():
        assert sorted(ours[fam]) == sorted(dense.get_ranks(token)), fam
    for fam, token in EXPERT.items():
        assert sorted(ours[fam]) == sorted(expert.get_ranks(token)), fam
    pipes = dense.get_ranks("pp")
    assert sorted(ours["embd"]) == sorted(sorted({g[0], g[-1]}) for g in pipes)
    assert sorted(ours["pos_embd"]) == sorted([g[0]] for g in pipes)
    for rank in range(world):  # every rank is in one group of each family (a stage's ranks only in its stage's)
        for fam, gs in ours.items():
            assert sum(rank in g for g in gs) == (1 if fam not in ("embd", "pos_embd") or pp == 1 else
                                                  int(any(rank in g for g in gs))), (fam, rank)


def test_the_dp_tp_mesh_is_the_same_groups_as_before_and_bad_sizes_are_refused():
    assert mesh_groups(2, 4) == megatron_groups(tp=4, dp=2)
    assert [s.name for s in mesh_groups(2, 1) if 0 in s.ranks][:3] == ["tp0", "dp", "dp_cp"]
    with pytest.raises(MeshError, match="etp 4 x ep 8 x pp 1 = 32 does not divide the 8 ranks"):
        megatron_groups(tp=4, cp=2, ep=8, etp=4)


def test_bench_switch_window_takes_cp_ep_and_pp(capsys):
    from refimpl.cli import main

    assert main(["bench", "switch-window", "--tp", "4", "--cp", "2", "--dp", "1", "--ep", "8", "--steps", "3",
                 "--warmup", "1", "--policy", "paused_live"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the header wraps at 100 columns
    assert "8 ranks (tp 4 cp 2 dp 1 pp 1 ep 8), 14 Megatron groups per rank" in out
    assert main(["bench", "switch-window", "--tp", "4", "--cp", "2", "--dp", "1", "--ep", "8", "--etp", "4"]) == 2
    assert "does not divide" in capsys.readouterr().err
