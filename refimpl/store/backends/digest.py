"""A position-dependent hash of tensors' raw bytes, computed where they live (the device), exact on every rank.

[Note: content digest]
Two uses compare bytes without moving them: ``local_dedup``'s replica check (members of a replica group
must hold the same bytes at the same places, or the reload's all-gather silently rewrites a member's
replica: :mod:`refimpl.store.backends.dedup`) and the early copies' check at the offload (the device bytes
of a range copied early must be the bytes copied, whatever wrote them: :mod:`refimpl.store.moves.early`).
Both need any difference of content *or position* to show: two embedding rows swapped, a shift by a whole
row of any width.

The bytes are read as int32 words (uint8 for a size that is not a multiple of 4) in rows of 1,021. Word
``j`` of row ``b`` gets the weight ``R[j] * B[b]``, ``R`` and ``B`` odd pseudo-random numbers of their index
(splitmix64's mixer, fixed seeds): ``S[b] = sum_j w[b, j] * R[j]`` in int32 (one multiply and one row sum
per chunk of rows, wrapping), then ``h = sum_b S[b] * B[b]`` in int64 (wrapping), twice, with two seeds for
``B``. Wrapping integer arithmetic is exact in any order, so equal bytes hash equally on every rank and
device. What it guarantees: a change of one word always changes both hashes (its weight is odd and the
change is less than 2**32); any other difference (words moved, rows swapped, several words changed) is
missed with a probability of about 2**-32 when confined to one row (its ``S[b]`` must wrap to the same
value), less when it spans rows, whatever its structure, since no shift or permutation keeps the weights.
(The column sums used before summed rows with equal weights: rows swapped, or a shift by a multiple of
1,021 words, hashed the same.)

Cost: per word, an int32 multiply (read 4 bytes, write 4) and a row sum (read 4): about three reads of the
data, against one for the column sums; chunks of 16 Mi words bound the device memory it takes (64 MiB).
Meta and empty tensors hash to zeros.

[Note: the fused row sums]
Eagerly the multiply and the row sum are two kernels and a temporary: on an H200 the digest read 146 GiB/s, 12.6
times a clone of the same bytes, and the early copies' two digests made the one-GPU switch cost 1.19 x the copies
instead of 0.42 x (bench/results/2026-12-05-h200-pending/). On a CUDA device the row sums are one kernel (multiply
and sum fused, no temporary, the sums written in place), of the first kind of :data:`FUSED_KINDS` that builds and
passes a probe: a hand-written Triton kernel (:mod:`refimpl.store.backends.digest_kernel`; a tile of whole rows per
program), else :func:`eager_row_sums` through ``torch.compile``. Triton's integer arithmetic wraps as torch's does.
A kind is used only if it gives the eager function's exact sums on a probe of random words (several row counts, an
unaligned start, the sums written into a slice); otherwise, or where it does not build (no Triton, no compiler),
the next kind or the eager sums are used and a warning says why. On an H200 the Triton kernel took the 8 GiB digest
from 12.5 ms (eager) to 8.6 ms, 929 GiB/s (``torch.compile``: 15.3 ms); ranges in the early copies' shape ran at 565
GiB/s, the host's work (about 0.15 ms a tensor) included (an H100: 10.3 ms and 477 GiB/s). A kernel reading the rows
as one run of words in aligned blocks, each row's part added atomically, was no faster there and is not kept.
``TIMESHARE_DIGEST_FUSED`` picks: ``1`` (default, every kind in order), ``0`` (eager), or one kind by name. The
build (a Triton compile, once per process and device) is paid at the store's first reload (:meth:`~refimpl.store.moves.early.EarlyCopies.prepare`), or at the first
digest where no store built it first (``local_dedup``'s replica check); ``python bench/gpu/digest_variants.py``
prints each kind's build time and cost. Two threads deciding at once both build and keep either result: both passed
the probe.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Sequence

import torch

logger = logging.getLogger(__name__)

DIGEST_ROW = 1021
"""Words per row of the digest's 2-D view (a prime)."""
_CHUNK_ROWS = max(1, (16 << 20) // DIGEST_ROW)  # rows multiplied at once: about 16 Mi words
_BATCH = 4096  # tensors whose row sums are held at once

_M64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """``x`` (mod 2**64) as a signed 64-bit value (torch's int64)."""
    x &= _M64
    return x - (1 << 64) if x >> 63 else x


_GOLDEN, _MIX1, _MIX2 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)
_SEEDS = (_signed(0x243F6A8885A308D3), _signed(0x13198A2E03707344), _signed(0xA4093822299F31D0))


