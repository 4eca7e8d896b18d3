"""Importing this module patches verl (:func:`refimpl.integrations.verl.patch`).

For ``VERL_USE_EXTERNAL_MODULES=refimpl.integrations.verl_autopatch``: verl imports the modules named
there whenever it is imported, so every process that imports verl (each Ray worker) is patched.
"""
from refimpl.integrations.verl import patch

ACTIVE = patch()
