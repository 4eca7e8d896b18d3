"""The streamed reload (``OffloadStore.reload(stream=True)``): the call returns once the copies are issued and every
tensor is re-pointed; a tensor's first torch call orders the caller's stream after the pieces that hold its bytes
(see [Note: streamed reload] in refimpl/store/moves/reload.py), untouched tensors are handed over by ``finish_reload``
or the store's next operation; bitwise what a whole reload gives."""
from __future__ import annotations

import pytest
import torch

from refimpl.arguments import ArgumentTypeError
from refimpl.runtime.base import Completion
from refimpl.store import OffloadStore, StoreConfig
from refimpl.store.state.guard import OffloadedTensorError, is_guarded
from refimpl.torch_runtime import TorchRuntime


class _Recorded(Completion):
    """A finished copy that records when device work is ordered after it (the piece's index)."""

    def __init__(self, inner: Completion, log: list[int], index: int) -> None:
        self.inner, self.log, self.index = inner, log, index

    def done(self) -> bool:
        return self.inner.done()

    def __await__(self):
        return self.inner.__await__()

    def order_on_device(self) -> bool:
        self.log.append(self.index)
        return self.inner.order_on_device()


class RecordingRuntime(TorchRuntime):
    """TorchRuntime whose host-to-device copies say when a stream was ordered after them."""

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.ordered: list[int] = []
        self.h2d: list[tuple[int, int]] = []  # (data_ptr, numel) of each host-to-device copy, in issue order

    def copy_async(self, dst, src, kind):
        done = super().copy_async(dst, src, kind)
        if kind.name == "H2D":
            self.h2d.append((dst.data_ptr(), dst.numel()))
            return _Recorded(done, self.ordered, len(self.h2d) - 1)
        return done


