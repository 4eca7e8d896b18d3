"""The content digest's fused row sums ([Note: the fused row sums] in refimpl/store/backends/digest.py): a compiled
function is taken only if it gives the eager sums exactly on the probe, never off CUDA or when turned off; on a GPU
the digest with them equals the eager digest bit for bit on every kind of tensor it meets."""
from __future__ import annotations

import pytest
import torch

from refimpl.store.backends import digest as dg
from refimpl.store.backends.digest import (DIGEST_ROW, checked_row_sums, content_digest, eager_row_sums,
                                           fused_row_sums)

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


def test_a_compile_that_fails_leaves_the_eager_sums_with_a_warning(monkeypatch, caplog):
    """Where torch.compile raises (no Triton, no compiler) the digest keeps working on the eager sums and says
    why; nothing is cached wrong for the device."""
    def broken(*a, **k):
        raise RuntimeError("no triton here")

    dg.release_digest_weights()
    monkeypatch.setattr(torch, "compile", broken)
    monkeypatch.delenv("TIMESHARE_DIGEST_FUSED", raising=False)
    with caplog.at_level("WARNING", logger=dg.__name__):
        assert fused_row_sums(torch.device("cuda", 7)) is None
    assert "no triton here" in caplog.text and "eager" in caplog.text
    dg.release_digest_weights()


@CUDA
@pytest.mark.cuda
def test_the_fused_digest_equals_the_eager_one_on_the_gpu():
    """On the GPU the compiled sums are taken (Triton ships with CUDA torch) and the digest with them equals the
    eager digest on tensors of every kind: whole rows, a short last row, uint8 words (a size not a multiple of 4),
    bf16, a view that starts inside a flat buffer, an empty and a one-word tensor; a changed word still shows."""
    dev = torch.device("cuda")
    dg.release_digest_weights()
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
