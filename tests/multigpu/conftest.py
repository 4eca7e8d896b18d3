"""The ``multigpu`` tests: real protocols on N GPUs of one host, one NCCL process per GPU.

Every test here is marked ``multigpu`` and skipped, saying why, unless this machine has two or
more CUDA GPUs. The ``gpus`` fixture launches the test's job on N processes (N = the GPU count, or
``TIMESHARE_MULTIGPU_WORLD``), each with ``torch.distributed`` initialised on NCCL and its own GPU,
as ``tests/_dist.py`` does with Gloo for the CPU suite.

``TIMESHARE_MULTIGPU_ON_GLOO=1`` runs the jobs on 2 CPU processes with Gloo instead (a check of the
test code on a machine without GPUs, not a GPU result): the parts that need NCCL (suspend/resume,
device memory) report themselves skipped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import torch

from tests._dist import run_distributed

ON_GLOO = os.environ.get("TIMESHARE_MULTIGPU_ON_GLOO", "").lower() in ("1", "true", "yes")


def gpu_count() -> int:
    """CUDA GPUs visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = None
    if not ON_GLOO and gpu_count() < 2:
        skip = pytest.mark.skip(reason=f"needs 2+ CUDA GPUs, found {gpu_count()} "
                                       "(TIMESHARE_MULTIGPU_ON_GLOO=1 checks the test code on CPU)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.multigpu)
            if skip is not None:
                item.add_marker(skip)


@dataclass(frozen=True)
class GpuWorld:
    """How the ``gpus`` fixture launches jobs: ``world_size`` processes on ``backend``."""

    world_size: int
    backend: str

    @property
    def nccl(self) -> bool:
        return self.backend == "nccl"

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 300.0,
            env: dict[str, str] | None = None) -> list[Any]:
        """``fn(rank, world_size, *args)`` on every rank; results in rank order (a rank's error fails the test)."""
        env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", **(env or {})}
        return run_distributed(fn, self.world_size, args, timeout=timeout, env=env, backend=self.backend)


@pytest.fixture(scope="session")
def gpus() -> GpuWorld:
    """The launcher of multi-GPU jobs (see the module docstring)."""
    if ON_GLOO:
        return GpuWorld(int(os.environ.get("TIMESHARE_MULTIGPU_WORLD", "2")), "gloo")
    return GpuWorld(int(os.environ.get("TIMESHARE_MULTIGPU_WORLD", str(gpu_count()))), "nccl")
