"""TorchRuntime.adopt_group on 2 Gloo ranks: a process group made outside the runtime (as a training
framework makes its own) is destroyed and rebuilt by the runtime, and every place Python held the old
object (a module global, a list, an instance attribute, a ``__slots__`` attribute, a closure cell, a
dict key) names the rebuilt group afterwards, which works; a tuple cannot be changed and is named in
a warning. Wrong adoptions are refused with GroupError."""
from tests._dist import run_distributed

HELD = None  # a module global, as Megatron's parallel_state keeps its groups


class _Slotted:
    __slots__ = ("group",)

    def __init__(self, group):
        self.group = group


class _Plain:
    def __init__(self, group):
        self.group = group


def _adopt(rank, world_size):
    import gc
    import logging

    import torch
    import torch.distributed as dist

    from refimpl.runtime import GroupError, GroupSpec
    from refimpl.torch_runtime import TorchRuntime

    global HELD
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("refimpl.torch_runtime").addHandler(handler)
    rt = TorchRuntime("cpu")
    mine = dist.new_group([0, 1])
    solo = [[dist.new_group([0]), dist.new_group([1])][rank]]  # this rank's one-rank group, as Megatron's tp
    HELD = mine
    holders = dict(lst=[mine], plain=_Plain(mine), slotted=_Slotted(mine), keyed={mine: ["value"]}, frozen=(mine, []))
    reader = (lambda g: lambda: g)(mine)  # a closure cell
    spec = rt.foreign_group_spec("fw.dp", mine)
    rt.run(rt.adopt_group(spec, mine))
    for r in (0, 1):  # every rank adopts both one-rank groups, in the same order; only the member passes it
        rt.run(rt.adopt_group(GroupSpec(f"fw.tp{r}", (r,)), solo[0] if r == rank else None))
    refused = []
    for bad in (lambda: rt.adopt_group(GroupSpec("fw.x", (0, 1)), None),  # a member without its group
                lambda: rt.adopt_group(GroupSpec("fw.y", (0,)), mine),  # ranks differ from the object's
                lambda: rt.adopt_group(spec, mine)):  # the name is taken
        try:
            rt.run(bad())
        except GroupError as e:
            refused.append(str(e)[:60])
    old, everywhere = mine, []
    for _ in range(2):  # twice: a re-pointed instance's attributes stay re-pointable (gc.collect in between)
        before = [HELD.group_name]  # a name: any closure over a group object is re-pointed too
        rt.run(rt.destroy_group("fw.dp"))
        rt.run(rt.recreate_group("fw.dp"))
        seen = [HELD, holders["lst"][0], holders["plain"].group, holders["slotted"].group, reader(),
                next(iter(holders["keyed"]))]
        everywhere.append([x is seen[0] and x.group_name not in before for x in seen])
        del seen
        gc.collect()
    for r in (0, 1):  # a non-member takes part in the rebuild (torch's new_group is called by every rank)
        rt.run(rt.destroy_group(f"fw.tp{r}"))
    for r in (0, 1):
        rt.run(rt.recreate_group(f"fw.tp{r}"))
    new = HELD
    t, one = torch.ones(1), torch.ones(1)
    dist.all_reduce(t, group=new)
    dist.all_reduce(one, group=solo[0])
    return dict(solo=(one.item(), solo[0].group_name == rt.torch_group_name(f"fw.tp{rank}")),
        spec=(spec.ranks, spec.backend, spec.timeout_s), refused=refused, replaced=new is not old,
        everywhere=everywhere, tuple_kept=holders["frozen"][0] is old, works=t.item(),
        current=new.group_name == rt.torch_group_name("fw.dp"),
        warned=[r.getMessage()[:200] for r in records if r.levelno >= logging.WARNING])


def test_an_adopted_group_is_rebuilt_in_place_everywhere_python_holds_it():
    for rank, r in enumerate(run_distributed(_adopt, 2, timeout=120)):
        assert r["spec"] == ((0, 1), "gloo", 1800.0), r["spec"]  # torch's Gloo default timeout, as created
        assert len(r["refused"]) == 3, r["refused"]
        assert r["replaced"] and r["current"] and r["works"] == 2.0, r
        assert r["solo"] == (1.0, True), "the member's one-rank group, rebuilt with a non-member taking part"
        assert r["everywhere"] == [[True] * 6] * 2, f"rank {rank}: a holder still names the destroyed group: {r['everywhere']}"
        assert r["tuple_kept"] and any("tuple" in w for w in r["warned"]), r["warned"]
