"""OffloadStore on one CPU process (TorchRuntime): training with offload/reload between steps is
bitwise identical to training without; sharing and views survive; memory is really released."""
import pytest
import torch
import torch.nn.functional as F

from refimpl.runtime import CopyKind
from refimpl.torch_runtime import TorchRuntime
from refimpl.store import Category, LayoutState, OffloadStore, StoreConfig
from refimpl.store.state.parking import is_parked

VOCAB, DIM = 37, 16


class TiedLM(torch.nn.Module):
    """Tied input/output embeddings, a LayerNorm, a BatchNorm (buffers) and a bias-free projection."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.bn = torch.nn.BatchNorm1d(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        h = self.norm(torch.relu(self.proj(self.emb(x))))
        h = self.bn(h.reshape(-1, DIM))
        return self.head(h)


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (6, 5), generator=g) for _ in range(n)]


def _snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    bufs = [b.clone() for b in model.buffers()]
    state = [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return params, bufs, state


def _train(steps, store_cfg=None, set_to_none=True, check=None):
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    rt = TorchRuntime("cpu")
    store = None
    if store_cfg is not None:
        store = OffloadStore(rt, config=store_cfg)
        store.attach_module(model)
        store.attach_optimizer(opt)
    losses = []
    for x in _batches(steps):
        loss = F.cross_entropy(model(x), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        losses.append(loss.item())
        if store is not None:
            store.offload()
            if check:
                check(model, opt, store)
            store.reload()
    return losses, _snapshot(model, opt), model, opt, store


def _assert_all_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _released(model, opt):
    ts = list(model.parameters()) + list(model.buffers())
    ts += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    ts += [p.grad for p in model.parameters() if p.grad is not None]
    return all(is_parked(t) for t in ts)


@pytest.mark.parametrize("set_to_none", [True, False], ids=["grads_none", "grads_zeroed"])
def test_training_with_offload_between_steps_is_bitwise_identical(set_to_none):
    ref_losses, ref_state, *_ = _train(5, set_to_none=set_to_none)
    seen = []

    def check(model, opt, store):
        seen.append(_released(model, opt))

    losses, state, model, opt, store = _train(
        5, StoreConfig(segment_bytes=2048, pack_below_bytes=512, staging_bytes=4096), set_to_none, check)
    assert losses == ref_losses, "every loss bit-identical"
    for a, b in zip(state, ref_state):
        _assert_all_equal(a, b)
    assert seen == [True] * 5, "after each offload every registered storage holds 0 bytes"
    # after reload: every tensor of a layout is a view into ONE flat buffer, at non-zero offsets too
    for cat in (Category.PARAMS, Category.OPTIMIZER, Category.BUFFERS):
        storages = {t.untyped_storage()._cdata for t in _tensors_of(model, opt, cat)}
        assert len(storages) == 1, f"{cat.value}: {len(storages)} storages"
    assert max(p.storage_offset() for p in model.parameters()) > 0
    assert model.head.weight is model.emb.weight


def _tensors_of(model, opt, cat):
    if cat is Category.PARAMS:
        return list(model.parameters())
    if cat is Category.BUFFERS:
        return [b for b in model.buffers() if b.dtype == torch.float32]
    return [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]


def test_first_offload_packs_small_storages_later_ones_copy_one_flat_buffer():
    rt = TorchRuntime("cpu")
    g = torch.Generator().manual_seed(0)
    tensors = {f"e{i}": torch.randn(50 + i, generator=g) for i in range(200)}
    tensors["big"] = torch.randn(4096, generator=g)
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(rt, config=StoreConfig(pack_below_bytes=1024, staging_bytes=4096, staging_buffers=2,
                                                segment_bytes=1 << 20))
    store.attach_tensors(Category.PARAMS, tensors)
    d2h_before = rt.copy_stats.count[CopyKind.D2H]
    store.offload()
    first = store.stats().copies
    assert first["direct"] == 1 and first["packed"] >= 10 and first["flat"] == 0
    assert store.stats().last_early_releases == 201, "each storage released once its own copy completed"
    assert rt.copy_stats.count[CopyKind.D2H] - d2h_before == first["direct"] + first["packed"] < 201
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)
    releases: list[int] = []
    release = rt.release
    rt.release = lambda t: (releases.append(1), release(t))[1]  # count the runtime's releases
    for _ in range(2):
        for t in tensors.values():
            t.mul_(2)  # training changes values in place
        store.offload()
        assert store.stats().copies == {"flat": 1, "direct": 0, "packed": 0}, "one copy of the flat buffer"
        assert store.stats().last_early_releases == 0 and is_parked(tensors["e0"])
        assert all(is_parked(t) for t in tensors.values()), "every view released"
        assert releases == [1], "the flat buffer is released once, not once per entry"
        releases.clear()
        store.reload()
    assert all(torch.equal(tensors[k], want[k] * 4) for k in want)


def test_changes_after_a_reload_are_seen_by_the_next_offload():
    """The fast path must not ship a stale flat buffer: re-assigned data, new state and new grads."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.attach_optimizer(opt)
    store.offload()  # no optimizer state, no grads yet
    store.reload()
    model.weight.data = torch.full((4, 8), 3.0)  # re-pointed to a new storage
    model(torch.randn(2, 8)).sum().backward()  # grads appear
    opt.step()  # optimizer state appears
    want = _snapshot(model, opt)
    want_grads = [p.grad.clone() for p in model.parameters()]
    store.offload()
    assert store.is_offloaded(Category.GRADS) and store.stats().tensors == 2 + 2 + 3 * 2
    store.reload()
    for a, b in zip(_snapshot(model, opt), want):
        _assert_all_equal(a, b)
    _assert_all_equal([p.grad for p in model.parameters()], want_grads)


