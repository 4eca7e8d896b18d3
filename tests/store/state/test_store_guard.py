"""No silent wrong answers: an offloaded tensor raises ``OffloadedTensorError`` naming it and saying
``reload() first`` on every access but a metadata read, by default, on CPU and CUDA.

One test per row of the issue's table (each failed before the guard was on by default: the reads
returned NaN, most writes went through and were lost, ``opt.step()`` raised torch's aliasing error),
then the metadata that stays readable, the guard's seam for a streamed reload, and FSDP2 on two Gloo
processes. The isolation of one store's placeholders from another's is in test_store_placeholders.py.
"""
import pytest
import torch

from refimpl.store import OffloadedTensorError, OffloadStore
from refimpl.store.state.guard import guard, is_guarded, unguard
from refimpl.torch_runtime import TorchRuntime
from tests._dist import run_distributed

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


def _offloaded_model(device):
    """A trained two-layer model (its last bias has one element) and AdamW, attached and offloaded."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 1)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8, device=device)).sum().backward()
    opt.step()
    store = OffloadStore(TorchRuntime(device))
    store.attach_module(model)
    store.attach_optimizer(opt)
    want = [t.detach().clone() for t in _state(model, opt)]
    store.offload()
    return model, opt, store, want


def _state(model, opt):
    return [*model.parameters(), *(p.grad for p in model.parameters()),
            *(v for s in opt.state.values() for v in s.values())]


def _reloaded_bitwise(model, opt, store, want):
    store.reload()
    got = _state(model, opt)
    return len(got) == len(want) and all(type(t) in (torch.Tensor, torch.nn.Parameter) and torch.equal(t, w)
                                         for t, w in zip(got, want))


def _raises(name, use, func=""):
    with pytest.raises(OffloadedTensorError, match=rf"{name}[^;]* (is|are) offloaded.*{func}.*reload\(\) first"):
        use()


# --------------------------------------------------------------------------- the table's rows


@pytest.mark.parametrize("device", DEVICES)
def test_reading_an_offloaded_model_raises_naming_the_tensor_and_repr_says_offloaded(device):
    model, opt, store, want = _offloaded_model(device)
    w = model[0].weight
    _raises(r"model\.0\.weight", lambda: model(torch.ones(2, 8, device=device)), "linear")
    _raises(r"model\.0\.weight", w.sum, "sum")
    _raises(r"model\.0\.weight\.grad", lambda: w.grad.norm())
    _raises(r"optim\.state\.0\.exp_avg", lambda: opt.state[w]["exp_avg"].max())
    _raises(r"model\.2\.bias", lambda: model[2].bias.item())
    _raises(r"model\.0\.weight", lambda: torch.nn.utils.clip_grad_norm_([w], 1.0))
    for text in (repr(w), str(w), f"{w}", repr(w.grad), repr(model[2].bias)):
        assert "<offloaded tensor model." in text and "reload() first" in text, text
        assert "nan" not in text.lower(), "repr() says it is offloaded, never shows the placeholder's NaN"
    assert f"shape (6, 8), torch.float32, {w.device}" in repr(w)
    assert _reloaded_bitwise(model, opt, store, want)
    assert torch.isfinite(model(torch.ones(2, 8, device=device))).all(), "a forward works again after reload()"


@pytest.mark.parametrize("device", DEVICES)
def test_every_in_place_write_to_an_offloaded_tensor_raises_and_nothing_is_lost(device):
    model, opt, store, want = _offloaded_model(device)
    w, b1 = model[0].weight, model[2].bias  # b1: one element, which no zero-stride overlap check catches
    writes = {
        "fill_": lambda: w.fill_(1.0), "zero_": lambda: w.zero_(), "setitem": lambda: w.__setitem__(0, 1.0),
        "normal_": lambda: torch.nn.init.normal_(w), "kaiming": lambda: torch.nn.init.kaiming_uniform_(w),
        "zeros_": lambda: torch.nn.init.zeros_(b1), "add_": lambda: b1.add_(1.0), "copy_": lambda: b1.copy_(
            torch.ones(1, device=device)), "mul_grad": lambda: b1.grad.mul_(2), "resize_": lambda: w.resize_(100),
        "foreach": lambda: torch._foreach_add_([w, b1], 1.0), "out=": lambda: torch.add(b1, 1, out=b1),
    }
    for what, write in writes.items():
        with torch.no_grad(), pytest.raises(OffloadedTensorError, match=r"model\.[02]\.(weight|bias).*reload\(\) first"):
            write()
    assert _reloaded_bitwise(model, opt, store, want), "every write raised before touching a byte"


@pytest.mark.parametrize("device", DEVICES)
def test_optimizer_step_while_offloaded_names_the_offload_not_torchs_aliasing_error(device):
    model, opt, store, want = _offloaded_model(device)
    for step in (opt.step, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False).step,
                 lambda: opt.zero_grad(set_to_none=False)):
        with pytest.raises(OffloadedTensorError, match=r"(optim\.state\.0\.step|model\.0\.weight)[^;]* is offloaded.*"
                                                         r"reload\(\) first") as e:
            step()
        assert "clone" not in str(e.value)
    assert _reloaded_bitwise(model, opt, store, want)
    opt.step()  # and training goes on


# --------------------------------------------------------------------------- what stays allowed


def test_metadata_and_identity_stay_readable_while_offloaded():
    model, opt, store, want = _offloaded_model("cpu")
    w = model[0].weight
    assert (w.shape, w.dtype, w.device, w.requires_grad, w.is_leaf, w.grad_fn) == (
        (6, 8), torch.float32, torch.device("cpu"), True, True, None)
    assert (w.dim(), w.ndim, w.numel(), w.size(0), len(w), w.stride(), w.is_contiguous()) == (
        2, 2, 48, 6, 6, (0, 0), False)
    assert isinstance(w, torch.nn.Parameter) and is_guarded(w) and w.grad.shape == (6, 8)
    assert opt.state[w]["exp_avg"].shape == (6, 8), "hashing a parameter (optimizer state keys) works"
    assert w in set(model.parameters()) and "sum" in dir(w)
    w.requires_grad_(True)
    _raises(r"model\.0\.weight", lambda: w.data_ptr(), "data_ptr")  # no device address while offloaded
    _raises(r"model\.0\.weight", lambda: w.detach(), "detach")  # a detached view would read the placeholder
    assert _reloaded_bitwise(model, opt, store, want)


class _Logged(torch.Tensor):
    """A subclass with a torch-function protocol of its own (it counts the calls it sees)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_subclass_with_its_own_torch_function_is_guarded_and_gets_its_protocol_back_on_reload():
    t = torch.arange(4.0).as_subclass(_Logged)
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_tensors("params", {"t": t}, name="m")
    store.offload()
    _raises(r"m\.t", t.sum, "sum")
    assert t.shape == (4,) and isinstance(t, _Logged)
    store.reload()
    before = _Logged.calls
    assert type(t) is _Logged and float(t.sum()) == 6.0 and _Logged.calls > before, "its protocol runs again"


