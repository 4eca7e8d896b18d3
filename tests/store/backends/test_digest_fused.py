"""The content digest's fused row sums ([Note: the fused row sums] in refimpl/store/backends/digest.py): a kind
(the Triton kernel, the compiled sums) is taken only if it gives the eager sums exactly on the probe, never off CUDA
or when turned off; on a GPU the digest with each equals the eager digest bit for bit on every kind of tensor."""
from __future__ import annotations

import pytest
import torch

from refimpl.store.backends import digest as dg
from refimpl.store.backends.digest import (DIGEST_ROW, FUSED_KINDS, checked_row_sums, choose_row_sums,
                                           content_digest, eager_row_sums, fused_row_sums)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_probe_takes_exact_sums_and_refuses_any_other():
    """The eager sums pass; sums in int64 wrapped to int32 are the same numbers and pass; sums of words in another
    order of weights (rows reversed), or a dropped last column, are refused."""
    cpu = torch.device("cpu")
    assert checked_row_sums(eager_row_sums, cpu)
    assert checked_row_sums(lambda r, w: torch.sum(r.to(torch.int64) * w, dim=1).to(torch.int32), cpu)
    assert not checked_row_sums(lambda r, w: eager_row_sums(r.flip(1), w), cpu)
    assert not checked_row_sums(lambda r, w: eager_row_sums(r[:, :-1], w[:-1]), cpu)


def test_off_cuda_or_turned_off_the_eager_sums_are_used(monkeypatch):
    """No compiled sums for a CPU (or meta) device; with TIMESHARE_DIGEST_FUSED=0 none on any device, decided once
    per device until the weights are released."""
    dg.release_digest_weights()
    assert fused_row_sums(torch.device("cpu")) is None
    monkeypatch.setenv("TIMESHARE_DIGEST_FUSED", "0")
    assert fused_row_sums(torch.device("cuda", 0)) is None
    assert dg._FUSED == {"cpu": None, "cuda:0": None}
    dg.release_digest_weights()
    assert dg._FUSED == {}


def test_a_kind_that_fails_to_build_or_gives_other_sums_is_passed_over_with_a_warning(monkeypatch, caplog):
    """Kinds are tried in order: one that raises while building (no Triton, no compiler) and one whose sums differ
    on the probe are each refused with a warning naming the kind and why; the next kind that gives the exact sums is
    taken; when none does, the eager sums are used and a warning says so."""
    def build(kind):
        if kind == "triton":
            raise ImportError("no triton here")
        if kind == "compile":
            return lambda r, w: eager_row_sums(r, w) + 1  # off by one in every row
        return eager_row_sums

    monkeypatch.setattr(dg, "build_row_sums", build)
    cpu = torch.device("cpu")
    with caplog.at_level("WARNING", logger=dg.__name__):
        assert choose_row_sums(("triton", "compile", "exact"), cpu) is eager_row_sums
    assert "no triton row sums" in caplog.text and "no triton here" in caplog.text
    assert "the compile row sums differ" in caplog.text and "eager row sums are used" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger=dg.__name__):
        assert choose_row_sums(("triton", "compile"), cpu) is None
    assert "the eager row sums are used" in caplog.text


def test_writing_into_a_slice_is_probed_too():
    """Row sums that write into a given ``out`` (the Triton kernel's way in the digest) are refused when what they
    write there is wrong or spills past the slice, even though their returned sums are right."""
    def spills(rows, weights, out=None):
        got = eager_row_sums(rows, weights)
        if out is not None:
            out.copy_(got)
            out.as_strided((out.numel() + 1,), (1,))[-1] = 1  # one slot past the slice
        return got

    def ignores_out(rows, weights, out=None):
        return eager_row_sums(rows, weights)

    exact = lambda rows, weights, out=None: eager_row_sums(rows, weights) if out is None else out.copy_(  # noqa: E731
        eager_row_sums(rows, weights))
    cpu = torch.device("cpu")
    for fn, ok in ((spills, False), (ignores_out, False), (exact, True)):
        fn.writes_into = True
        assert checked_row_sums(fn, cpu) is ok, fn