def test_a_new_view_of_resident_state_is_picked_up_by_the_next_offload():
    """After a reload, a new registered tensor viewing the flat buffer changes the layout."""
    rt = TorchRuntime("cpu")
    tensors = {"a": torch.arange(16.0), "b": torch.ones(8)}
    store = OffloadStore(rt)
    store.attach_tensors(Category.PARAMS, tensors)
    store.offload()
    store.reload()
    tensors["a_tail"] = tensors["a"][10:]  # a new view of resident state
    store.offload()
    store.reload()
    view = tensors["a_tail"]
    shares = view.untyped_storage()._cdata == tensors["a"].untyped_storage()._cdata
    assert shares, "the new view was re-pointed into the flat buffer with its base"
    assert torch.equal(view, torch.arange(10.0, 16.0))
    view.fill_(-1)
    assert torch.equal(tensors["a"][10:], torch.full((6,), -1.0))


def test_a_new_tensor_joins_an_unchanged_resident_layout():
    """Resident layout unchanged + a new storage of the same category and dtype: one combined layout."""
    rt = TorchRuntime("cpu")
    tensors = {"a": torch.arange(16.0), "b": torch.ones(8)}
    store = OffloadStore(rt)
    store.attach_tensors(Category.PARAMS, tensors)
    store.offload()
    store.reload()
    tensors["c"] = torch.full((5,), 3.0)  # a new, separate storage
    store.offload()
    assert is_parked(tensors["c"]), "the newcomer was offloaded too"
    store.reload()
    assert torch.equal(tensors["c"], torch.full((5,), 3.0)) and torch.equal(tensors["a"], torch.arange(16.0))
    assert len({t.untyped_storage()._cdata for t in tensors.values()}) == 1, "one flat buffer for the layout"


