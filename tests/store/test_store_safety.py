"""Issue 14: the store never loses data. One test per row of the issue's table (single process).

Each row was found by using the store as a new user would; each test failed before the fix (the
crashing ones killed the process, which is why they run the touching in a child process).
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import torch

from refimpl.torch_runtime import TorchRuntime
from refimpl.runtime.base import Completion, CopyKind
from refimpl.store import (
    Category,
    OffloadedTensorError,
    OffloadStore,
    StoreConfig,
    StoreStateError,
    TensorChangedError,
    UnattachedAliasError,
    UnsupportedTensorError,
    is_parked,
)
from refimpl.store.debug import DEBUG_ENV
from refimpl.worker import WorkerStateControl, auto_offload

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(8 + i, generator=g) for i in range(n)}


# --------------------------------------------------------------------------- two threads


def test_two_threads_offloading_and_reloading_one_store_lose_nothing():
    tensors = {f"w{i}": torch.randn(64) for i in range(128)}
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, tensors, name="params")
    errors = []

    def work():
        try:
            for _ in range(20):
                store.offload()
                store.reload()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.reload()
    assert not store.is_offloaded("params") and store.in_progress is None
    assert all(torch.equal(tensors[k], want[k]) for k in want), "every tensor's bytes are back"


class _ReentrantRuntime(TorchRuntime):
    """A real CPU runtime that calls back into the store from inside its offload (a hook gone wrong)."""

    store = None
    seen: list = []

    async def point(self, name):
        if name == "store.offload.wait" and self.store is not None:
            try:
                self.store.reload()
            except StoreStateError as e:
                self.seen.append(str(e))


def test_a_second_operation_from_the_same_thread_is_refused_not_deadlocked():
    rt = _ReentrantRuntime("cpu")
    store = OffloadStore(rt)
    t = torch.ones(4)
    store.attach_tensors(Category.PARAMS, {"t": t}, name="p")
    rt.store, rt.seen = store, []
    store.offload()
    assert len(rt.seen) == 1 and "reload while offload is in progress" in rt.seen[0]
    assert store.is_offloaded("params") and store.in_progress is None
    rt.store = None
    store.reload()
    assert torch.equal(t, torch.ones(4))


class _PausingRuntime(TorchRuntime):
    """A real CPU runtime whose offload stops at its wait until ``gate`` opens (reading the store's stats there,
    on the operation's own thread)."""

    store = None
    gate = inside = None
    seen: list = []

    async def point(self, name):
        if name == "store.offload.wait" and self.gate is not None:
            self.seen.append(self.store.stats().offloaded)
            self.inside.set()
            self.gate.wait(10)


def test_stats_from_another_thread_wait_for_the_operation_in_progress():
    """A worker thread's stats read while another thread offloads (a threaded Ray actor's call ending beside one
    that moves the state) waits for the operation, instead of iterating the offloaded categories as they change
    ("Set changed size during iteration"); on the operation's own thread it reads at once."""
    rt = _PausingRuntime("cpu")
    store = OffloadStore(rt)
    store.attach_tensors(Category.PARAMS, {"t": torch.ones(4)}, name="p")
    rt.store, rt.gate, rt.inside, rt.seen = store, threading.Event(), threading.Event(), []
    op = threading.Thread(target=store.offload)
    op.start()
    assert rt.inside.wait(10)
    got = []
    reader = threading.Thread(target=lambda: got.append(store.stats().offloaded))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and got == []  # held until the offload ends
    rt.gate.set()
    op.join(10)
    reader.join(10)
    assert "params" in got[0] and len(rt.seen) == 1  # after it, whole; inside it, on its thread, at once
    rt.gate = None
    store.reload()


# --------------------------------------------------------------------------- non-resizable storages


def test_non_resizable_tensor_after_a_normal_one_is_refused_before_anything_moves():
    normal = torch.arange(6.0)
    from_numpy = torch.from_numpy(np.arange(4, dtype=np.float32))
    from_dlpack = torch.utils.dlpack.from_dlpack(torch.arange(3.0).__dlpack__())
    for odd, name in ((from_numpy, "np"), (from_dlpack, "dl")):
        store = OffloadStore(TorchRuntime("cpu"))
        store.attach_tensors(Category.PARAMS, {"normal": normal, name: odd}, name="t")
        with pytest.raises(UnsupportedTensorError, match=rf"t\.{name}: its storage is not resizable"):
            store.offload()
        assert not store.is_offloaded("params") and not is_parked(normal)
        assert torch.equal(normal, torch.arange(6.0)), "the earlier tensor was not released"


# --------------------------------------------------------------------------- unattached aliases


def test_parameters_viewing_a_flat_buffer_that_is_not_attached_are_refused_naming_both():
    flat = torch.arange(40.0)
    lin = torch.nn.Linear(4, 8)
    with torch.no_grad():  # Megatron-style: every parameter's data is a view of one flat buffer
        lin.weight.data = flat[:32].view(8, 4)
        lin.bias.data = flat[32:40]
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(lin, name="lin")
    with pytest.raises(UnattachedAliasError, match=r"lin\.weight.*lin\.bias.*1 tensor object.*shape \(40,\)"):
        store.offload()
    assert torch.equal(flat, torch.arange(40.0)) and not is_parked(lin.weight)
    # attached as well, the whole storage and every alias come back
    store.attach_tensors(Category.PARAMS, {"flat": flat}, name="buffer", kind="ddp_buffer")
    store.offload()
    assert is_parked(flat) and is_parked(lin.weight)
    store.reload()
    assert torch.equal(flat, torch.arange(40.0))
    assert lin.weight.untyped_storage()._cdata == flat.untyped_storage()._cdata
    with torch.no_grad():
        flat[0] = -1
    assert lin.weight[0, 0] == -1, "the parameters alias the buffer again"


def test_a_use_held_outside_python_that_goes_at_once_is_waited_for_and_one_that_stays_is_refused(monkeypatch):
    """A view held only by C++ (a collective's work object keeps its tensors on the backend's thread for a moment
    after ``wait()``; here the view einsum's autograd node saves, made in C++) is not an alias the caller holds: the
    offload waits for it to go (a timer thread drops it 50 ms in), then moves everything, exact after the reload. One
    that stays is refused after the wait, nothing moved; a view Python can reach is refused at once, without it."""
    import threading
    import time

    from refimpl.store.state import grouping

    w = torch.arange(16.0)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, {"w": w}, name="p")
    kept = w[2:6]  # a view Python holds: refused without waiting
    polls, real_sleep = [], time.sleep
    monkeypatch.setattr(grouping.time, "sleep", lambda s: polls.append(s) or real_sleep(s))
    with pytest.raises(UnattachedAliasError, match=r"p\.w.*shape \(4,\)"):
        store.offload()
    assert not polls and not is_parked(w)
    del kept
    c = torch.ones(4, 4, requires_grad=True)
    held = [torch.einsum("ij,jk->ik", w.view(4, 4), c)]  # saves a view of w made in C++: no Python object shows it
    monkeypatch.setattr(grouping.settles, "__defaults__", (0.05,))
    with pytest.raises(UnattachedAliasError, match=r"p\.w.*1 tensor object.*not reachable from Python"):
        store.offload()
    assert polls and not is_parked(w) and torch.equal(w, torch.arange(16.0))
    monkeypatch.setattr(grouping.settles, "__defaults__", (2.0,))
    timer = threading.Timer(0.05, held.clear)
    timer.start()
    try:
        store.offload()
    finally:
        timer.cancel()
    assert is_parked(w) and not held
    store.reload()
    assert torch.equal(w, torch.arange(16.0))


