"""The command room, the top of the simulator: ``timeshare sim`` (:mod:`sim.commands.simulate`)
and ``timeshare plan`` (:mod:`sim.commands.plan`)."""
