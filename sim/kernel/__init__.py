"""The kernel room: the discrete-event engine (:mod:`sim.kernel.engine`) and the errors (:mod:`sim.kernel.errors`).

The lowest room of the simulator: it imports nothing else of :mod:`sim`.
"""
