"""The simulated machine: what time, memory and faults cost, behind the protocols a rank asks.

:mod:`sim.machine.protocols` declares the protocols and their simple defaults;
:mod:`sim.machine.topology`, :mod:`sim.machine.flows`, :mod:`sim.machine.collectives`,
:mod:`sim.machine.memory` and :mod:`sim.machine.faults` are the richer parts, and
:mod:`sim.machine.allocator` a rank's buffers. A part reaches the world it is bound to only
through a protocol declared here (``WorldBinding``), so this room stands below the ranks.
"""
