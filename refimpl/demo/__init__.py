"""``timeshare demo``: one real offload/reload cycle of a small model on this machine.

Builds a small MLP language-model-like stack on the runtime's device (CUDA when
available, else CPU), runs one AdamW step so optimizer state exists, then
offloads parameters, gradients, buffers and optimizer state with the ``local``
store, reloads them, checks every byte and runs another step. Prints the
layouts, bytes, times, host memory pinned and device memory returned (on CPU
the "device" is host memory, so that figure is only indicative).
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from refimpl.cli_errors import one_line_errors

if TYPE_CHECKING:  # pragma: no cover - the demo imports these when it runs, not when the CLI is built
    import torch

    from refimpl.demo.model import DemoLM
    from refimpl.store import OffloadStore
    from refimpl.torch_runtime import TorchRuntime


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model size and device."""
    parser.add_argument("--device", default=None, help="cuda[:N] or cpu (default: cuda if available)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of the demo model")
    parser.add_argument("--layers", type=int, default=4, help="number of MLP blocks")
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary (tied embeddings)")


def _say(text: str) -> None:
    """Print one line of the report, wrapped to 100 columns (continuation lines indented)."""
    from refimpl.output import wrap

    print(wrap(text, indent=" " * (len(text) - len(text.lstrip()))))


@one_line_errors
def run(args: argparse.Namespace) -> int:
    """Build, step, offload, reload, verify, step; print what happened."""
    from refimpl.store import OffloadStore, StoreConfig
    from refimpl.torch_runtime import TorchRuntime

    _check_arguments(args)
    rt = TorchRuntime(args.device)
    model, opt, loss0 = _build_and_step(args, rt.device)
    store = OffloadStore(rt, config=StoreConfig())
    store.attach_module(model, name="model")
    store.attach_optimizer(opt, name="optim")
    before = _snapshot(model)
    _offload_and_report(args, rt, store, loss0)
    same, tied = _reload_and_verify(store, model, before)
    _train_and_cycle_again(args, rt.device, model, opt, store)
    store.close()
    return 0 if same and tied else 1


def _check_arguments(args: argparse.Namespace) -> None:
    """Refuse a device or a model size that cannot work (one line, exit 2: :mod:`refimpl.cli_errors`)."""
    from refimpl.cli_errors import check_number
    from refimpl.torch_runtime.device_check import check_device

    check_device(args.device)
    for opt, v in (("--hidden", args.hidden), ("--layers", args.layers), ("--vocab", args.vocab)):
        check_number(opt, v, lo=1, integer=True)


def _build_and_step(args: argparse.Namespace, device: torch.device) -> tuple[DemoLM, torch.optim.Optimizer, float]:
    """The demo model on ``device`` and its AdamW optimizer after one step (so optimizer state exists), and
    that step's loss."""
    import torch

    from refimpl.demo.model import DemoLM, step

    torch.manual_seed(0)
    model = DemoLM(args.vocab, args.hidden, args.layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt, step(model, opt, args.vocab, device, 0)


def _snapshot(model: DemoLM) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Copies of the model's state dict and gradients, to compare with after the reload."""
    return ({n: t.detach().clone() for n, t in model.state_dict(keep_vars=True).items()},
            [p.grad.clone() for p in model.parameters()])


def _offload_and_report(args: argparse.Namespace, rt: TorchRuntime, store: OffloadStore, loss0: float) -> None:
    """Offload everything attached; print the layouts, the bytes and time, the device memory returned and the
    host memory pinned."""
    rt.run(rt.synchronize())
    free0 = rt.memory_info().free
    store.offload()
    free1 = rt.memory_info().free
    s = store.stats()
    _say(f"device {rt.device}: DemoLM(vocab={args.vocab}, hidden={args.hidden}, layers={args.layers}), "
         f"one AdamW step done (loss {loss0:.4f})")
    _say("layouts:")
    for layout in sorted(store.layouts.values(), key=lambda lay: lay.key.sort_key()):
        _say(f"  {layout.describe()}")
    _say(f"offload: {s.last_offload_bytes / 2**30:.4f} GiB in {s.last_offload_s:.4f} s "
         f"({s.last_offload_bytes / max(s.last_offload_s, 1e-9) / 1e9:.2f} GB/s); copies {s.copies}")
    if rt.device.type == "cuda":
        returned = max(0, free1 - free0)  # the driver's free memory moves with other processes too
        _say(f"device memory returned per the driver: {returned / 2**30:.4f} GiB of {s.state_bytes / 2**30:.4f} GiB "
             "state")
    else:  # the host's free memory moves with everything else on the machine: no figure to report
        _say(f"CPU run: the state ({s.state_bytes / 2**30:.4f} GiB) was host memory already; no device memory to "
             "return (run on a GPU to see it)")
    _say(f"host pinned: {s.host_pinned_gb * 1e9 / 2**30:.4f} GiB in {s.registrations} registration(s); "
         f"{s.skipped_host_resident} host-resident optimizer step counter(s) left in place")


def _reload_and_verify(store: OffloadStore, model: DemoLM,
                       before: tuple[dict[str, torch.Tensor], list[torch.Tensor]]) -> tuple[bool, bool]:
    """Reload; print the bytes and time, whether every byte and the tied embedding came back, and how many flat
    buffers hold the parameters now. Returns (bit-exact, still tied)."""
    import torch

    store.reload()
    s = store.stats()
    _say(f"reload: {s.last_reload_bytes / 2**30:.4f} GiB in {s.last_reload_s:.4f} s "
         f"({s.last_reload_bytes / max(s.last_reload_s, 1e-9) / 1e9:.2f} GB/s)")
    state, grads = before
    after = model.state_dict(keep_vars=True)
    same = all(torch.equal(state[n], after[n]) for n in state)
    same = same and all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))
    tied = model.head.weight is model.emb.weight
    storages = len({p.untyped_storage().data_ptr() for p in model.parameters()})
    _say(f"bit-exact after reload: {same}; tied embedding still tied: {tied}; parameters now live in "
         f"{storages} flat buffer(s)")
    return same, tied


def _train_and_cycle_again(args: argparse.Namespace, device: torch.device, model: DemoLM,
                           opt: torch.optim.Optimizer, store: OffloadStore) -> None:
    """One more training step on the reloaded state, then a second offload and reload (which reuse the pinned
    buffers); print its loss and the registrations and reuses."""
    from refimpl.demo.model import step

    loss1 = step(model, opt, args.vocab, device, 1)
    _say(f"training continues: next step loss {loss1:.4f}")
    store.offload()
    store.reload()
    s = store.stats()
    _say(f"second cycle: {s.registrations} registrations, {s.reuses} reuses (pinned buffers reused)")


__all__ = ["add_arguments", "run"]