def test_a_view_of_the_stores_flat_buffer_kept_across_an_offload_is_parked_not_left_dangling(caplog):
    tensors = _state(4)
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, tensors, name="p")
    store.offload()
    store.reload()
    kept = tensors["w1"].view(3, 3)  # e.g. a state_dict() taken after the reload and held
    with caplog.at_level("WARNING", logger="refimpl.store.store"):
        store.offload()
    assert "Tensor of shape (3, 3)" in caplog.text and "parked" in caplog.text
    assert is_parked(kept) and kept.shape == (3, 3), "safe to hold, never a crash"
    with pytest.raises(OffloadedTensorError, match=r"a view of shape \(3, 3\) of params/float32 kept across an offload"):
        kept.sum()
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)


def test_uncovered_bytes_of_a_storage_come_back_whole():
    base = torch.arange(20.0)
    part = base[5:10]
    del base  # only the slice is left: the storage's other bytes are covered by no tensor
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, {"part": part}, name="p")
    store.offload()
    store.reload()
    assert torch.equal(part, torch.arange(5.0, 10.0))
    assert part._base is None or part.untyped_storage().nbytes() >= 5 * 4


# --------------------------------------------------------------------------- touching offloaded tensors

_TOUCH = textwrap.dedent("""
    import sys, torch
    from refimpl.torch_runtime import TorchRuntime
    from refimpl.store import OffloadStore, OffloadedTensorError
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 16)).sum().backward()
    opt.step()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.attach_optimizer(opt)
    store.offload()
    touches = {
        "sum": lambda: model.weight.sum(),
        "repr": lambda: repr(model.weight),
        "step": lambda: opt.step(),
        "state_dict": lambda: [v.sum() for v in model.state_dict().values()],
        "optim_state": lambda: [v.sum() for s in opt.state.values() for v in s.values()],
        "forward": lambda: model(torch.ones(2, 16)),
    }
    for name, touch in touches.items():
        try:
            out = touch()
            print(name, "ok", out.replace(chr(10), " ") if isinstance(out, str) else "")
        except OffloadedTensorError as e:
            print(name, "OffloadedTensorError", str(e).replace(chr(10), " "))
        except RuntimeError as e:
            print(name, "RuntimeError", str(e).replace(chr(10), " ")[:80])
    print("shape", tuple(model.weight.shape), model.weight.dtype, model.weight.device)
    store.reload()
    w = model.weight.detach()
    print("after_reload", bool(torch.isfinite(w).all()) and float(w.sum()) == float(w.clone().sum()))
""")


