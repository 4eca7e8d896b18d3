"""The content digest's row sums as one hand-written Triton kernel ([Note: the fused row sums] in
:mod:`refimpl.store.backends.digest`).

Imported only where Triton is (CUDA builds of torch ship it); :func:`~refimpl.store.backends.digest.fused_row_sums`
takes the kernel only after it gave the eager sums exactly on a probe. Each program reads ``block_rows`` whole rows
(a row padded to the next power of two, masked), multiplies each word by its row weight and sums the row in int32,
wrapping as torch's integer arithmetic does: one read of the data, no temporary. The row width is a compile-time
constant (one build per width, in practice the digest's 1,021); nothing else is specialized (:func:`_jit_once`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _jit_once(fn):
    """``triton.jit`` with one build for every call: no specialization on the row count (Triton would build again
    for 1 and for multiples of 16) nor on the alignment of the words and the sums (a range of a flat buffer starts
    anywhere; rows of 1,021 words are never 16-byte aligned anyway). The probe then builds the only variant the
    digest runs, at the store's first reload and not inside a training step's backward."""
    try:
        return triton.jit(do_not_specialize=["rows"], do_not_specialize_on_alignment=["words_ptr", "out_ptr"])(fn)
    except TypeError:  # a Triton without do_not_specialize_on_alignment: the row count at least
        return triton.jit(do_not_specialize=["rows"])(fn)


@_jit_once
def _row_sums_kernel(words_ptr, weights_ptr, out_ptr, rows, ROW: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    pid = tl.program_id(0)
    r = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_C)
    rmask = r < rows
    cmask = c < ROW
    w = tl.load(weights_ptr + c, mask=cmask, other=0)
    x = tl.load(words_ptr + r[:, None] * ROW + c[None, :], mask=rmask[:, None] & cmask[None, :], other=0)
    tl.store(out_ptr + r, tl.sum(x * w[None, :], axis=1), mask=rmask)


def triton_row_sums(rows: torch.Tensor, weights: torch.Tensor, *, out: torch.Tensor | None = None,
                    block_rows: int = 8, num_warps: int = 8) -> torch.Tensor:
    """``S[b] = sum_j rows[b, j] * weights[j]`` in int32, wrapping, for a row-major ``(n, width)`` int32 ``rows``
    and ``width`` int32 ``weights`` on one CUDA device: one kernel on the current stream, the host does not wait.
    The sums go into ``out`` (``n`` contiguous int32 on the same device) when given, else into a new tensor.

    Raises ValueError for anything else (another dtype, a strided view, weights of another width or device)
    rather than copying it silently.
    """
    if rows.dim() != 2 or rows.dtype != torch.int32 or weights.dtype != torch.int32:
        raise ValueError(f"triton_row_sums needs 2-D int32 rows and int32 weights, got {tuple(rows.shape)} "
                         f"{rows.dtype} and {weights.dtype}")
    n, width = rows.shape
    if not (rows.stride(1) == 1 and (n <= 1 or rows.stride(0) == width)):
        raise ValueError(f"triton_row_sums needs row-major rows, got strides {rows.stride()} for {tuple(rows.shape)}")
    if weights.shape != (width,) or not weights.is_contiguous() or weights.device != rows.device:
        raise ValueError(f"triton_row_sums needs {width} contiguous weights on {rows.device}, got "
                         f"{tuple(weights.shape)} on {weights.device}")
    if out is None:
        out = torch.empty(n, dtype=torch.int32, device=rows.device)
    elif out.shape != (n,) or out.dtype != torch.int32 or not out.is_contiguous() or out.device != rows.device:
        raise ValueError(f"triton_row_sums needs out of {n} contiguous int32 on {rows.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    if n:
        grid = (triton.cdiv(n, block_rows),)
        _row_sums_kernel[grid](rows, weights, out, n, ROW=width, BLOCK_R=block_rows,
                               BLOCK_C=triton.next_power_of_2(width), num_warps=num_warps)
    return out


triton_row_sums.writes_into = True  # the digest passes ``out`` (no copy of the sums per tensor)

__all__ = ["triton_row_sums"]