def test_ddp_flat_buffers_master_weights_and_views_survive():
    """DDP-style contiguous param/grad buffers with parameter views, plus fp32 master weights."""
    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
        params = list(model.parameters())
        sizes = [p.numel() for p in params]
        pbuf = torch.zeros(sum(sizes), dtype=torch.bfloat16)
        gbuf = torch.zeros(sum(sizes), dtype=torch.bfloat16)
        master = {}
        off = 0
        for i, (p, n) in enumerate(zip(params, sizes)):
            master[f"m{i}"] = p.detach().clone().float()
            pbuf[off:off + n].copy_(p.detach().reshape(-1))
            p.data = pbuf[off:off + n].view(p.shape)
            p.grad = gbuf[off:off + n].view(p.shape)
            off += n
        opt = torch.optim.AdamW(list(master.values()), lr=1e-2)
        return model, pbuf, gbuf, master, opt

    def step(model, gbuf, master, opt, x):
        model(x.bfloat16()).float().square().mean().backward()  # accumulates into gbuf via the grad views
        for (p, m) in zip(model.parameters(), master.values()):
            m.grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master.values()):
                p.copy_(m)  # write back to the bf16 params (views of pbuf)
        gbuf.zero_()

    xs = [torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    ref = build()
    for x in xs:
        step(ref[0], ref[2], ref[3], ref[4], x)

    model, pbuf, gbuf, master, opt = build()
    rt = TorchRuntime("cpu")
    store = OffloadStore(rt)
    store.attach_module(model)
    store.attach_tensors(Category.PARAMS, {"pbuf": pbuf}, name="ddp_params", kind="ddp_buffer")
    store.attach_tensors(Category.GRADS, {"gbuf": gbuf}, name="ddp_grads", kind="ddp_buffer")
    store.attach_tensors(Category.OPTIMIZER, master, name="master", kind="master_weights")
    store.attach_optimizer(opt)
    offsets = [p.storage_offset() - pbuf.storage_offset() for p in model.parameters()]
    for x in xs:
        step(model, gbuf, master, opt, x)
        store.offload()
        store.reload()
        for p, want in zip(model.parameters(), offsets):
            assert p.untyped_storage()._cdata == pbuf.untyped_storage()._cdata, "param is still a view of pbuf"
            assert p.storage_offset() - pbuf.storage_offset() == want
            assert p.grad.untyped_storage()._cdata == gbuf.untyped_storage()._cdata
    kinds = {e.kind for lay in store.layouts.values() for e in lay.entries}
    assert {"ddp_buffer", "master_weights"} <= kinds
    dtypes = {(k.category, k.dtype) for k in store.layouts}
    assert (Category.PARAMS, torch.bfloat16) in dtypes and (Category.OPTIMIZER, torch.float32) in dtypes
    _assert_all_equal([pbuf, gbuf, *master.values()], [ref[1], ref[2], *ref[3].values()])
    _assert_all_equal(_snapshot(model, opt)[2], _snapshot(ref[0], ref[4])[2])


def test_drop_grads_copies_no_gradient_bytes_and_reloads_zeros():
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 32)
    model(torch.randn(4, 32)).sum().backward()
    rt = TorchRuntime("cpu")
    store = OffloadStore(rt)
    store.attach_module(model)
    grads = [p.grad for p in model.parameters()]
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    before = rt.copy_stats.bytes[CopyKind.D2H]
    store.offload(drop_grads=True)
    assert rt.copy_stats.bytes[CopyKind.D2H] - before == param_bytes, "only parameter bytes left the device"
    assert all(is_parked(g) for g in grads), "gradient memory released anyway"
    store.reload()
    assert [p.grad for p in model.parameters()] == grads, "same gradient objects"
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_selective_include_offload_twice_and_reload_of_nothing_are_no_ops():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    rt = TorchRuntime("cpu")
    store = OffloadStore(rt)
    store.attach_module(model)
    store.attach_optimizer(opt)
    store.reload()  # never offloaded: nothing happens
    assert rt.copy_stats.host_copies == 0
    store.offload(include=["optimizer"])
    assert store.is_offloaded("optimizer") and not store.is_offloaded(Category.PARAMS)
    assert not is_parked(model.weight)
    assert all(is_parked(v) for v in opt.state[model.weight].values())
    n = rt.copy_stats.host_copies
    store.offload(include="optimizer")  # twice = once
    store.reload(include=[Category.PARAMS])  # params were never offloaded
    assert rt.copy_stats.host_copies == n
    store.offload()  # the rest
    assert is_parked(model.weight) and store.is_offloaded("grads")
    store.reload(include=["params"])
    assert not is_parked(model.weight) and store.is_offloaded("optimizer")
    store.reload()
    assert not any(store.is_offloaded(c) for c in Category)
    assert all(lay.state is LayoutState.ON_DEVICE for lay in store.layouts.values())


