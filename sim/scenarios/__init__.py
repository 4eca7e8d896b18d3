"""The scenarios room: scenario files, the runner that simulates one, its result, traces, comparison, folding, scale.

:mod:`sim.scenarios.scenario` validates a scenario; :mod:`sim.scenarios.runner` runs it;
:mod:`sim.scenarios.result` judges it; :mod:`sim.scenarios.fold` and :mod:`sim.scenarios.scale`
run large jobs; :mod:`sim.scenarios.trace` and :mod:`sim.scenarios.compare` show results.
"""