def _touch(debug):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop(DEBUG_ENV, None)
    if debug:
        env[DEBUG_ENV] = "1"
    return subprocess.run([sys.executable, "-c", _TOUCH], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("debug", [False, True], ids=["default", "debug"])
def test_touching_offloaded_tensors_never_kills_the_process_and_raises_naming_the_tensor(debug):
    proc = _touch(debug)
    assert proc.returncode == 0, f"the process died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["shape"] == "(8, 16) torch.float32 cpu", "metadata stays readable"
    assert lines["after_reload"] == "True"
    for name in ("sum", "step", "state_dict", "optim_state", "forward"):
        assert lines[name].startswith("OffloadedTensorError"), (name, lines[name])
        assert "reload() first" in lines[name]
        assert ("offloaded at <string>" in lines[name]) == debug, "debug mode adds where it was offloaded"
    assert "model.weight" in lines["sum"] and "optim.state." in lines["optim_state"]
    assert lines["repr"].startswith("ok Parameter containing: <offloaded tensor model.weight: shape (8, 16)"), \
        "repr() says it is offloaded (debuggers and loggers call it): no NaN, no exception"


def test_the_guard_names_the_tensor_and_goes_away_on_reload():
    p = torch.nn.Parameter(torch.ones(3, 2))
    t = torch.arange(4.0)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, {"p": p, "t": t}, name="m")
    store.offload()
    with pytest.raises(OffloadedTensorError, match=r"m\.p is offloaded.*reload\(\) first"):
        p.sum()
    with pytest.raises(OffloadedTensorError, match=r"m\.t"):
        t + 1
    assert p.shape == (3, 2) and isinstance(p, torch.nn.Parameter) and t.dtype == torch.float32
    store.reload()
    assert type(p) is torch.nn.Parameter and type(t) is torch.Tensor
    assert "_timeshare_parked" not in p.__dict__, "nothing of the guard stays on a reloaded tensor"
    assert torch.equal(p, torch.ones(3, 2)) and torch.equal(t + 1, torch.arange(1.0, 5.0))


# --------------------------------------------------------------------------- nested auto_offload


class _Worker:
    def __init__(self):
        self.rt = TorchRuntime("cpu")
        self.model = torch.nn.Linear(4, 2)
        store = OffloadStore(self.rt)
        store.attach_module(self.model)
        self.state = WorkerStateControl(store)
        self.inner_saw_resident = None

    @auto_offload
    def outer(self, x):
        y = self.inner(x)
        return y + self.model(x).sum()  # uses the state after the inner call returned

    @auto_offload
    def inner(self, x):
        self.inner_saw_resident = not self.state.offloaded
        return self.model(x).sum()


