"""The pure part of SUSPEND_PLANNED: each rank's vote per group and the plan every rank agrees on."""
from __future__ import annotations

from refimpl.comm.group_plan import GroupAction, GroupPlan, GroupPlanRules, choose_action, local_votes

MiB = 2**20


def test_choose_action_in_order_of_its_rules():
    r = GroupPlanRules(keep_live={"rollout"}, destroy={"embd"})
    assert choose_action(r, "rollout", 2, 192 * MiB) is GroupAction.KEEP, "the rollout uses it"
    assert choose_action(r, "embd", 2, 192 * MiB) is GroupAction.DESTROY, "declared unneeded until training"
    assert choose_action(r, "gloo", 2, 0) is GroupAction.KEEP, "nothing to free"
    assert choose_action(r, "tiny", 2, 1 * MiB) is GroupAction.KEEP
    assert choose_action(r, "solo", 1, 384 * MiB) is GroupAction.DESTROY, "one rank: destroy beats suspend"
    assert choose_action(r, "dp", 2, 128 * MiB) is GroupAction.SUSPEND, "below the break-even size (156 MiB)"
    no_destroy = GroupPlanRules(destroy_single_rank=False, costs=None)
    assert choose_action(no_destroy, "solo", 1, 384 * MiB) is GroupAction.SUSPEND
    by_cost = GroupPlanRules(destroy_single_rank=False)
    assert choose_action(by_cost, "solo", 1, 384 * MiB) is GroupAction.DESTROY, "0.045 s to destroy+init < 0.47 s"
    assert choose_action(by_cost, "dp", 2, 480 * MiB) is GroupAction.DESTROY
    assert choose_action(by_cost, "dp", 2, 192 * MiB) is GroupAction.DESTROY, "0.19 s to destroy+init < 0.24 s"
    assert choose_action(by_cost, "dp", 2, 128 * MiB) is GroupAction.SUSPEND


def test_min_of_the_votes_is_the_plan():
    names = ("a", "b", "c")
    sizes = {"a": 2, "b": 1, "c": 2}
    mem = {"a": 128 * MiB, "b": 384 * MiB, "c": 128 * MiB}  # two-rank ones below the break-even size (156 MiB)
    r0 = local_votes(GroupPlanRules(sync_groups={"a"}, keep_live={"c"}), names, {"a": True, "b": True, "c": True}, sizes, mem)
    r1 = local_votes(GroupPlanRules(sync_groups=set(), keep_live={"c"}), names, {"a": True, "b": False, "c": True},
                     sizes, mem)
    agreed = [min(x, y) for x, y in zip(r0, r1)]
    plan = GroupPlan.from_agreed(names, agreed)
    assert plan.actions == {"a": GroupAction.SUSPEND, "b": GroupAction.DESTROY, "c": GroupAction.KEEP}
    assert plan.for_sync == {"a"}, "needed by the sync if any rank needs it; a non-member never does"
    assert plan.kept_live == {"c"}, "declared keep_live by one rank: canaried after the pause by all"
    assert plan.acted(sync=False) == ["b"] and plan.acted(sync=True) == ["a"]
    assert plan.counts() == {"KEEP": 1, "SUSPEND": 1, "DESTROY": 1}


def test_undeclared_sync_groups_keep_everything_up_for_the_sync():
    names = ("a", "b")
    votes = local_votes(GroupPlanRules(), names, {"a": True, "b": True}, {"a": 2, "b": 2},
                        {"a": 192 * MiB, "b": 192 * MiB})
    plan = GroupPlan.from_agreed(names, votes)
    assert plan.for_sync == {"a", "b"} and plan.acted(sync=False) == [] and plan.acted(sync=True) == ["a", "b"]


def test_docs_embed_the_plan_rows():
    from pathlib import Path

    from refimpl.comm.group_plan import PLAN_ROWS, format_plan_rows

    doc = (Path(__file__).resolve().parents[2] / "docs" / "comm.md").read_text()
    flat = "\n".join(line.strip() for line in doc.splitlines())
    assert format_plan_rows() in flat, "docs/comm.md's plan table is out of date; print format_plan_rows()"
    assert PLAN_ROWS[-1].guard == "otherwise", "the last row must always hold"
