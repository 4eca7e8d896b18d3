"""Early copies (``OffloadStore.copy_early``, [Note: early copies] in refimpl/store/moves/early.py): tensors declared
final go to host memory before the offload; the offload takes those copies over, copies the rest, and copies
again whatever changed in place or moved since. Bitwise what a plain offload gives, on the CPU runtime and on a
GPU (where the copies run on the copy stream, issued from the autograd engine's thread)."""
from __future__ import annotations

import logging

import pytest
import torch

from refimpl.arguments import ArgumentTypeError
from refimpl.store import OffloadStore, StoreConfig
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
def test_a_tensor_changed_in_place_after_its_early_copy_is_copied_again(change, caplog):
    """A change the version counters see is found by them: the digest at the offload finds nothing more."""
    caplog.set_level(logging.INFO, logger="refimpl.store.moves.early")
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
    assert not [r for r in caplog.records if "without a version counter moving" in r.getMessage()], \
        "a change the counters see was left to the digest"
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


# --------------------------------------------------------------------------- writes the counters cannot see


def _fused_setup(seed: int = 0):
    """A module with a BatchNorm and a fused AdamW (neither bumps a version counter), resident after a reload."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    m(torch.randn(6, 8)).square().mean().backward()
    opt.step()
    store = OffloadStore(TorchRuntime(torch.device("cpu")))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    store.reload()
    return m, opt, store


def _everything(m, opt) -> list[torch.Tensor]:
    return [*m.parameters(), *m.buffers(), *(v for s in opt.state.values() for v in s.values())]


@pytest.mark.parametrize("write", ["fused_adamw_step", "batchnorm_forward_in_train_mode", "through_data"])
def test_a_write_no_version_counter_sees_after_copy_early_is_copied_again(write):
    """The three writes of the issue: before, the reload returned the bytes from before the write."""
    m, opt, store = _fused_setup()
    m(torch.randn(6, 8)).square().mean().backward()
    state = [s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]  # (the step counters do count)
    if write == "fused_adamw_step":
        early = [*m.parameters(), *state]
        store.copy_early(early)
        versions = [t._version for t in early]
        opt.step()
        assert [t._version for t in early] == versions, "the fused step bumps no counter (else this proves nothing)"
    elif write == "batchnorm_forward_in_train_mode":
        early = [m[1].running_mean, m[1].running_var]
        store.copy_early(early)
        versions = [t._version for t in early]
        m(torch.randn(6, 8))
        assert [t._version for t in early] == versions
    else:
        early = [m[0].weight, m[3].weight]
        store.copy_early(early)
        m[0].weight.data.add_(1.0)
    want = [t.detach().clone() for t in _everything(m, opt)]
    store.offload()
    st = store.stats()
    assert st.last_early_redone_bytes > 0 and st.last_early_reused_bytes + st.last_early_redone_bytes == _nbytes(early)
    if write == "through_data":
        assert st.last_early_reused_bytes == _nbytes([m[3].weight]), "the copy nothing wrote to is taken over"
    store.reload()
    got = _everything(m, opt)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), "the reload returns the bytes after the write"


@pytest.mark.parametrize("change", ["add_", "through_data"])
def test_an_early_copy_whose_non_first_entry_changed_is_copied_again(change):
    """One copy carries a run of neighbouring entries (a layer's weight and bias); its second entry changes."""
    m, opt, store, dev = _setup()
    _train(m, opt, dev, seed=2)
    w, b = m[2].weight, m[2].bias
    params = next(lay for lay in store.layouts.values() if lay.category.value == "params")
    entry = {id(r.live()): e for e in params.entries for r in e.refs}
    ew, eb = entry[id(w)], entry[id(b)]
    assert ew.offset < eb.offset and not any(ew.offset < e.offset < eb.offset for e in params.entries), \
        "the bias is the weight's neighbour: one run, one copy"
    assert params.segment_of(ew.offset, eb.offset + eb.numel) >= 0
    store.copy_early([w, b])
    with torch.no_grad():
        if change == "add_":
            b.add_(1.0)
        else:
            b.data.add_(1.0)
    want = _snapshot(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_early_copy_bytes == _nbytes([w, b])
    assert st.last_early_redone_bytes == _nbytes([w, b]) and st.last_early_reused_bytes == 0
    store.reload()
    _assert_bitwise(m, opt, want)


def test_early_copies_across_host_segment_cuts_are_taken_over_bitwise():
    """Host segments of 1 KiB: a layer's tensors lie in several segments, so a call's neighbouring entries are
    cut into one copy per segment (a copy never spans two segments)."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    _train(m, opt, torch.device("cpu"))
    store = OffloadStore(TorchRuntime(torch.device("cpu")), config=StoreConfig(segment_bytes=1024))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    store.reload()
    _train(m, opt, torch.device("cpu"), seed=2)
    want = _snapshot(m, opt)
    params = next(lay for lay in store.layouts.values() if lay.category.value == "params")
    assert len(params.segments) >= 3, params.segments
    early = [t for i in (0, 2) for t in _layer_state(m, opt, i)]
    assert store.copy_early(early) == _nbytes(early)
    store.offload()
    st = store.stats()
    assert st.last_early_reused_bytes == _nbytes(early) and st.last_early_redone_bytes == 0
    store.reload()
    _assert_bitwise(m, opt, want)


def _early_copy_during_async_save(rank, world_size, root):
    import time

    from torch.distributed.checkpoint import FileSystemWriter

    from refimpl.torch_runtime import dcp

    class SlowWriter(FileSystemWriter):
        """Starts writing late: a copy into the host buffers meanwhile would land in the checkpoint."""

        def write_data(self, plan, planner):
            time.sleep(1.5)
            return super().write_data(plan, planner)

    m, opt, store, dev = _setup()
    _train(m, opt, dev, seed=2)
    store.offload()
    at_save = {k: v.clone() for k, v in store.host_tensors("params").items()}
    res = dcp.async_save(store, storage_writer=SlowWriter(f"{root}/ckpt"))
    store.reload()
    _train(m, opt, dev, seed=3)  # new values, copied early into the host buffers the save reads
    store.copy_early(_layer_state(m, opt, 0) + _layer_state(m, opt, 2))
    waited = res.future.done()
    res.future.result()
    want = _snapshot(m, opt)
    store.offload()
    store.reload()
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    sd = {"model": fresh.state_dict()}
    dcp.load_into(sd, f"{root}/ckpt")
    loaded = {f"model.{k}": v for k, v in fresh.state_dict().items()}
    return {"waited": waited, "diff": sorted(k for k in at_save if not torch.equal(loaded[k], at_save[k])),
            "changed": any(not torch.equal(at_save[f"model.{k}"], v) for k, v in m.state_dict().items()),
            "bitwise": all(torch.equal(a, want[k]) for k, a in _snapshot(m, opt).items())}


def test_copy_early_waits_for_an_async_checkpoint_reading_the_host_buffers(tmp_path):
    """An async DCP save of offloaded state reads the host buffers in place; early copies write into them. They
    wait for the save, or the checkpoint holds the values copied early instead of those at the save."""
    from tests._dist import run_distributed

    (r,) = run_distributed(_early_copy_during_async_save, 1, args=(str(tmp_path),), timeout=120)
    assert r["changed"], "the step after the save must change the parameters, or this proves nothing"
    assert r["waited"], "copy_early returned before the save had written"
    assert r["diff"] == [], f"the checkpoint holds other values than at the save: {r['diff']}"
    assert r["bitwise"]


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


def _assert_in_backward_cycle_bitwise(device: str, streamed: bool = False, width: int = 128) -> None:
    """Two identical models: one steps in the backward and copies early, the other steps after it; after an
    offload and reload both hold the same bits, and the offload took every early byte over. ``streamed``: each
    reload streams, issued in the backward's order (``use_order``: last layer first), and the early copies leave
    while it still streams ([Note: early copies while a reload streams])."""
    torch.manual_seed(0)
    dev = torch.device(device)

    def model():
        return torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                   torch.nn.GELU(), torch.nn.Linear(width, 64)).to(dev)

    ref, m = model(), model()
    m.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opts = {p: torch.optim.AdamW([p], lr=1e-2) for p in m.parameters()}
    store = OffloadStore(TorchRuntime(dev), config=StoreConfig(stream_chunk_bytes=64 << 10))
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
            assert st.last_early_streaming_bytes == (st.last_early_copy_bytes if streamed else 0)
        if streamed:
            order = [t for p in reversed(list(m.parameters())) for t in (p, *opts[p].state[p].values()) if t.dim()]
            store.reload(stream=True, use_order=order)
            assert store.stats().last_reload_ordered == len(order)
        else:
            store.reload()
        for (k, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (step, k)
    for h in hooks:
        h.remove()
    store.close()


@pytest.mark.parametrize("streamed", [False, True])
def test_optimizer_in_backward_hooks_copy_early_and_match_the_plain_step_bitwise(streamed):
    _assert_in_backward_cycle_bitwise("cpu", streamed)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("streamed", [False, True])
def test_optimizer_in_backward_hooks_copy_early_on_the_gpu(streamed):
    """On CUDA the hooks run in the autograd engine's device thread and the copies on the copy streams; streamed,
    the early copies to the host run while the reload's pieces still land, on the other direction's stream (a
    model of 4 x 2048-wide layers in 64-KiB pieces: an early copy ordered wrongly reads or overwrites bytes in
    flight, which the bitwise check sees)."""
    _assert_in_backward_cycle_bitwise("cuda", streamed, width=2048)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_fused_adamw_step_after_copy_early_is_copied_again_on_the_gpu():
    """CUDA's fused AdamW kernel bumps no version counter either; the digests run on the device."""
    torch.manual_seed(0)
    dev = torch.device("cuda")
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.Linear(128, 32)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)
    m(torch.randn(8, 64, device=dev)).square().mean().backward()
    opt.step()
    store = OffloadStore(TorchRuntime(dev))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    store.reload()
    m(torch.randn(8, 64, device=dev)).square().mean().backward()
    early = [*m.parameters(), *(s[k] for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))]
    store.copy_early(early)
    versions = [t._version for t in early]
    opt.step()  # queued right after the early copies, no synchronize
    assert [t._version for t in early] == versions
    want = [t.detach().clone() for t in _everything(m, opt)]
    store.offload()
    st = store.stats()
    assert st.last_early_redone_bytes > 0
    store.reload()
    assert all(torch.equal(a, b) for a, b in zip(_everything(m, opt), want))
    store.close()
