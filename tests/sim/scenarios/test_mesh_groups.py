"""MeshGroups computes a scenario's groups from the mesh ([Note: mesh groups without a list of them]); it must give
the groups the list the runner used to build did, and each rank the same group of each family."""
import itertools
import math

import pytest

from sim.scenarios.mesh_groups import MeshGroups
from sim.scenarios.scenario import GroupFamily


def _listed(mesh, families, world_size):
    """The groups as the runner listed them: every family, every combination of the other dims (row-major)."""
    dims = [d for d, _ in mesh]
    sizes = [n for _, n in mesh]
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    specs, member = [], [{} for _ in range(world_size)]
    for fam in families:
        inner = [dims.index(d) for d in fam.dims]
        outer = [i for i in range(len(dims)) if i not in inner]
        combos = list(itertools.product(*(range(sizes[i]) for i in outer)))
        for gi, oc in enumerate(combos):
            base = sum(c * strides[i] for c, i in zip(oc, outer))
            ranks = sorted(base + sum(c * strides[i] for c, i in zip(ic, inner))
                           for ic in itertools.product(*(range(sizes[i]) for i in inner)))
            name = fam.name if len(combos) == 1 else f"{fam.name}{gi}"
            specs.append((name, tuple(ranks)))
            for r in ranks:
                member[r][fam.name] = name
    return specs, member


@pytest.mark.parametrize("mesh, families", [
    ((("dp", 4), ("tp", 8)), (("tp", ("tp",)), ("dp", ("dp",)), ("all", ("dp", "tp")), ("one", ()))),
    ((("pp", 3), ("dp", 2), ("tp", 4)), (("mp", ("pp", "tp")), ("dp", ("dp",)), ("pp", ("pp",)), ("g1", ("tp", "pp")))),
    ((("dp", 24),), (("dp", ("dp",)),)),
    ((("a", 2), ("b", 3), ("c", 2), ("d", 2)), (("x", ("b", "d")), ("y", ("a", "c")), ("x2", ("c",)))),
])
def test_the_groups_are_those_the_runner_listed(mesh, families):
    fams = tuple(GroupFamily(n, d) for n, d in families)
    n = math.prod(s for _, s in mesh)
    groups = MeshGroups(mesh, fams, n)
    specs, member = _listed(mesh, fams, n)
    assert [(s.name, s.ranks) for s in groups.specs] == specs
    assert groups.member == member
    for name, ranks in specs:
        fam, index = groups.parse(name)
        assert groups.members(fam, index) == ranks and groups.first_member(fam, index) == ranks[0]
        assert groups.spec(name) is groups.spec(name)  # made once
    for fam in groups.families:
        index = groups.group_index_of_all(fam)
        assert [groups.name(fam, int(i)) for i in index] == [m[fam] for m in member]
        assert groups.first_members(fam).tolist() == [groups.first_member(fam, i) for i in range(groups.count(fam))]
    with pytest.raises(KeyError):
        groups.parse("nope")
