"""verl and ROLL call the offload store: drop-ins for their offload functions.

* :mod:`refimpl.integrations.verl`: verl's FSDP and Megatron offload/load functions with the same
  signatures, backed by one store per module or optimizer, and ``patch()`` / ``unpatch()``, which
  make verl's workers call them (``VERL_USE_EXTERNAL_MODULES=refimpl.integrations.verl_autopatch`` does
  it in every process).
* :mod:`refimpl.integrations.roll`: ROLL's ``offload_states`` / ``load_states`` with its
  ``OffloadStateType`` include list, and its ``is_offload_states`` switch.
* :mod:`refimpl.integrations.stores`: where each object's store lives, and the process's runtime.

Neither framework is imported by this package until ``patch()`` is called. docs/integrations.md says
what each drop-in keeps and changes of the framework's semantics.
"""
