"""Workers for the Ray cluster tests: each rank a real Gloo process group and a model in an OffloadStore.

Imported by the actors by name (the tests put the repository on the actors' PYTHONPATH)."""
from __future__ import annotations

import os
import threading
import time
import types

import torch
import torch.distributed as dist

from refimpl.store import OffloadStore
from refimpl.torch_runtime import TorchRuntime
from refimpl.worker import RoleWorker, WorkerStateControl, register


def batch(x: torch.Tensor, **meta) -> types.SimpleNamespace:
    """A batch with ROLL's ``meta_info`` dict."""
    return types.SimpleNamespace(x=x, meta_info=dict(meta))


class InterruptibleStore(OffloadStore):
    """An OffloadStore whose next offload, once armed, is interrupted as it starts, as Ctrl-C or a cancelled
    call would interrupt it (``KeyboardInterrupt``, before any byte moved)."""

    armed = False

    async def offload_async(self, *args, **kwargs):
        """The store's offload, or ``KeyboardInterrupt`` once after :attr:`armed` was set."""
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt("planted interrupt as the offload starts")
        return await super().offload_async(*args, **kwargs)


class ToyWorker(RoleWorker):
    """A linear model per rank, its process group formed from the address the cluster handed in."""

    @register
    def setup(self, seed: int, interruptible: bool = False) -> tuple[int, int]:
        """Form the role's Gloo group (``env://``: the cluster's MASTER_ADDR/PORT, RANK, WORLD_SIZE)."""
        torch.set_num_threads(1)
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="env://")
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(16, 4)
        self.bumps = 0
        store = (InterruptibleStore if interruptible else OffloadStore)(TorchRuntime("cpu"))
        store.attach_module(self.model)
        self.state_control = WorkerStateControl(store)
        self.gates: dict[str, threading.Event] = {}
        return dist.get_rank(), dist.get_world_size()

    @register
    def forward(self, b) -> tuple[bool, torch.Tensor]:
        """(state resident during the call, the output summed over the role's ranks)."""
        out = self.model(b.x).detach()
        dist.all_reduce(out)
        return not self.state_control.offloaded, out

    @register
    def nested(self, b) -> list[tuple[bool, torch.Tensor]]:
        """Calls ``forward`` twice from inside a registered call: one reload, one offload in all."""
        return [self.forward(b), self.forward(b)]

    @register
    def hold(self, key: str) -> bool:
        """Stay inside a managed call until ``release(key)``; True if the state stayed resident throughout."""
        gate = self.gates.setdefault(key, threading.Event())
        ok = gate.wait(30)
        return ok and not self.state_control.offloaded

    @register(offload=False)
    def release(self, key: str) -> None:
        """Let ``hold(key)`` return."""
        self.gates.setdefault(key, threading.Event()).set()

    @register(offload=False)
    def weights(self) -> torch.Tensor:
        """The weight's values (reloaded for the read and put back where they were)."""
        ctl = self.state_control
        was = ctl.offloaded
        ctl.reload_states()
        w = self.model.weight.detach().clone()
        if was:
            ctl.offload_states()
        return w

    @register
    def fail(self, rank: int, how: str) -> torch.Tensor:
        """On ``rank``: raise (``"raise"``) or exit the process (``"exit"``) mid-call; the others run a collective."""
        if self.rank == rank:
            if how == "exit":
                os._exit(3)
            raise ValueError(f"planted failure on rank {rank}")
        t = torch.ones(1)
        if how != "raise_alone":
            dist.all_reduce(t)  # waits for the failed rank: never completes
        return t

    @register
    def bump(self, fail_rank: int | None = None) -> int:
        """One update of the state (the bias grows by one) on every rank but ``fail_rank``, which raises."""
        if self.rank == fail_rank:
            raise ValueError(f"planted failure of bump on rank {fail_rank}")
        with torch.no_grad():
            self.model.bias.add_(1.0)
        self.bumps += 1
        return self.bumps

    @register(offload=False)
    def bump_count(self) -> int:
        """How many bumps this rank has applied."""
        return self.bumps

    @register(offload=False)
    def sleep(self, seconds: float) -> None:
        """Keep the actor busy for ``seconds`` (later calls queue behind it on a single-threaded actor)."""
        time.sleep(seconds)

    @register(offload=False)
    def interrupt_next_offload(self, rank: int) -> None:
        """On ``rank``: the next offload of the store raises ``KeyboardInterrupt`` as it starts."""
        if self.rank == rank:
            self.state_control.store.armed = True
