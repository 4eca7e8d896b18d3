"""Drop-ins for verl's offload functions, and the one call that makes verl use them.

    import refimpl.integrations.verl as timeshare_verl
    timeshare_verl.patch()          # in every worker process, before training (or as a context manager)

or, for every process that imports verl (Ray workers included), one environment variable:
``VERL_USE_EXTERNAL_MODULES=refimpl.integrations.verl_autopatch`` (verl imports the modules it names
when it is imported).

The functions have verl's names, signatures and end states (:mod:`refimpl.integrations.verl_fsdp`,
:mod:`refimpl.integrations.verl_megatron`); each object's state moves through its own offload store
(:mod:`refimpl.integrations.stores`). :func:`patch` rebinds the names in the verl modules that import
them (:data:`FSDP_IMPORTERS`, :data:`MEGATRON_IMPORTERS`, read from verl 0.9.1's source) and in any
other loaded module that bound the originals, and wraps the verl engine methods that read parameters
or optimizer state while offloaded (:data:`STATE_READERS`) so that they load it first.
"""
from __future__ import annotations

import functools
import importlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from refimpl.integrations.errors import FrameworkMissingError
from refimpl.integrations.rebinding import Rebinding
from refimpl.integrations.stores import slot_of, store_of
from refimpl.integrations.verl_fsdp import (
    load_fsdp2_model_to_gpu,
    load_fsdp_model_to_gpu,
    load_fsdp_optimizer,
    offload_fsdp2_model_to_cpu,
    offload_fsdp_model_to_cpu,
    offload_fsdp_optimizer,
)
from refimpl.integrations.verl_megatron import (
    load_megatron_copy_params,
    load_megatron_model_to_gpu,
    load_megatron_optimizer,
    offload_megatron_copy_params,
    offload_megatron_model_to_cpu,
    offload_megatron_optimizer,
    register_megatron,
)

logger = logging.getLogger(__name__)

#: verl's FSDP functions and the drop-ins that replace them
FSDP_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "offload_fsdp_model_to_cpu": offload_fsdp_model_to_cpu,
    "offload_fsdp2_model_to_cpu": offload_fsdp2_model_to_cpu,
    "load_fsdp_model_to_gpu": load_fsdp_model_to_gpu,
    "load_fsdp2_model_to_gpu": load_fsdp2_model_to_gpu,
    "offload_fsdp_optimizer": offload_fsdp_optimizer,
    "load_fsdp_optimizer": load_fsdp_optimizer,
}
#: verl's Megatron functions and the drop-ins that replace them
MEGATRON_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "offload_megatron_model_to_cpu": offload_megatron_model_to_cpu,
    "load_megatron_model_to_gpu": load_megatron_model_to_gpu,
    "offload_megatron_copy_params": offload_megatron_copy_params,
    "load_megatron_copy_params": load_megatron_copy_params,
    "offload_megatron_optimizer": offload_megatron_optimizer,
    "load_megatron_optimizer": load_megatron_optimizer,
}
#: the module defining verl's FSDP functions, then the verl modules importing them by name (verl 0.9.1)
FSDP_IMPORTERS = ("verl.utils.fsdp_utils", "verl.workers.engine.fsdp.transformer_impl",
                  "verl.workers.engine.torchtitan.transformer_impl")
#: the module defining verl's Megatron functions, then the verl modules importing them by name (verl 0.9.1)
MEGATRON_IMPORTERS = ("verl.utils.megatron_utils", "verl.workers.engine.megatron.transformer_impl")
#: (module, class) -> methods that read the model or optimizer while verl leaves them offloaded; wrapped to
#: load first, and for the checkpoint methods to offload again afterwards what was offloaded before
STATE_READERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("verl.workers.engine.fsdp.transformer_impl", "FSDPEngine"):
        ("get_per_tensor_param", "get_per_tensor_param_shard", "save_checkpoint", "load_checkpoint"),
    ("verl.workers.engine.torchtitan.transformer_impl", "TorchTitanEngine"):
        ("get_per_tensor_param", "get_per_tensor_param_shard", "save_checkpoint", "load_checkpoint"),
}
#: methods of :data:`STATE_READERS` after which the state offloaded before goes back to the host
REOFFLOAD_AFTER = frozenset({"save_checkpoint", "load_checkpoint"})
#: verl's Megatron engine and the method after which its model and optimizer exist (for register_megatron)
MEGATRON_ENGINE = ("verl.workers.engine.megatron.transformer_impl", "MegatronEngine", "initialize")


@dataclass
class VerlPatch:
    """An active :func:`patch`: what was rebound (``"module.name"``), wrapped (``"Class.method"``) and
    skipped (module -> why it did not import). A context manager: leaving it calls :meth:`undo`."""

    rebinding: Rebinding = field(default_factory=Rebinding)
    rebound: list[str] = field(default_factory=list)
    wrapped: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def undo(self) -> None:
        """Put verl's functions and methods back (what :func:`unpatch` does)."""
        global _active
        with _patch_lock:
            self.rebinding.undo()
            if _active is self:
                _active = None

    def __enter__(self) -> "VerlPatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()


_active: VerlPatch | None = None
_patch_lock = threading.Lock()


def _engine_objects(engine: Any) -> tuple[list[Any], Any]:
    mods = getattr(engine, "module", None)
    mods = list(mods) if isinstance(mods, (list, tuple)) else ([mods] if mods is not None else [])
    return mods, getattr(engine, "optimizer", None)


