"""Errors of the framework integrations: what was passed or done wrong, and what to do instead."""
from __future__ import annotations


class IntegrationError(RuntimeError):
    """Base class of the errors the verl and ROLL drop-ins raise themselves."""


class UnsupportedModelError(IntegrationError, TypeError):
    """The drop-in cannot offload this kind of module (FSDP1's ``FullyShardedDataParallel``)."""


class ForeignOffloadError(IntegrationError):
    """State was moved off the device by something other than the drop-in's store (the framework's own
    function); loading it through the drop-in would silently leave it where it is."""


class DeviceMismatchError(IntegrationError, ValueError):
    """A device argument names another device than the one the store reloads to (the process's runtime)."""


class MegatronPairingError(IntegrationError):
    """A Megatron model's store needs its optimizer (the distributed optimizer views the model's buffers)
    and the drop-in did not know it yet."""


class FrameworkMissingError(IntegrationError, ImportError):
    """The framework to patch is not importable in this process."""


class UnknownStateTypeError(IntegrationError, ValueError):
    """An ``include`` entry is none of ROLL's ``OffloadStateType`` values."""


__all__ = ["DeviceMismatchError", "ForeignOffloadError", "FrameworkMissingError", "IntegrationError",
           "MegatronPairingError", "UnknownStateTypeError", "UnsupportedModelError"]
