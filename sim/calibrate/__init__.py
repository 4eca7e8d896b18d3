"""The calibration room: measurement records, and the simulator fitted on and checked against them.

:mod:`sim.calibrate.records` reads records; :mod:`sim.calibrate.fit` and
:mod:`sim.calibrate.fit_window` fit a preset; :mod:`sim.calibrate.calibration` and
:mod:`sim.calibrate.colocated` predict measured runs; :mod:`sim.calibrate.switch_window` drives
the switch-window lifecycle; :mod:`sim.calibrate.destroy_walks` reads measured destroy walks.
"""