def _shift_right(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 ``z`` by ``k`` bits (torch's ``>>`` is arithmetic)."""
    return torch.bitwise_and(torch.bitwise_right_shift(z, k), (1 << (64 - k)) - 1)


def mix(index: torch.Tensor, seed: int) -> torch.Tensor:
    """Odd pseudo-random int64 weights of int64 ``index`` (splitmix64's mixer on ``index * golden + seed``)."""
    z = index * _GOLDEN + seed
    z = torch.bitwise_xor(z, _shift_right(z, 30)) * _MIX1
    z = torch.bitwise_xor(z, _shift_right(z, 27)) * _MIX2
    z = torch.bitwise_xor(z, _shift_right(z, 31))
    return torch.bitwise_or(z, 1)


def mix_reference(index: int, seed: int) -> int:
    """:func:`mix` of one index in plain Python (unsigned 64-bit), to check the device arithmetic against."""
    z = (index * (_GOLDEN & _M64) + (seed & _M64)) & _M64
    z = ((z ^ (z >> 30)) * (_MIX1 & _M64)) & _M64
    z = ((z ^ (z >> 27)) * (_MIX2 & _M64)) & _M64
    return (z ^ (z >> 31)) | 1


_ROW_WEIGHTS: dict[str, torch.Tensor] = {}


def _row_weights(device: torch.device) -> torch.Tensor:
    """``R``: the odd int32 weights of a row's words (one tensor per device, kept)."""
    key = str(device)
    w = _ROW_WEIGHTS.get(key)
    if w is None:
        r = mix(torch.arange(DIGEST_ROW, dtype=torch.int64), _SEEDS[0])
        w = _ROW_WEIGHTS[key] = torch.bitwise_or(r.to(torch.int32), 1).to(device)
    return w


def release_digest_weights() -> None:
    """Drop the cached row weights (device memory) and the decision on fused row sums; the next
    :func:`content_digest` makes both again."""
    _ROW_WEIGHTS.clear()
    _INDEX_WEIGHTS.clear()
    _FUSED.clear()


def _words(t: torch.Tensor) -> torch.Tensor | None:
    """``t``'s raw bytes as int32 words (uint8 when the size is not a multiple of 4); None for meta or empty."""
    if t.device.type == "meta" or t.numel() == 0:
        return None
    raw = t.detach().reshape(-1)
    raw = raw.contiguous().view(torch.uint8) if raw.dtype != torch.bool else raw.view(torch.uint8)
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw


def _row_count(words: torch.Tensor) -> int:
    return -(-words.numel() // DIGEST_ROW)


RowSums = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def eager_row_sums(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``S[b] = sum_j rows[b, j] * weights[j]`` in int32, wrapping (two kernels and a temporary)."""
    return torch.sum(rows * weights, dim=1, dtype=torch.int32)


_FUSED: dict[str, RowSums | None] = {}


def checked_row_sums(candidate: RowSums, device: torch.device) -> bool:
    """Whether ``candidate`` gives :func:`eager_row_sums`' exact sums on ``device`` for a probe of random int32
    words: several row counts, from an aligned and from an unaligned start (what a slice of a flat buffer gives)."""
    g = torch.Generator(device="cpu").manual_seed(20261205)
    words = torch.randint(-(2 ** 31), 2 ** 31 - 1, (300 * DIGEST_ROW + 3,), dtype=torch.int32, generator=g)
    words = words.to(device)
    weights = _row_weights(device)
    for start, rows in ((0, 1), (0, 7), (1, 37), (3, 299), (0, 300)):
        part = words[start:start + rows * DIGEST_ROW].view(rows, DIGEST_ROW)
        want = eager_row_sums(part, weights)
        if not torch.equal(candidate(part, weights), want):
            return False
        if getattr(candidate, "writes_into", False):  # the path the digest takes: sums written into a slice
            into = torch.zeros(rows + 2, dtype=torch.int32, device=device)
            candidate(part, weights, out=into[1:1 + rows])
            if not (torch.equal(into[1:1 + rows], want) and not into[0] and not into[-1]):
                return False
    return True


FUSED_KINDS = ("triton", "compile")
"""The fused row sums tried, in order: the hand-written Triton kernel (:mod:`refimpl.store.backends.digest_kernel`),
then :func:`eager_row_sums` through ``torch.compile``."""


def _fused_kinds() -> tuple[str, ...]:
    """The kinds ``TIMESHARE_DIGEST_FUSED`` asks for: unset or ``1`` all of :data:`FUSED_KINDS` in order, ``0`` none,
    or one kind by name; anything else raises ValueError (a typo must not silently change the path)."""
    value = os.environ.get("TIMESHARE_DIGEST_FUSED", "1").strip().lower()
    if value in ("", "1"):
        return FUSED_KINDS
    if value == "0":
        return ()
    if value in FUSED_KINDS:
        return (value,)
    raise ValueError(f"TIMESHARE_DIGEST_FUSED={value!r}: expected 1 (any fused row sums), 0 (eager), or one of "
                     f"{', '.join(FUSED_KINDS)}")


def build_row_sums(kind: str) -> RowSums:
    """The fused row sums of ``kind`` (one of :data:`FUSED_KINDS`), unchecked; raises where they cannot be built
    (ImportError without Triton). :func:`fused_row_sums` probes what this returns before using it."""
    if kind == "triton":
        from refimpl.store.backends.digest_kernel import triton_row_sums
        return triton_row_sums
    if kind == "compile":
        return torch.compile(eager_row_sums, dynamic=True, fullgraph=True)
    raise ValueError(f"no fused row sums of kind {kind!r}; expected one of {', '.join(FUSED_KINDS)}")


def choose_row_sums(kinds: Sequence[str], device: torch.device) -> RowSums | None:
    """The first of ``kinds`` whose row sums build and give the eager sums exactly on ``device``'s probe, or None
    (the eager sums); each kind refused is a warning that says why, and so is falling back to the eager sums."""
    for kind in kinds:
        try:
            candidate = build_row_sums(kind)
            if checked_row_sums(candidate, device):
                return candidate
            logger.warning("content digest: the %s row sums differ from the eager ones on %s; not used", kind,
                           device)
        except Exception as e:  # noqa: BLE001 - any failure to build a kernel leaves the next kind or the eager path
            logger.warning("content digest: no %s row sums on %s (%s: %s)", kind, device, type(e).__name__, e)
    if kinds:
        logger.warning("content digest: the eager row sums are used on %s (slower, same hashes)", device)
    return None


def fused_row_sums(device: torch.device) -> RowSums | None:
    """The fused row sums for ``device`` ([Note: the fused row sums]), or None where the eager ones are used:
    not CUDA, ``TIMESHARE_DIGEST_FUSED=0``, or no kind that builds and gives the eager sums exactly on the probe.
    The kinds of :data:`FUSED_KINDS` are tried in order (or the one ``TIMESHARE_DIGEST_FUSED`` names); each
    failure is a warning. Decided once per process and device."""
    key = str(device)
    if key in _FUSED:
        return _FUSED[key]
    fn = choose_row_sums(_fused_kinds() if device.type == "cuda" else (), device)
    _FUSED[key] = fn
    return fn


def _row_sums_into(out: torch.Tensor, words: torch.Tensor, weights: torch.Tensor) -> None:
    """Write ``S[b] = sum_j words[b, j] * R[j]`` (int32, wrapping) of ``words`` in rows of 1,021 into ``out``
    (one slot per row, the last row possibly short): all rows in one call where the sums are fused, else a chunk of
    rows at a time (the eager temporary bounded)."""
    rows, tail = divmod(words.numel(), DIGEST_ROW)
    fused = fused_row_sums(words.device) if words.dtype == torch.int32 else None
    step = max(rows, 1) if fused is not None else _CHUNK_ROWS
    for a in range(0, rows, step):
        b = min(rows, a + step)
        part = words[a * DIGEST_ROW:b * DIGEST_ROW].view(b - a, DIGEST_ROW)
        if fused is not None and getattr(fused, "writes_into", False):
            fused(part, weights, out=out[a:b])  # the sums written in place: no copy kernel per tensor
        elif fused is not None:
            out[a:b] = fused(part, weights)
        else:
            torch.sum(part * weights, dim=1, dtype=torch.int32, out=out[a:b])
    if tail:
        torch.sum(words[rows * DIGEST_ROW:] * weights[:tail], dim=0, keepdim=True, dtype=torch.int32,
                  out=out[rows:rows + 1])


_INDEX_WEIGHTS: dict[str, torch.Tensor] = {}


def _index_weights(device: torch.device, rows: int) -> torch.Tensor:
    """``B``: the int64 weights of row indices ``0 .. rows - 1`` for the two hashes (a ``(2, capacity)`` tensor per
    device, made on the device and kept; grown by doubling)."""
    key = str(device)
    table = _INDEX_WEIGHTS.get(key)
    if table is None or table.shape[1] < rows:
        cap = max(rows, 2 * (table.shape[1] if table is not None else 0), 1 << 14)
        index = torch.arange(cap, dtype=torch.int64, device=device)
        table = _INDEX_WEIGHTS[key] = torch.stack([mix(index, _SEEDS[1]), mix(index, _SEEDS[2])])
    return table


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``; on CUDA through pinned memory without waiting for the device
    (the caching host allocator keeps the pinned block until the copy has run)."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.int64, device=device)
    return torch.tensor(values, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)


def content_digest(tensors: Sequence[torch.Tensor], *, device: torch.device | None = None) -> torch.Tensor:
    """Two 64-bit hashes per tensor of its raw bytes (``[h1, h2]`` for each, in order), computed where each tensor
    lives and gathered on ``device`` (default: the first tensor's); see [Note: content digest].

    Equal bytes give equal hashes on every rank and device; a changed word always changes them; words moved or
    rows swapped change them but with a probability of about 2**-32 per row they touch. The row sums of up to
    4,096 tensors are combined at once, so a tensor costs one kernel (fused row sums) or two per 16 Mi words, plus
    one for a short last row. The work is queued on each device's current stream and the host never waits for it
    (where the tensors are on ``device``): the result is ready when that stream's work is.
    """
    dev = device or (tensors[0].device if tensors else torch.device("cpu"))
    out = torch.zeros(len(tensors), 2, dtype=torch.int64, device=dev)
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        words = _words(t)
        if words is not None:
            by_device.setdefault(words.device, []).append((i, words))
    for d, items in by_device.items():
        weights = _row_weights(d)
        for lo in range(0, len(items), _BATCH):
            part = items[lo:lo + _BATCH]
            counts = [_row_count(words) for _, words in part]
            total = sum(counts)
            sums = torch.empty(total, dtype=torch.int32, device=d)
            at = 0
            for (_, words), n in zip(part, counts):
                _row_sums_into(sums[at:at + n], words, weights)
                at += n
            # each row's tensor (slot) and index in it, made on the device from the counts: no host wait
            meta = _to_device(counts + [i for i, _ in part], d)
            count_d, slot_d = meta[:len(part)], meta[len(part):]
            owner = torch.repeat_interleave(torch.arange(len(part), device=d), count_d, output_size=total)
            row = torch.arange(total, dtype=torch.int64, device=d) - (torch.cumsum(count_d, 0) - count_d)[owner]
            terms = sums.to(torch.int64).unsqueeze(1) * _index_weights(d, max(counts))[:, row].t()
            acc = torch.zeros(len(tensors), 2, dtype=torch.int64, device=d)
            acc.index_add_(0, slot_d[owner], terms)
            out += acc if d == dev else acc.to(dev)
    return out.view(-1)


__all__ = ["DIGEST_ROW", "FUSED_KINDS", "build_row_sums", "checked_row_sums", "choose_row_sums", "content_digest",
           "eager_row_sums", "fused_row_sums", "mix", "mix_reference", "release_digest_weights"]
