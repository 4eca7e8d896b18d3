"""Host-to-device copies made by a few SMs reading pinned host memory, leaving the copy engine to others.

[Note: copies on SMs]
The copy engine serves the copies queued on one stream before another
stream's ([Note: paced copies] in :mod:`refimpl.torch_runtime.copy_stream`):
while a streamed reload's gigabytes are queued on it, every pinned
host-to-device copy the training step makes (FSDP2's in backward) waits for
all of them. Pinned host memory is readable from kernels at its host address
where the device has unified addressing (``cudaHostAlloc`` memory always;
``cudaHostRegister``-ed memory, the store's, where the device can use host
pointers for registered memory, as Hopper on x86 can), so a kernel of a few
programs can make the copy instead: it reads over PCIe, writes to device
memory, and the copy engine stays free. On one H200
(``bench/gpu/sm_copy_probe.py``, 8 GB in 64 MiB pieces): 8 programs 48.8
GB/s, 16 to 132 programs 50.7 GB/s (the copy engine 54.8 GB/s), bitwise; with
16 or 32 programs copying, a 716 KiB pinned copy on the compute stream is done
after 0.2 ms instead of 144 ms. The cost: the kernel takes SMs and memory
bandwidth from the step it runs beside (a step bound by the host leaves both
idle).

:class:`SmCopier` runs the kernel (Triton; one launch per at most 2**30
words). It takes a copy only in the one shape the kernel is built for, so
that nothing is compiled again inside a switch: a pinned, contiguous host
source into a contiguous device destination of the same bytes, both at
16-byte-aligned addresses, a whole number of 4-byte words (Triton specialises
a kernel per argument dtype and pointer alignment, and an earlier version
that also took byte-granular copies got a word kernel's stores on its byte
copies); anything else goes to the copy engine (the store's pieces are
aligned and whole words). Whether the device reads the host buffer is checked
at every launch (Triton refuses a pointer the device cannot read, before
anything is queued); a refusal, a warm-up copy that comes back different, or
no Triton turns it off with one warning, and the copy engine takes that copy
and every later one.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: 4-byte words per launch at most (offsets stay in 32 bits; a multiple of 4 words keeps every launch 16-byte aligned)
_MAX_ELEMENTS = 1 << 30
_BLOCK = 4096


def _build_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["n"])
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0) * BLOCK
        for start in range(pid * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)

    return _copy


class SmCopier:
    """Host-to-device copies by a Triton kernel of ``ctas`` programs (see [Note: copies on SMs])."""

    def __init__(self) -> None:
        self._kernel: Any = None
        #: False once a copy could not be made this way (no Triton, or the device cannot read the host buffer)
        self.usable = True
        #: copies made on SMs so far
        self.copies = 0

    def can_copy(self, dst: torch.Tensor, src: torch.Tensor) -> bool:
        """Whether :meth:`copy` may take this pair: a pinned contiguous host source, a contiguous device
        destination, the same dtype and size, both 16-byte aligned, a whole number of 4-byte words."""
        return (self.usable and src.device.type == "cpu" and dst.device.type == "cuda" and src.dtype == dst.dtype
                and src.numel() == dst.numel() and src.is_contiguous() and dst.is_contiguous()
                and (src.numel() * src.element_size()) % 4 == 0 and src.data_ptr() % 16 == 0
                and dst.data_ptr() % 16 == 0 and src.is_pinned())

    def copy(self, dst: torch.Tensor, src: torch.Tensor, ctas: int) -> bool:
        """Queue the copy on the current stream; False (nothing queued) if this device cannot make it."""
        if self._kernel is None:
            try:
                self._kernel = _build_kernel()
            except Exception as e:  # noqa: BLE001 - no Triton: the copy engine takes the copies
                return self._off(f"Triton is not available ({type(e).__name__}: {e})")
        s, d = _words(src), _words(dst)
        n = s.numel()
        if n == 0:
            return True
        try:
            for lo in range(0, n, _MAX_ELEMENTS):
                hi = min(n, lo + _MAX_ELEMENTS)
                self._kernel[(int(ctas),)](s[lo:hi], d[lo:hi], hi - lo, BLOCK=_BLOCK, num_warps=8)
        except (ValueError, RuntimeError) as e:
            # Triton checks every pointer before it launches: nothing of this launch is queued, and what earlier
            # launches of this copy queued the copy engine overwrites with the same bytes, later on the stream
            if "cannot be accessed" in str(e):
                return self._off(f"the device cannot read this pinned host memory directly ({e})")
            raise
        self.copies += 1
        return True

    def warm(self, device: torch.device) -> bool:
        """Build the kernel and run it once on a few pinned bytes (Triton compiles or loads it at its first launch);
        False if this device cannot copy this way (then :attr:`usable` is False)."""
        if not self.usable:
            return False
        src = torch.arange(64, dtype=torch.int32).pin_memory()
        dst = torch.empty(64, dtype=torch.int32, device=device)
        made = self.copies
        ok = self.copy(dst, src, 1)
        self.copies = made  # a warm-up, not a copy asked for
        if ok:
            torch.cuda.synchronize(device)
            if not torch.equal(dst.cpu(), src):
                return self._off("the warm-up copy came back different")
        return ok

    def _off(self, why: str) -> bool:
        self.usable = False
        logger.warning("host-to-device copies on SMs are off, the copy engine makes them: %s", why)
        return False


def _words(t: torch.Tensor) -> torch.Tensor:
    """A flat view of ``t``'s bytes as 4-byte words (:meth:`SmCopier.can_copy` admitted only such tensors)."""
    return t.reshape(-1).view(torch.uint8).view(torch.int32)


__all__ = ["SmCopier"]