def test_the_setting_names_one_kind_none_or_all_and_a_typo_raises(monkeypatch):
    """``TIMESHARE_DIGEST_FUSED``: unset or 1 tries every kind in order, 0 none, a kind's name only that kind;
    anything else is a ValueError that lists the choices (a typo must not silently pick the slow path)."""
    tried = []
    monkeypatch.setattr(dg, "choose_row_sums", lambda kinds, device: tried.append(tuple(kinds)))
    for value, kinds in (("1", FUSED_KINDS), ("0", ()), ("compile", ("compile",)), (" Triton ", ("triton",))):
        dg.release_digest_weights()
        monkeypatch.setenv("TIMESHARE_DIGEST_FUSED", value)
        fused_row_sums(torch.device("cuda", 0))
        assert tried[-1] == kinds, value
    dg.release_digest_weights()
    monkeypatch.setenv("TIMESHARE_DIGEST_FUSED", "tritn")
    with pytest.raises(ValueError, match="TIMESHARE_DIGEST_FUSED='tritn'.*triton, compile"):
        fused_row_sums(torch.device("cuda", 0))
    assert dg._FUSED == {}
    dg.release_digest_weights()


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_the_fused_digest_equals_the_eager_one_on_the_gpu(kind, monkeypatch):
    """On the GPU each kind of fused sums is taken (Triton ships with CUDA torch) and the digest with it equals the
    eager digest on tensors of every kind: whole rows, a short last row, uint8 words (a size not a multiple of 4),
    bf16, a view that starts inside a flat buffer, an empty and a one-word tensor; a changed word still shows."""
    dev = torch.device("cuda")
    dg.release_digest_weights()
    monkeypatch.setenv("TIMESHARE_DIGEST_FUSED", kind)
    assert fused_row_sums(dev) is not None
    g = torch.Generator(device="cpu").manual_seed(5)
    flat = torch.randn(DIGEST_ROW * 4099 + 5, generator=g).to(dev)
    tensors = [flat, flat[3:3 + DIGEST_ROW * 17 + 11], torch.randn(DIGEST_ROW * 2, generator=g).to(dev),
               torch.randint(0, 255, (4 * DIGEST_ROW + 3,), dtype=torch.uint8, generator=g).to(dev),
               torch.randn(1000, 333, generator=g).to(dev).to(torch.bfloat16), torch.empty(0, device=dev),
               torch.ones(1, device=dev), torch.randn(1 << 22, generator=g).to(dev)]
    fused = content_digest(tensors)
    dg._FUSED[str(dev)] = None  # the eager path for the same bytes
    try:
        eager = content_digest(tensors)
    finally:
        dg.release_digest_weights()
    assert torch.equal(fused.cpu(), eager.cpu())
    changed = flat.clone()
    changed.view(torch.int32)[DIGEST_ROW * 2000 + 5] += 1
    assert not torch.equal(content_digest([changed]).cpu(), content_digest([flat]).cpu())


@CUDA
@pytest.mark.cuda
def test_the_digest_never_makes_the_host_wait_on_the_gpu():
    """Once its weights and fused sums exist, a digest of CUDA tensors queues its work without one host
    synchronization (torch's sync debug mode raises on any), so a ``copy_early`` in a backward hook does not stall
    the autograd engine; its hashes equal those of the same bytes digested on the CPU."""
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(11)
    host = [torch.randn(DIGEST_ROW * 300 + 7, generator=g), torch.randn(1 << 20, generator=g),
            torch.randint(0, 255, (DIGEST_ROW + 1,), dtype=torch.uint8, generator=g), torch.ones(3)]
    on_gpu = [t.to(dev) for t in host]
    content_digest(on_gpu)  # builds the row weights, the index weights and the fused sums (these may wait)
    torch.cuda.synchronize(dev)
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = content_digest(on_gpu)
        got = content_digest(on_gpu[::-1])  # the same tensor count, another order: nothing new to build
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got.cpu(), content_digest(host[::-1]))


@CUDA
@pytest.mark.cuda
def test_the_triton_kernel_refuses_what_it_would_read_wrong():
    """The kernel reads row-major int32 rows and weights of the row's width: a transposed view, another dtype,
    weights of another width or an ``out`` of the wrong size raise ValueError instead of reading the wrong bytes."""
    from refimpl.store.backends.digest_kernel import triton_row_sums
    dev = torch.device("cuda")
    rows = torch.arange(4 * DIGEST_ROW, dtype=torch.int32, device=dev).view(4, DIGEST_ROW)
    weights = dg._row_weights(dev)
    assert torch.equal(triton_row_sums(rows, weights), eager_row_sums(rows, weights))
    for bad in (lambda: triton_row_sums(rows.t(), weights[:4]), lambda: triton_row_sums(rows.float(), weights),
                lambda: triton_row_sums(rows, weights[:-1]),
                lambda: triton_row_sums(rows, weights, out=torch.empty(3, dtype=torch.int32, device=dev))):
        with pytest.raises(ValueError, match="triton_row_sums needs"):
            bad()