def _model(device="cpu"):
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]).to(device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(8, 64, device=device)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return m, opt


def _snapshot(m, opt):
    state = {k: v.detach().clone() for k, v in m.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        for k, v in s.items():
            state[f"opt{i}.{k}"] = v.detach().clone()
    return state


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _offloaded(rt=None):
    """The model and its AdamW attached to a store on ``rt`` (a :class:`RecordingRuntime` by default) that copies
    in 4-KiB pieces, offloaded; returns ``(model, optimizer, store, rt, their state before the offload)``."""
    m, opt = _model()
    want = _snapshot(m, opt)
    rt = RecordingRuntime("cpu") if rt is None else rt
    store = OffloadStore(rt, config=StoreConfig(alignment_bytes=512, stream_chunk_bytes=4096))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    return m, opt, store, rt, want


def test_a_streamed_reload_hands_each_tensor_over_at_its_first_use():
    m, opt, store, rt, want = _offloaded()
    rt.ordered.clear()
    store.reload(stream=True)
    params = list(m.parameters())
    assert all(is_guarded(p) for p in params)  # re-pointed, each waiting for its first use
    first = params[0]
    y = first.sum()  # the first use: orders after the pieces of its bytes, then drops its guard
    assert not is_guarded(first) and all(is_guarded(p) for p in params[1:])
    assert rt.ordered and len(set(rt.ordered)) == len(rt.ordered)
    touched = set(rt.ordered)
    assert len(touched) < len(rt.h2d)  # only its own pieces, not every copy of the reload
    assert torch.equal(y, want["0.weight"].sum())
    store.finish_reload()  # the rest handed over
    assert not any(is_guarded(p) for p in params)
    assert _equal(_snapshot(m, opt), want)
    # training goes on, and the next offload finds the layouts resident
    m(torch.randn(8, 64)).sum().backward()
    opt.step()
    store.offload()
    with pytest.raises(OffloadedTensorError, match="reload\\(\\) first"):
        params[1].sum()
    store.reload()
    assert not any(is_guarded(p) for p in params)


def test_a_reload_issues_its_copies_in_the_order_a_training_step_first_uses_them():
    """Params, then buffers, then the optimizer state: a forward right after a streamed reload reads a buffer in its
    first layer (a rotary ``inv_freq``), and buffers queued behind the optimizer state made it wait for all of it."""
    m, opt = _model()
    m.register_buffer("scale", torch.arange(64, dtype=torch.float32))  # a buffer the forward would read first
    want = {**_snapshot(m, opt), "scale": m.scale.clone()}
    rt = RecordingRuntime("cpu")
    store = OffloadStore(rt, config=StoreConfig(alignment_bytes=512, stream_chunk_bytes=4096))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    for stream in (True, False):
        rt.h2d.clear()
        store.reload(stream=stream)
        store.finish_reload()

        def category_of(ptr):
            for cat, tensors in (("params", list(m.parameters())), ("buffers", [m.scale]),
                                 ("optimizer", [v for st in opt.state.values() for v in st.values() if v.dim()])):
                for t in tensors:
                    st = t.untyped_storage()
                    if st.data_ptr() <= ptr < st.data_ptr() + st.nbytes():
                        return cat
            return None

        order = [category_of(ptr) for ptr, _ in rt.h2d]
        firsts = [c for i, c in enumerate(order) if c not in order[:i]]
        assert firsts == ["params", "buffers", "optimizer"], (stream, firsts)
        assert order == sorted(order, key=firsts.index)  # each category's copies together, in that order
        assert _equal({**_snapshot(m, opt), "scale": m.scale}, want)
        store.offload()


def test_the_next_operation_finishes_a_streamed_reload_first():
    m, opt = _model()
    want = _snapshot(m, opt)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    store.reload(stream=True)
    store.offload()  # finishes the stream, then offloads
    store.reload()
    assert _equal(_snapshot(m, opt), want)
    store.offload()
    store.reload(stream=True)
    store.close()  # the copies end before the host buffers go
    assert _equal(_snapshot(m, opt), want)


def test_stream_must_be_a_bool():
    store = OffloadStore(TorchRuntime("cpu"))
    with pytest.raises(TypeError, match="stream"):
        store.reload(stream="yes")


def test_a_window_smaller_than_a_piece_is_refused():
    with pytest.raises(ValueError, match="stream_window_bytes"):
        StoreConfig(stream_chunk_bytes=64 << 20, stream_window_bytes=32 << 20)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("window,sm", [(None, None), (8 << 20, None), (512 << 20, None), (None, 16)])
def test_a_forward_right_after_a_streamed_reload_is_bitwise_on_cuda(window, sm):
    """The forward starts while the copies run (256 MiB of weights in 4 MiB pieces, all queued at once, fed
    through a window of 8 MiB, where a layer's pieces are still held on the host when the forward reaches it, or
    made by a kernel of 16 programs on SMs): each layer's first use waits on the device for its own bytes, so the
    result is bitwise the one before the offload."""
    if sm:
        pytest.importorskip("triton")
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda()
    x = torch.randn(64, 4096, device="cuda")
    with torch.no_grad():
        want = m(x)
    rt = TorchRuntime("cuda")
    store = OffloadStore(rt, config=StoreConfig(stream_chunk_bytes=4 << 20, stream_window_bytes=window,
                                                stream_sm_ctas=sm))
    store.attach_module(m)
    for _ in range(3):
        store.offload()
        store.reload(stream=True)
        with torch.no_grad():
            got = m(x)
        assert torch.equal(got, want)
        store.finish_reload()
    assert (rt.sm_copies >= 3 * 64) == bool(sm)  # every piece of every reload on SMs, or none
    store.close()


def _first_listed(ptr, nbytes, order):
    """The position in ``order`` of the first tensor with bytes in ``[ptr, ptr + nbytes)`` (``len(order)``: none)."""
    for i, t in enumerate(order):
        a = t.data_ptr()
        if a < ptr + nbytes and ptr < a + t.numel() * t.element_size():
            return i
    return len(order)


def test_use_order_issues_the_pieces_in_the_order_the_caller_first_uses_its_tensors():
    """An optimizer stepped layer by layer in the backward uses the last layer's params and moments first: with
    ``use_order`` their pieces go first, each listed tensor's before the next one's, then the rest in the default
    order; bitwise the same, and the stats count the tensors it ordered."""
    m, opt, store, rt, want = _offloaded()
    layers = list(m)[::-1]  # the backward's order
    order = []
    for layer in layers[:2]:  # only the last two layers listed: the rest keeps the default order
        for p in layer.parameters():
            order += [p, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]]
    rt.h2d.clear()
    store.reload(stream=True, use_order=order)
    assert store.stats().last_reload_ordered == len(order)
    ranks = [_first_listed(ptr, n * 4, order) for ptr, n in rt.h2d]
    assert ranks[0] == 0  # the last layer's weight lands first
    # pieces holding a listed tensor come in the listed order, all before the pieces holding none
    assert ranks == sorted(ranks) and ranks[-1] == len(order)
    # a 64 x 64 fp32 weight (16 KiB) is in four or five 4-KiB pieces (the layout's cuts need not meet it)
    assert sum(r == 0 for r in ranks) in (4, 5)
    # without use_order the same reload issues the first layer's weight first
    store.finish_reload()
    store.offload()
    rt.h2d.clear()
    store.reload(stream=True)
    assert _first_listed(rt.h2d[0][0], rt.h2d[0][1] * 4, list(m.parameters())) == 0
    store.finish_reload()
    assert _equal(_snapshot(m, opt), want)


def test_use_order_is_a_hint_and_misuse_is_refused():
    m, opt = _model()
    want = _snapshot(m, opt)
    store = OffloadStore(TorchRuntime("cpu"), config=StoreConfig(stream_chunk_bytes=4096))
    store.attach_module(m)
    store.attach_optimizer(opt)
    store.offload()
    with pytest.raises(ValueError, match="pass stream=True"):
        store.reload(use_order=list(m.parameters()))
    with pytest.raises(ArgumentTypeError, match=r"use_order\).*tensors\[1\] must be a torch.Tensor"):
        store.reload(stream=True, use_order=[next(m.parameters()), "bias"])
    assert store.stats().offloaded  # refused before anything moved
    stranger = torch.zeros(3)  # not the store's: passed over
    store.reload("params", stream=True, use_order=[stranger, *m.parameters(), *opt.state[next(m.parameters())].values()])
    assert store.stats().last_reload_ordered == len(list(m.parameters()))  # only the params came back here
    store.reload(stream=True)
    store.finish_reload()
    assert _equal(_snapshot(m, opt), want)


def test_copy_early_leaves_a_streamed_reload_streaming_and_waits_for_its_own_pieces_only():
    """The step right after a streamed reload copies each layer early while the reload's pieces still land: the
    reload goes on streaming, each early copy is ordered after the pieces of its own range (on the device), and
    the offload takes the copies over; bitwise."""
    m, opt, store, rt, _ = _offloaded()
    store.reload()  # the host buffers the early copies write into
    store.offload()
    store.reload(stream=True)
    rt.ordered.clear()
    last = list(m)[-1]
    early = [*last.parameters(), *(opt.state[p][k] for p in last.parameters() for k in ("exp_avg", "exp_avg_sq"))]
    moved = store.copy_early(early)
    assert moved == sum(t.numel() * t.element_size() for t in early)
    assert store._streamed_reloads and store._streamed_reloads[0].streaming  # not finished by copy_early
    assert rt.ordered and len(set(rt.ordered)) < len(rt.h2d)  # the pieces of its ranges, not every piece
    assert all(is_guarded(p) for p in list(m)[0].parameters())  # the first layer's bytes are still arriving
    want = _snapshot(m, opt)
    store.offload()
    st = store.stats()
    assert st.last_early_copy_bytes == st.last_early_reused_bytes == st.last_early_streaming_bytes == moved
    assert st.last_early_redone_bytes == 0
    store.reload()
    assert _equal(_snapshot(m, opt), want)


class _Failing(Completion):
    """A copy that landed on the device (it orders what follows) but whose wait fails: a CUDA error at the finish."""

    def __init__(self, inner: Completion) -> None:
        self.inner = inner

    def done(self) -> bool:
        return self.inner.done()

    def order_on_device(self) -> bool:
        return self.inner.order_on_device()

    def __await__(self):
        yield from self.inner.__await__()
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class FailingWaitRuntime(TorchRuntime):
    """TorchRuntime whose host-to-device copies fail when awaited while ``fail`` is set."""

    fail = False

    def copy_async(self, dst, src, kind):
        done = super().copy_async(dst, src, kind)
        return _Failing(done) if self.fail and kind.name == "H2D" else done


def test_a_streamed_reload_failing_after_early_copies_names_their_layouts(caplog):
    """Early copies of a layout still streaming write into its host copy; a reload that then fails (its wait
    raises) leaves those ranges holding the step's bytes: the store says so, naming the layouts, and re-raises."""
    rt = FailingWaitRuntime("cpu")
    m, opt, store, _, _ = _offloaded(rt)
    store.reload()
    store.offload()
    rt.fail = True
    store.reload(stream=True)
    last = list(m)[-1]
    assert store.copy_early([*last.parameters(), *(opt.state[p]["exp_avg"] for p in last.parameters())]) > 0
    with caplog.at_level("ERROR"), pytest.raises(RuntimeError, match="illegal memory access"):
        store.finish_reload()
    logged = [r.getMessage() for r in caplog.records if "failed after early copies" in r.getMessage()]
    assert len(logged) == 1 and "params" in logged[0] and "optimizer" in logged[0]