# --------------------------------------------------------------------------- the seam for a streamed reload


def test_on_access_runs_once_on_the_first_use_then_the_call_proceeds_unguarded():
    t, seen = torch.arange(6.0), []
    guard(t, "m.t", on_access=seen.append)
    assert t.shape == (6,) and t.dtype == torch.float32 and seen == [], "metadata reads do not trigger it"
    assert torch.equal(t + 1, torch.arange(1.0, 7.0)) and seen == [t], "called with the tensor, before the op"
    assert type(t) is torch.Tensor and not is_guarded(t) and "_timeshare_on_access" not in t.__dict__
    t.mul_(2)
    assert seen == [t] and torch.equal(t, torch.arange(0.0, 12.0, 2.0)), "later calls: a plain tensor"
    p = torch.nn.Parameter(torch.ones(2))
    guard(p, "m.p", on_access=seen.append)
    assert "tensor([1., 1.]" in repr(p) and type(p) is torch.nn.Parameter, "repr() waits too, then shows values"


def test_on_access_that_raises_keeps_the_guard_and_a_guard_without_one_blocks_the_call():
    def refuse(t):
        raise RuntimeError("copy failed")

    a, b, c = torch.ones(3), torch.ones(3), torch.ones(3)
    guard(a, "m.a", on_access=refuse)
    with pytest.raises(RuntimeError, match="copy failed"):
        a.sum()
    assert is_guarded(a), "the call raised: the tensor stays guarded"
    seen = []
    guard(b, "m.b", on_access=seen.append)
    guard(c, "m.c")
    with pytest.raises(OffloadedTensorError, match=r"m\.c is offloaded"):
        torch.add(b, c)
    assert seen == [] and is_guarded(b), "nothing ran: one argument is plainly offloaded"
    for x in (a, b, c):
        unguard(x)
    assert torch.equal(a + b + c, torch.full((3,), 3.0))


