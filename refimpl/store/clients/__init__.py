"""Clients: the training libraries users run, attached to an :class:`~refimpl.store.OffloadStore` in one call.

* :func:`~refimpl.store.clients.ddp.attach_ddp`: torch ``DistributedDataParallel``, both
  ``gradient_as_bucket_view`` modes (:mod:`refimpl.store.clients.ddp`).
* :func:`~refimpl.store.clients.megatron.attach_megatron`: a Megatron-core model (its DDP param and
  grad buffers with every view of them) and its optimizer (distributed or not, chained),
  ``local`` and ``local_dedup`` (:mod:`refimpl.store.clients.megatron`; imports megatron lazily).
* :func:`~refimpl.store.clients.megatron_groups.adopt_megatron_groups`: Megatron's ``parallel_state``
  process groups handed to a :class:`refimpl.comm.PGLifecycle` (:mod:`refimpl.store.clients.megatron_groups`).

FSDP2 needs no client: :meth:`OffloadStore.attach_module` reads ``fully_shard`` modules itself.
"""
from refimpl.store.clients.ddp import DDPClient, attach_ddp

__all__ = ["DDPClient", "attach_ddp"]
