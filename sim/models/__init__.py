"""The models room: what time, memory and faults cost, behind the protocols a rank asks.

:mod:`sim.models.model_protocols` declares the protocols and their simple defaults;
:mod:`sim.models.topology`, :mod:`sim.models.flows`, :mod:`sim.models.collectives`,
:mod:`sim.models.memory` and :mod:`sim.models.faults` are the richer models, and
:mod:`sim.models.allocator` a rank's buffers. A model reaches the world it is bound to only
through a protocol declared here (``WorldBinding``), so this room stands below the ranks.
"""
