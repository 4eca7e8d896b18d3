"""The default switch policy, decided from the NCCL library loaded in this process.

The cheapest policy that holds no NCCL memory through the rollout: with NCCL
>= 2.29.7 (``ncclCommSuspend``/``ncclCommResume`` present in the *loaded*
library, :class:`refimpl.torch_runtime.nccl.NcclLibrary`) the planned suspend
(``SUSPEND_PLANNED``: the groups the weight sync needs are suspended, the
others destroyed) with its destroys walked together (``parallel_destroy``:
one proxy poll for all of them instead of one each); else ``DESTROY_DEFERRED``
(destroy at the pause, the port cooldown waited only if a rebuild comes before
it ends). ``PAUSED_LIVE`` is cheaper still but keeps every communicator's
memory through the rollout, so it is never the default. Without CUDA, or with
no NCCL loaded, the answer is ``DESTROY_DEFERRED`` (Gloo groups cannot suspend).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from refimpl.comm.states import PGPolicy
from refimpl.torch_runtime.nccl_loader import MIN_SUSPEND_VERSION, NcclNotLoadedError, format_version

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwitchPolicy:
    """A lifecycle policy, whether its destroys walk together, and why it was chosen."""

    policy: PGPolicy
    parallel_destroy: bool
    reason: str
    nccl_version: str | None = None


def default_switch_policy(device: torch.device | str | None = None) -> SwitchPolicy:
    """The default policy for groups on ``device`` (default: CUDA when available); see the module docstring."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return SwitchPolicy(PGPolicy.DESTROY_DEFERRED, False, f"groups on {dev.type}: no NCCL communicator to suspend")
    from refimpl.torch_runtime.nccl import NcclLibrary

    try:
        lib = NcclLibrary.load()
    except (NcclNotLoadedError, OSError) as e:
        return SwitchPolicy(PGPolicy.DESTROY_DEFERRED, False, f"no NCCL library loaded in this process ({e})")
    version = lib.version_string
    if lib.has_suspend_resume:
        return SwitchPolicy(PGPolicy.SUSPEND_PLANNED, True,
                            f"NCCL {version} >= {format_version(MIN_SUSPEND_VERSION)} can suspend", version)
    return SwitchPolicy(PGPolicy.DESTROY_DEFERRED, False,
                        f"NCCL {version} < {format_version(MIN_SUSPEND_VERSION)}: no suspend", version)


__all__ = ["SwitchPolicy", "default_switch_policy"]
