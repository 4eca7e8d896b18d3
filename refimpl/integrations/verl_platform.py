"""verl on a CPU-only machine (tests, dry runs): a CPU platform registered through verl's own plugin API.

verl 0.9.1 resolves its device through ``verl.plugin.platform.get_platform()``; with no accelerator it
falls back to its CUDA platform, and ``load_fsdp2_model_to_gpu`` then fails in
``torch.cuda.current_device()``. verl's documented extension point for other hardware is a
``PlatformBase`` subclass registered with ``PlatformRegistry.register`` and chosen with
``set_platform`` (or ``VERL_PLATFORM``). :func:`use_cpu_platform` registers one whose device is the CPU:
``current_device()`` answers ``"cpu"`` (verl passes it to ``model.to(...)``), ``empty_cache`` does
nothing, memory counters read 0 (verl's log lines call them). verl's offload functions themselves run unmodified.
"""
from __future__ import annotations

import contextlib
import types

import torch


_CPU_MODULE = types.SimpleNamespace(
    empty_cache=lambda: None, synchronize=lambda *a, **k: None, is_available=lambda: True,
    current_device=lambda: "cpu", device_count=lambda: 1, manual_seed=torch.manual_seed,
    manual_seed_all=torch.manual_seed, memory_allocated=lambda *a: 0, memory_reserved=lambda *a: 0,
    mem_get_info=lambda *a: (0, 0), max_memory_allocated=lambda *a: 0)


class _CPUPlatform:
    """The CPU as verl's device: the methods of verl's ``PlatformBase``, mixed in before it by
    :func:`use_cpu_platform` (verl is imported only there)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CPU_MODULE

    def is_available(self) -> bool:
        return True

    def current_device(self):
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index) -> None:
        pass

    def synchronize(self, device_index=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def communication_backend_name(self) -> str:
        return "gloo"

    def get_device_capability(self, device_index=0):
        return (None, None)

    def is_ipc_supported(self) -> bool:
        return False

    def nvtx_range(self, msg):
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_noset_envvars(self):
        return []

    def ray_resource_name(self) -> str:
        return "CPU"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def cudart(self):
        return None


def use_cpu_platform() -> None:
    """Make verl's platform the CPU in this process (before any verl function runs)."""
    from verl.plugin.platform import PlatformBase, PlatformRegistry, get_platform, set_platform

    if PlatformRegistry.get("cpu") is not None and get_platform().device_name == "cpu":
        return
    platform = PlatformRegistry.register(platform="cpu")(type("PlatformCPU", (_CPUPlatform, PlatformBase), {
        "__doc__": "The CPU as verl's device.", "__module__": __name__}))
    set_platform(platform())


__all__ = ["use_cpu_platform"]
