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
        """Always: the CPU is there."""
        return True

    def current_device(self):
        """``"cpu"``: what verl passes to ``model.to``."""
        return "cpu"

    def device_count(self) -> int:
        """One device."""
        return 1

    def set_device(self, device_index) -> None:
        """Nothing to select."""
        pass

    def synchronize(self, device_index=None) -> None:
        """Nothing to wait for: CPU work is synchronous."""
        pass

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """No allocator settings on the CPU."""
        pass

    def empty_cache(self) -> None:
        """No cache to empty."""
        pass

    def communication_backend_name(self) -> str:
        """Gloo, torch's CPU backend."""
        return "gloo"

    def get_device_capability(self, device_index=0):
        """No compute capability."""
        return (None, None)

    def is_ipc_supported(self) -> bool:
        """No CUDA IPC."""
        return False

    def nvtx_range(self, msg):
        """No NVTX: an empty context."""
        return contextlib.nullcontext()

    def profiler_start(self) -> None:
        """No device profiler."""
        pass

    def profiler_stop(self) -> None:
        """No device profiler."""
        pass

    def ray_noset_envvars(self):
        """No device variables for Ray to leave alone."""
        return []

    def ray_resource_name(self) -> str:
        """Ray's CPU resource."""
        return "CPU"

    def visible_devices_envvar(self) -> str:
        """The variable verl reads (unused on the CPU)."""
        return "CUDA_VISIBLE_DEVICES"

    def cudart(self):
        """No CUDA runtime."""
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
