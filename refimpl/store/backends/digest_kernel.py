"""The content digest's row sums as hand-written Triton kernels ([Note: the fused row sums] in
:mod:`refimpl.store.backends.digest`).

Imported only where Triton is (CUDA builds of torch ship it); :func:`~refimpl.store.backends.digest.fused_row_sums`
takes a kernel only after it gave the eager sums exactly on a probe, and of the two here the one that ran faster on
the device (:func:`~refimpl.store.backends.digest.race_triton_kernels`). Both multiply each word by its column's
weight and sum each row in int32, wrapping as torch's integer arithmetic does: one read of the data, no temporary.

* :func:`triton_row_sums`: each program reads ``block_rows`` whole rows (a row padded to the next power of two,
  masked) and writes their sums.
* :func:`triton_flat_row_sums`: each program reads ``block`` consecutive words of the rows laid end to end (four
  words a load where the start is 16-byte aligned), works out each word's row and column from its index, and adds
  the part of each row it read into that row's sum atomically.

The row width is a compile-time constant (one build per width, in practice the digest's 1,021); the count is never
specialized on (:func:`_jit_once`, :func:`_jit_aligned`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def _jit_once(fn):
    """``triton.jit`` with one build for every call: no specialization on the count (the kernel's fourth argument;
    Triton would build again for 1 and for multiples of 16) nor on the alignment of the words and the sums (a range
    of a flat buffer starts anywhere; rows of 1,021 words are never 16-byte aligned anyway). The probe then builds
    the only variant the digest runs, at the store's first reload and not inside a training step's backward."""
    count = fn.__code__.co_varnames[3]
    try:
        return triton.jit(do_not_specialize=[count], do_not_specialize_on_alignment=["words_ptr", "out_ptr"])(fn)
    except TypeError:  # a Triton without do_not_specialize_on_alignment: the count at least
        return triton.jit(do_not_specialize=[count])(fn)


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


def _jit_aligned(fn):
    """``triton.jit`` without specialization on the count (the fourth argument) but with Triton's own on the
    pointers' 16-byte alignment: a kernel that reads its words as one run can then load four at a time from an
    aligned start; at most two builds (an aligned and an unaligned start), both made by the digest's probe."""
    return triton.jit(do_not_specialize=[fn.__code__.co_varnames[3]])(fn)


@_jit_aligned
def _flat_row_sums_kernel(words_ptr, weights_ptr, out_ptr, words, ROW: tl.constexpr, BLOCK: tl.constexpr,
                          SPAN: tl.constexpr):
    # words start .. start + BLOCK of the rows laid end to end; word j is at column c of the block's first row
    # plus local rows: weighed by R[column], summed per local row (at most SPAN) and added to that row's sum
    start = tl.program_id(0).to(tl.int64) * BLOCK
    j = tl.arange(0, BLOCK)
    x = tl.load(words_ptr + start + j, mask=j < words - start, other=0)
    row0 = start // ROW
    c0 = (start - row0 * ROW).to(tl.int32)
    local = (c0 + j) // ROW
    p = x * tl.load(weights_ptr + (c0 + j - local * ROW))
    last = (c0 + tl.minimum(words - start, BLOCK).to(tl.int32) - 1) // ROW
    one = tl.arange(0, 1)  # the sums as one-element tensors (Triton's interpreter sums to a scalar without wrapping)
    for k in tl.static_range(SPAN):
        if k <= last:
            tl.atomic_add(out_ptr + row0 + k + one, tl.sum(tl.where(local == k, p, 0), axis=0, keep_dims=True),
                          sem="relaxed")


def _check_rows(rows: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None) -> tuple[int, int]:
    """``(n, width)`` of row-major ``(n, width)`` int32 ``rows``; ValueError for anything else (another dtype, a strided
    view, weights of another width or device, an ``out`` that is not ``n`` contiguous int32 there)."""
    if rows.dim() != 2 or rows.dtype != torch.int32 or weights.dtype != torch.int32:
        raise ValueError(f"triton_row_sums needs 2-D int32 rows and int32 weights, got {tuple(rows.shape)} "
                         f"{rows.dtype} and {weights.dtype}")
    n, width = rows.shape
    if not (rows.stride(1) == 1 and (n <= 1 or rows.stride(0) == width)):
        raise ValueError(f"triton_row_sums needs row-major rows, got strides {rows.stride()} for {tuple(rows.shape)}")
    if weights.shape != (width,) or not weights.is_contiguous() or weights.device != rows.device:
        raise ValueError(f"triton_row_sums needs {width} contiguous weights on {rows.device}, got "
                         f"{tuple(weights.shape)} on {weights.device}")
    if out is not None and (out.shape != (n,) or out.dtype != torch.int32 or not out.is_contiguous()
                            or out.device != rows.device):
        raise ValueError(f"triton_row_sums needs out of {n} contiguous int32 on {rows.device}, got "
                         f"{tuple(out.shape)} {out.dtype} on {out.device}")
    return n, width


def triton_row_sums(rows: torch.Tensor, weights: torch.Tensor, *, out: torch.Tensor | None = None,
                    block_rows: int = 8, num_warps: int = 8) -> torch.Tensor:
    """``S[b] = sum_j rows[b, j] * weights[j]`` in int32, wrapping, for a row-major ``(n, width)`` int32 ``rows``
    and ``width`` int32 ``weights`` on one CUDA device: one kernel on the current stream, the host does not wait.
    The sums go into ``out`` (``n`` contiguous int32 on the same device) when given, else into a new tensor.

    Raises ValueError for anything else (another dtype, a strided view, weights of another width or device)
    rather than copying it silently.
    """
    n, width = _check_rows(rows, weights, out)
    if out is None:
        out = torch.empty(n, dtype=torch.int32, device=rows.device)
    if n:
        grid = (triton.cdiv(n, block_rows),)
        _row_sums_kernel[grid](rows, weights, out, n, ROW=width, BLOCK_R=block_rows,
                               BLOCK_C=triton.next_power_of_2(width), num_warps=num_warps)
    return out


triton_row_sums.writes_into = True  # the digest passes ``out`` (no copy of the sums per tensor)


def triton_flat_row_sums(rows: torch.Tensor, weights: torch.Tensor, *, out: torch.Tensor | None = None,
                         block: int = 4096, num_warps: int = 8) -> torch.Tensor:
    """The same sums as :func:`triton_row_sums`, from a kernel that reads the rows as one run of words: each program
    reads ``block`` consecutive words (whatever rows they belong to), weighs each by its column and adds the sum of
    each row it touches into that row's slot with an atomic add (int32, wrapping, so the order of the adds does not
    matter): no row padded to a power of two, no tile masked but the last, and four words a load from an aligned
start.

    It **adds** into ``out``, which the caller zeroes (the digest allocates its sums zeroed for it:
    ``accumulates``); with ``out=None`` a zeroed tensor is made. Raises ValueError as :func:`triton_row_sums`."""
    n, width = _check_rows(rows, weights, out)
    if out is None:
        out = torch.zeros(n, dtype=torch.int32, device=rows.device)
    if n:
        words = n * width
        span = -(-block // width) + 1  # the most rows ``block`` consecutive words can touch
        _flat_row_sums_kernel[(triton.cdiv(words, block),)](rows, weights, out, words, ROW=width, BLOCK=block,
                                                            SPAN=span, num_warps=num_warps)
    return out


triton_flat_row_sums.writes_into = True
triton_flat_row_sums.accumulates = True  # ``out`` must be zeroed: the kernel adds into it

__all__ = ["triton_flat_row_sums", "triton_row_sums"]
