"""Helpers the multi-GPU jobs share (imported inside spawned processes)."""
from __future__ import annotations

import torch


def suspend_unavailable() -> str | None:
    """Why NCCL suspend/resume cannot run in this process (None when it can)."""
    import torch.distributed as dist

    if dist.get_backend() != "nccl":
        return "the job runs on Gloo (TIMESHARE_MULTIGPU_ON_GLOO): no NCCL communicators"
    from refimpl.torch_runtime.nccl_validation import NcclOffloadUnavailableError, require_offload_nccl

    try:
        require_offload_nccl()
    except NcclOffloadUnavailableError as e:
        return " ".join(line.strip() for line in str(e).splitlines() if line.strip())  # the whole reason, one line
    return None


def group_sums(rt, names, timeout_s: float = 60.0) -> dict[str, int]:
    """all_reduce(SUM) of 1 on every member group, on the runtime's device: the group size if it works."""
    out = {}
    for name in names:
        if rt.is_member(name):
            t = torch.ones(1, device=rt.device)
            rt.run(rt.all_reduce(t, group=name, timeout_s=timeout_s))
            out[name] = int(t.item())
    return out


def gather_ranks(rt, group: str, timeout_s: float = 60.0) -> list[int] | None:
    """All-gather every member's rank over ``group`` on the device (the weight sync's collective)."""
    if not rt.is_member(group):
        return None
    out = torch.empty(rt.group_size(group), dtype=torch.int64, device=rt.device)
    rt.run(rt.all_gather_into_tensor(out, torch.tensor([rt.rank], device=rt.device), group, timeout_s=timeout_s))
    return out.tolist()
