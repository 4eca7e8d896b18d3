"""docs/guide.md's "the store in your own FSDP2 worker" snippet, run on 2 real Gloo ranks.

The test reads the snippet from the guide (between the ``guide-snippet`` markers), so the guide
cannot drift from the code without this failing.
"""
import re
from pathlib import Path

from tests._dist import run_distributed

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def snippet() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(r"<!-- guide-snippet -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/guide.md lost its guide-snippet block"
    return m.group(1)


def _rank(rank, world_size, code):
    import torch

    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, "docs/guide.md", "exec"), scope)  # the snippet offloads and reloads once
    model, optim, control = scope["model"], scope["optim"], scope["control"]
    before = [p.detach().full_tensor().clone() for p in model.parameters()]
    control.offload_states()
    offloaded = control.offloaded
    control.reload_states()
    after = [p.detach().full_tensor() for p in model.parameters()]
    model(torch.randn(4, 64)).sum().backward()
    optim.step()  # training continues on the reloaded state
    return offloaded, all(torch.equal(a, b) for a, b in zip(before, after)), len(code.strip().splitlines())


def test_guide_snippet_round_trips_an_fsdp2_model_on_two_ranks():
    code = snippet()
    results = run_distributed(_rank, world_size=2, args=(code,))
    assert results == [(True, True, results[0][2])] * 2
    assert results[0][2] <= 14  # "in ten lines" of store code, plus imports