def test_nested_auto_offload_moves_state_only_around_the_outer_call():
    w = _Worker()
    x = torch.ones(3, 4)
    want = 2 * w.model(x).sum()
    w.state.offload_states()
    out = w.outer(x)
    assert torch.equal(out, want) and w.inner_saw_resident
    assert w.state.offloaded and w.state.users == 0
    assert w.state.store.stats().reloads == 1 and w.state.store.stats().offloads == 2


def test_auto_offload_from_two_threads_keeps_the_state_resident_while_either_call_runs():
    w = _Worker()
    x = torch.ones(3, 4)
    want = w.model(x).sum()
    w.state.offload_states()
    seen, errors = [], []

    def call():
        try:
            for _ in range(10):
                seen.append(torch.equal(w.inner(x), want))
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and seen == [True] * 20, "no call ran on offloaded state"
    assert w.state.offloaded and w.state.users == 0


# --------------------------------------------------------------------------- recovery after TensorChangedError


def test_recover_after_a_tensor_changed_gives_every_byte_back():
    tensors = _state(6)
    want = {k: v.clone() for k, v in tensors.items()}
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors(Category.PARAMS, tensors, name="p")
    store.offload()
    tensors["w2"].data = torch.zeros(3)  # the framework re-assigned it while offloaded
    with pytest.raises(TensorChangedError, match=r"p\.w2.*recover\(\)"):
        store.reload()
    assert store.is_offloaded("params")
    with pytest.raises(StoreStateError, match=r"p\.w0 is offloaded by an offload store.*reload\(\)"):
        fresh = OffloadStore(TorchRuntime("cpu"))  # what the old advice said to do
        fresh.attach_tensors(Category.PARAMS, tensors, name="p")
        fresh.offload()
    assert store.recover() == ["p.w2 now has other storage (12 bytes; was it re-assigned?)"]
    assert all(torch.equal(tensors[k], want[k]) for k in want)
    store.offload()
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)


# --------------------------------------------------------------------------- rollback after an early release


class _Failed(Completion):
    """A copy that ran but reports failure when awaited (what a CUDA error surfaces as)."""

    def __init__(self, n):
        self.n = n

    def done(self):
        return False

    def __await__(self):
        raise RuntimeError(f"injected copy failure at D2H copy {self.n}")
        yield  # pragma: no cover


class _FailingCopies(TorchRuntime):
    """A real CPU runtime whose ``fail_at``-th device-to-host copy fails when awaited (injected fault)."""

    def __init__(self, fail_at):
        super().__init__("cpu")
        self.fail_at, self.d2h = fail_at, 0

    def copy_async(self, dst, src, kind):
        done = super().copy_async(dst, src, kind)
        if kind is CopyKind.D2H:
            self.d2h += 1
            if self.d2h == self.fail_at:
                dst.fill_(float("nan")) if dst.dtype.is_floating_point else None  # the host copy is not to be trusted
                return _Failed(self.d2h)
        return done


@pytest.mark.parametrize("consolidated", [False, True], ids=["first_offload", "steady"])
def test_a_copy_failing_after_early_releases_restores_the_released_storages(consolidated, caplog):
    rt = _FailingCopies(fail_at=10**9)
    tensors = {f"w{i}": torch.randn(4096) for i in range(8)}  # 16 KiB each: copied one by one
    want = {k: v.clone() for k, v in tensors.items()}
    cfg = StoreConfig(pack_below_bytes=1024, segment_bytes=16384, pin_ahead="off")
    store = OffloadStore(rt, config=cfg)
    store.attach_tensors(Category.PARAMS, tensors, name="p")
    if consolidated:
        store.consolidate()
    rt.fail_at = rt.d2h + 5
    with caplog.at_level("WARNING", logger="refimpl.store.store"):
        with pytest.raises(RuntimeError, match="injected copy failure"):
            store.offload()
    assert not store.is_offloaded("params")
    if not consolidated:  # scattered: storages are released as their copies complete
        assert "offload failed after 4 storage(s) were released early" in caplog.text
    assert not any(is_parked(t) for t in tensors.values())
    assert all(torch.equal(tensors[k], want[k]) for k in want), "every released storage came back"
    rt.fail_at = 10**9
    store.offload()
    store.reload()
    assert all(torch.equal(tensors[k], want[k]) for k in want)