def test_gradient_accumulation_phase_does_no_host_traffic():
    torch.manual_seed(0)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rt = TorchRuntime("cpu")
    store = OffloadStore(rt)
    store.attach_module(model)
    store.attach_optimizer(opt)
    for cycle, x in enumerate(_batches(2)):
        store.reload()
        copies = rt.copy_stats.host_copies
        for micro in x.split(2):  # 3 micro-batches accumulate into .grad
            F.cross_entropy(model(micro), micro.reshape(-1)).backward()
        opt.step()
        assert rt.copy_stats.host_copies == copies, "no host copy between micro-batches or in the step"
        store.offload()
        assert rt.copy_stats.count[CopyKind.D2H] > 0 and rt.copy_stats.host_copies > copies


def test_host_tensors_are_views_of_the_pinned_buffers():
    rt = TorchRuntime("cpu")
    w = torch.arange(12.0).reshape(3, 4)
    store = OffloadStore(rt)
    store.attach_tensors("params", {"w": w, "wt": w.t()}, name="m")
    store.offload()
    host = store.host_tensors()
    assert set(host) == {"m.w", "m.wt"}
    assert torch.equal(host["m.w"], torch.arange(12.0).reshape(3, 4))
    assert torch.equal(host["m.wt"], torch.arange(12.0).reshape(3, 4).t())
    assert host["m.w"].untyped_storage()._cdata == host["m.wt"].untyped_storage()._cdata
    store.reload()
    assert store.host_tensors() == {}


def test_background_pin_ahead_pins_at_attach_so_the_first_offload_pins_nothing():
    rt = TorchRuntime("cpu")
    g = torch.Generator().manual_seed(1)
    params = {f"p{i}": torch.randn(500 + i, generator=g) for i in range(30)}
    optim = {f"m{i}": torch.randn(700 + i, generator=g) for i in range(30)}
    want = {k: v.clone() for k, v in (params | optim).items()}
    store = OffloadStore(rt, config=StoreConfig(segment_bytes=16 << 10, pin_threads=2, pin_ahead="background"))
    store.attach_tensors(Category.PARAMS, params, name="p")
    store.attach_tensors(Category.OPTIMIZER, optim, name="o")
    store.pool.wait_all()
    state_bytes = sum(t.nbytes for t in want.values())
    pinned = store.stats()
    assert state_bytes <= pinned.host_pinned_bytes <= 1.01 * state_bytes + 2 * 512 * 60, "exact-size host buffers"
    assert all(not is_parked(t) for t in params.values()), "attaching moved nothing"
    store.offload()
    after = store.stats()
    assert after.registrations == pinned.registrations, "the first offload pinned nothing more"
    assert after.host_pinned_bytes == pinned.host_pinned_bytes
    store.reload()
    assert all(torch.equal((params | optim)[k], want[k]) for k in want)
    assert StoreConfig().pin_ahead_mode("cuda") == "background" and StoreConfig().pin_ahead_mode("cpu") == "off"
    with pytest.raises(ValueError, match="pin_ahead"):
        StoreConfig(pin_ahead="eager")


def test_pin_ahead_pins_exactly_what_the_first_offload_uses():
    rt = TorchRuntime("cpu")
    g = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(3000 + i, generator=g) for i in range(40)}
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(rt, config=StoreConfig(segment_bytes=64 << 10, pin_threads=3))
    store.attach_tensors(Category.OPTIMIZER, tensors)
    reserved = store.pin_ahead(wait=True)
    pinned = store.stats()
    assert pinned.host_pinned_bytes == reserved == rt.pinned_bytes and pinned.registrations > 1
    assert all(not is_parked(t) for t in tensors.values()), "nothing moved"
    store.offload()
    after = store.stats()
    assert after.registrations == pinned.registrations, "the first offload pinned nothing more"
    assert after.reuses == pinned.registrations
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)