def _offloaded(obj: Any, category: str) -> bool:
    store = store_of(obj) if obj is not None else None
    return store is not None and store.is_offloaded(category)


def state_loaded(method: Callable[..., Any], reoffload: bool) -> Callable[..., Any]:
    """Wrap an engine method so that it runs with the engine's model(s) and optimizer loaded when a drop-in
    offloaded them; with ``reoffload``, what was offloaded before is offloaded again afterwards."""

    @functools.wraps(method)
    def with_state_loaded(self: Any, *args: Any, **kwargs: Any) -> Any:
        mods, opt = _engine_objects(self)
        models = [m for m in mods if _offloaded(m, "params")]
        optimizer = opt if _offloaded(opt, "optimizer") else None
        for m in models:
            load_fsdp_model_to_gpu(m)
        if optimizer is not None:
            slot_of(optimizer).store.reload()
        try:
            return method(self, *args, **kwargs)
        finally:
            if reoffload:
                for m in models:
                    offload_fsdp_model_to_cpu(m)
                if optimizer is not None:
                    offload_fsdp_optimizer(optimizer)

    return with_state_loaded


def _registering(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def then_register(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = method(self, *args, **kwargs)
        module = getattr(self, "module", None)
        if module:
            register_megatron(module, getattr(self, "optimizer", None))
        return out

    return then_register


def _import(name: str, patch_: VerlPatch) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - an optional engine (torchtitan, megatron) missing its library
        patch_.skipped[name] = f"{type(e).__name__}: {e}"
        logger.info("verl patch: %s not patched (%s: %s)", name, type(e).__name__, e)
        return None


def _rebind(patch_: VerlPatch, importers: tuple[str, ...], functions: dict[str, Callable[..., Any]]) -> None:
    mods = [m for m in (_import(n, patch_) for n in importers) if m is not None]
    if not mods or mods[0].__name__ != importers[0]:
        return
    for name, new in functions.items():
        original = mods[0].__dict__.get(name)
        if original is None or original is new:
            continue
        patch_.rebound += patch_.rebinding.replace_everywhere(original, name, new, mods)


def _wrap_methods(patch_: VerlPatch) -> None:
    for (mod_name, cls_name), methods in STATE_READERS.items():
        mod = _import(mod_name, patch_)
        cls = getattr(mod, cls_name, None) if mod is not None else None
        for name in methods if cls is not None else ():
            if name in cls.__dict__:
                patch_.rebinding.replace(cls, name, state_loaded(cls.__dict__[name], name in REOFFLOAD_AFTER))
                patch_.wrapped.append(f"{cls_name}.{name}")
    mod_name, cls_name, name = MEGATRON_ENGINE
    mod = _import(mod_name, patch_) if mod_name not in patch_.skipped else None
    cls = getattr(mod, cls_name, None) if mod is not None else None
    if cls is not None and name in cls.__dict__:
        patch_.rebinding.replace(cls, name, _registering(cls.__dict__[name]))
        patch_.wrapped.append(f"{cls_name}.{name}")


def patch() -> VerlPatch:
    """Make verl use the drop-ins in this process: rebind its offload functions wherever they were imported
    by name, and wrap its engines' readers of offloaded state. Returns the active patch (the same one if
    already patched); :func:`unpatch` or leaving it as a context manager restores verl.

    Raises :class:`FrameworkMissingError` if ``verl.utils.fsdp_utils`` does not import. Modules of optional
    engines that do not import (torchtitan, Megatron without megatron-core) are listed in ``skipped``."""
    global _active
    with _patch_lock:
        if _active is not None:
            return _active
        p = VerlPatch()
        try:
            importlib.import_module(FSDP_IMPORTERS[0])
        except Exception as e:  # noqa: BLE001 - any failure means: verl cannot be patched here
            raise FrameworkMissingError(f"patch(): {FSDP_IMPORTERS[0]} does not import ({type(e).__name__}: {e}); "
                                        f"install verl (pip install -e '.[verl]')") from e
        try:
            _rebind(p, FSDP_IMPORTERS, FSDP_FUNCTIONS)
            _rebind(p, MEGATRON_IMPORTERS, MEGATRON_FUNCTIONS)
            _wrap_methods(p)
        except BaseException:
            p.rebinding.undo()
            raise
        logger.info("verl patched: %d names rebound, %d methods wrapped, skipped %s", len(p.rebound),
                    len(p.wrapped), sorted(p.skipped))
        _active = p
        return p


def unpatch() -> bool:
    """Restore verl's own functions and methods; False if nothing was patched."""
    p = _active
    if p is None:
        return False
    p.undo()
    return True


def active_patch() -> VerlPatch | None:
    """The patch in force in this process, or None."""
    return _active


__all__ = ["FSDP_FUNCTIONS", "FSDP_IMPORTERS", "MEGATRON_ENGINE", "MEGATRON_FUNCTIONS", "MEGATRON_IMPORTERS",
           "REOFFLOAD_AFTER", "STATE_READERS", "VerlPatch", "active_patch", "load_fsdp2_model_to_gpu",
           "load_fsdp_model_to_gpu", "load_fsdp_optimizer", "load_megatron_copy_params", "load_megatron_model_to_gpu",
           "load_megatron_optimizer", "offload_fsdp2_model_to_cpu", "offload_fsdp_model_to_cpu",
           "offload_fsdp_optimizer", "offload_megatron_copy_params", "offload_megatron_model_to_cpu",
           "offload_megatron_optimizer", "patch", "register_megatron", "state_loaded", "unpatch"]
