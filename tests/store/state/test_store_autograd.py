"""Offload and reload keep each attached parameter's autograd identity: the same gradient accumulator
(hooks on it, what torch DDP's reducer and Megatron DDP register, still fire), post-accumulate hooks,
tensor hooks, ``is_leaf``, ``requires_grad`` and the ``grad_fn`` chain of views made afterwards."""
import pytest
import torch

from refimpl.torch_runtime import TorchRuntime
from refimpl.store import OffloadStore
from refimpl.store.debug import DEBUG_ENV


def _accumulator(p):
    return p.expand_as(p).grad_fn.next_functions[0][0]


def _hooked_model(device):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)
    fired = {"acc": [], "post": [], "tensor": []}
    accs = {}
    for name, p in model.named_parameters():
        acc = _accumulator(p)
        accs[name] = acc  # held, as DDP's reducer holds them
        acc.register_hook(lambda *_, n=name: fired["acc"].append(n))
        p.register_post_accumulate_grad_hook(lambda _p, n=name: fired["post"].append(n))
        p.register_hook(lambda g, n=name: fired["tensor"].append(n))
    return model, fired, accs


def _assert_identity_kept(device, cycles=2):
    model, fired, accs = _hooked_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    store = OffloadStore(TorchRuntime(device))
    store.attach_module(model)
    store.attach_optimizer(opt)
    names = [n for n, _ in model.named_parameters()]
    x = torch.randn(4, 8, device=device)
    for _ in range(cycles):
        for v in fired.values():
            v.clear()
        store.offload()
        store.reload()
        for n, p in model.named_parameters():
            assert p.is_leaf and p.requires_grad, n
            assert _accumulator(p) is accs[n], f"{n} got a new gradient accumulator"
            assert p[:1].grad_fn.next_functions[0][0] is accs[n], f"a view of {n} does not reach its accumulator"
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        for kind, got in fired.items():
            assert sorted(got) == sorted(names), f"{kind} hooks fired for {got}, expected every parameter"


@pytest.mark.parametrize("debug", [False, True])
def test_hooks_fire_after_offload_and_reload(monkeypatch, debug):
    if debug:
        monkeypatch.setenv(DEBUG_ENV, "1")
    _assert_identity_kept("cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hooks_fire_after_offload_and_reload_cuda():
    _assert_identity_kept("cuda")