# --------------------------------------------------------------------------- FSDP2 (fully_shard, Gloo)


def _fsdp_rank(rank, world_size):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    opt.step()
    store = OffloadStore(TorchRuntime("cpu"))
    store.attach_module(model)
    store.attach_optimizer(opt)
    p = model[0].weight
    want = [t._local_tensor.clone() for t in (p, opt.state[p]["exp_avg"])]
    store.offload()
    exp_avg = opt.state[p]["exp_avg"]
    uses = {
        "sum": p.sum, "forward": lambda: model(x), "step": opt.step, "fill_": lambda: p.fill_(0.0),
        "setitem": lambda: p.__setitem__(0, 1.0), "init": lambda: torch.nn.init.normal_(p),
        "foreach": lambda: torch._foreach_mul_([p, exp_avg], 2.0), "copy_": lambda: exp_avg.copy_(exp_avg),
        "to_local": lambda: p.to_local().sum(), "full_tensor": lambda: p.full_tensor(),
        "local_add_": lambda: p._local_tensor.add_(1), "shard_data": lambda: exp_avg._local_tensor.zero_(),
        "all_reduce": lambda: dist.all_reduce(p._local_tensor),
    }
    out = {}
    for what, use in uses.items():
        try:
            with torch.no_grad() if what in ("fill_", "setitem", "init", "foreach", "copy_") else torch.enable_grad():
                use()
            out[what] = "ran"
        except OffloadedTensorError as e:
            out[what] = str(e)
    try:  # a ProcessGroup method called directly passes no __torch_function__: the read-only placeholder raises
        dist.group.WORLD.broadcast([exp_avg._local_tensor], dist.BroadcastOptions()).wait()
        out["pg"] = "ran"
    except RuntimeError as e:
        out["pg"] = str(e)
    out["meta"] = (tuple(p.shape), str(p.placements), p.requires_grad, tuple(p._local_tensor.shape))
    out["repr"] = repr(p)
    store.reload()
    out["back"] = all(torch.equal(t._local_tensor, w) for t, w in zip((p, opt.state[p]["exp_avg"]), want))
    model(x).sum().backward()
    opt.step()
    out["trains"] = bool(torch.isfinite(p.full_tensor()).all())
    return out


def test_fsdp2_parameters_and_their_local_shards_raise_on_every_use_while_offloaded():
    for rank, out in enumerate(run_distributed(_fsdp_rank, 2, timeout=180)):
        for what in ("sum", "forward", "step", "fill_", "setitem", "init", "foreach", "copy_", "to_local",
                     "full_tensor", "local_add_", "shard_data", "all_reduce"):
            msg = out[what]
            assert " offloaded: " in msg and "reload() first" in msg, (rank, what, msg)
            assert msg.startswith(("model.", "optim.state.")), (rank, what, msg)
        assert "data pointer" in out["pg"], out["pg"]
        assert out["meta"] == ((6, 8), "(Shard(dim=0),)", True, (3, 8)), "a DTensor's metadata stays readable"
        assert "<offloaded tensor model.0.weight" in out["repr"], out["repr"]
        assert out["back"] and out["trains"], rank


# --------------------------------------------------------------------------- the benchmark (bench/gpu/guard_cost.py)


def test_the_guard_cost_benchmark_runs_on_the_cpu_and_checks_every_cycle_bitwise(tmp_path, capsys):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "bench" / "gpu" / "guard_cost.py"
    spec = importlib.util.spec_from_file_location("guard_cost", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "guard_cost.json"
    assert bench.main(["--tiny", "--device", "cpu", "--cycles", "1", "--shapes", "dense", "--out", str(out)]) == 0
    (rec,) = json.loads(out.read_text())
    assert rec["bitwise"] and rec["steady_fast_offloads"] == 2 and rec["tensors"] == 84
    assert set(rec["cycle_ms"]) == {"guarded", "unguarded"} and "guard" in capsys.readouterr().out
    assert bench.main(["--overhead", "--device", "cpu", "--cycles", "1", "--shapes", "dense", "--numel", "8",
                       "--out", str(out)]) == 0
    (rec,) = json.loads(out.read_text())
    assert rec["tensors"] == 1164 and rec["calls_per_tensor"]["offload"] > 0, "the guard's calls are counted"
