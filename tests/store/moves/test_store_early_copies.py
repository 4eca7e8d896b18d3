"""Early copies (``OffloadStore.copy_early``, [Note: early copies] in refimpl/store/moves/early.py): tensors declared
final go to host memory before the offload; the offload takes those copies over, copies the rest, and copies
again whatever changed in place or moved since. Bitwise what a plain offload gives, on the CPU runtime and on a
GPU (where the copies run on the copy stream, issued from the autograd engine's thread)."""
from __future__ import annotations

import pytest
import torch

from refimpl.arguments import ArgumentTypeError
from refimpl.store import OffloadStore
from refimpl.torch_runtime import TorchRuntime


def _setup(device: str = "cpu", seed: int = 0):
    """A two-layer module with AdamW state, offloaded and reloaded once (its layouts resident in flat buffers)."""
    torch.manual_seed(seed)
    dev = torch.device(device)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    _train(m, opt, dev)
    rt = TorchRuntime(dev)
    store = OffloadStore(rt)
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    store.reload()
    return m, opt, store, dev


def _train(m, opt, dev, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    m(torch.randn(4, 16, generator=g).to(dev)).square().sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _snapshot(m, opt) -> dict[str, torch.Tensor]:
    out = {f"p.{k}": v.detach().clone() for k, v in m.state_dict().items()}
    for i, st in enumerate(opt.state.values()):
        for k, v in st.items():
            out[f"s.{i}.{k}"] = v.detach().clone()
    return out


def _assert_bitwise(m, opt, want: dict[str, torch.Tensor]) -> None:
    got = _snapshot(m, opt)
    assert got.keys() == want.keys()
    for k in want:
        a, b = got[k], want[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8) if b.dim() else b), k


def _layer_state(m, opt, i: int) -> list[torch.Tensor]:
    """Layer ``i``'s parameters and their AdamW moments."""
    ps = list(m[i].parameters())
    return ps + [opt.state[p][k] for p in ps for k in ("exp_avg", "exp_avg_sq")]


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def test_an_offload_takes_over_the_early_copies_and_copies_only_the_rest():
    m, opt, store, dev = _setup()
    _train(m, opt, dev, seed=2)
    want = _snapshot(m, opt)
    early = _layer_state(m, opt, 2)
    assert store.copy_early(early) == _nbytes(early)
    assert store.copy_early(early) == 0  # each entry once
    store.offload()
    st = store.stats()
    assert st.last_offload_path == "steady"  # the early copies' views did not make the steady check fail
    assert st.last_early_copy_bytes == st.last_early_reused_bytes == _nbytes(early)
    assert st.last_early_redone_bytes == 0 and st.last_early_skipped == 0
    assert st.last_offload_bytes > _nbytes(early)  # the rest was copied by the offload itself
    store.reload()
    _assert_bitwise(m, opt, want)


