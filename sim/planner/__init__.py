"""The planner room: ``timeshare plan``'s inputs (:mod:`sim.planner.plan_inputs`), evaluation
(:mod:`sim.planner.plan`), ranking (:mod:`sim.planner.plan_rank`) and published claims checked
(:mod:`sim.planner.plan_claims`)."""