@pytest.mark.parametrize("change", ["add_", "copy_", "optimizer_step"])
def test_a_tensor_changed_in_place_after_its_early_copy_is_copied_again(change):
    m, opt, store, dev = _setup()
    _train(m, opt, dev, seed=2)
    early = _layer_state(m, opt, 0)
    store.copy_early(early)
    w = m[0].weight
    if change == "optimizer_step":
        _train(m, opt, dev, seed=3)  # everything changes: every early copy is stale
    with torch.no_grad():
        if change == "add_":
            w.add_(1.0)
        elif change == "copy_":
            w.copy_(torch.full_like(w, 3.0))
    want = _snapshot(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_early_redone_bytes > 0
    assert st.last_early_reused_bytes + st.last_early_redone_bytes == _nbytes(early)
    if change == "optimizer_step":
        assert st.last_early_reused_bytes == 0
    store.reload()
    _assert_bitwise(m, opt, want)


def test_a_tensor_repointed_after_its_early_copy_is_offloaded_from_where_it_points_now():
    m, opt, store, dev = _setup()
    store.copy_early(_layer_state(m, opt, 0))
    m[0].bias.data = torch.full_like(m[0].bias, 7.0)  # a new storage: the layout changed
    want = _snapshot(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_offload_path == "full"
    # the params' layout was laid out anew: its early copies are copied again; the optimizer state's were kept
    assert st.last_early_redone_bytes > 0
    assert st.last_early_reused_bytes + st.last_early_redone_bytes == st.last_early_copy_bytes
    store.reload()
    _assert_bitwise(m, opt, want)


def test_early_copies_before_the_first_reload_are_skipped_and_the_offload_copies_everything():
    torch.manual_seed(0)
    m = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(m.parameters())
    _train_linear(m, opt)
    store = OffloadStore(TorchRuntime(torch.device("cpu")))
    store.attach_module(m)
    store.attach_optimizer(opt)
    assert store.copy_early(list(m.parameters())) == 0
    want = _snapshot_linear(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_early_skipped == 2 and st.last_early_copy_bytes == st.last_early_reused_bytes == 0
    store.reload()
    got = _snapshot_linear(m, opt)
    assert all(torch.equal(got[k], want[k]) for k in want)


def _train_linear(m, opt) -> None:
    m(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _snapshot_linear(m, opt) -> dict[str, torch.Tensor]:
    return {**{k: v.clone() for k, v in m.state_dict().items()},
            **{f"{i}.{k}": v.clone() for i, s in enumerate(opt.state.values()) for k, v in s.items()}}


def test_a_tensor_the_store_does_not_hold_is_skipped_and_misuse_is_refused():
    m, opt, store, dev = _setup()
    assert store.copy_early([torch.zeros(4)]) == 0
    with pytest.raises(ArgumentTypeError, match="copy_early.*must be a torch.Tensor"):
        store.copy_early([m[0].weight, "bias"])
    with pytest.raises(ArgumentTypeError, match="iterable of tensors"):
        store.copy_early(3)
    store.offload()
    assert store.stats().last_early_skipped == 1


@pytest.mark.parametrize("then", ["reload", "attach", "pin_ahead", "close"])
def test_other_operations_drop_early_copies_and_lose_nothing(then):
    m, opt, store, dev = _setup()
    _train(m, opt, dev, seed=2)
    store.copy_early(_layer_state(m, opt, 0))
    if then == "reload":
        store.reload()  # nothing offloaded: does nothing, but the early copies are gone
    elif then == "attach":
        store.attach_tensors("buffers", {"extra": torch.ones(4)}, name="extra")
    elif then == "pin_ahead":
        store.pin_ahead(wait=True)
    else:
        store.close()
        return
    want = _snapshot(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_early_copy_bytes == 0 and st.last_early_reused_bytes == 0
    store.reload()
    _assert_bitwise(m, opt, want)


def _step_in_backward(m, opt_per_param, store, early: bool) -> None:
    """Post-accumulate-grad hooks step each parameter's own AdamW inside the backward and copy it early."""
    hooks = []
    for p in m.parameters():
        def hook(param, opt=opt_per_param[p]):
            opt.step()
            opt.zero_grad(set_to_none=True)
            if early:
                store.copy_early([param, *(v for v in opt.state[param].values() if v.device == param.device)])
        hooks.append(p.register_post_accumulate_grad_hook(hook))
    return hooks


def _in_backward_cycle(device: str) -> None:
    """Two identical models: one steps in the backward and copies early, the other steps after it; after an
    offload and reload both hold the same bits, and the offload took every early byte over."""
    torch.manual_seed(0)
    dev = torch.device(device)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).to(dev)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).to(dev)
    m.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in m.parameters()}
    store = OffloadStore(TorchRuntime(dev))
    store.attach_module(m)
    for i, o in enumerate(opts.values()):
        store.attach_optimizer(o, name=f"optim.{i}")
    hooks = _step_in_backward(m, opts, store, early=True)
    g = torch.Generator().manual_seed(5)
    for step in range(3):
        x = torch.randn(8, 64, generator=g).to(dev)
        ref(x).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        m(x).square().mean().backward()
        store.offload()
        st = store.stats()
        if step:  # resident in flat buffers since the first reload: every parameter and moment went early
            assert st.last_early_copy_bytes == st.last_early_reused_bytes > 0
            assert st.last_early_redone_bytes == 0
        store.reload()
        for (k, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (step, k)
    for h in hooks:
        h.remove()
    store.close()


def test_optimizer_in_backward_hooks_copy_early_and_match_the_plain_step_bitwise():
    _in_backward_cycle("cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_optimizer_in_backward_hooks_copy_early_on_the_gpu():
    """On CUDA the hooks run in the autograd engine's device thread and the copies on the copy stream."""
    _in_backward_cycle("cuda")
