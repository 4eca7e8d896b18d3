"""The planner room: ``timeshare plan``'s inputs (:mod:`sim.planner.plan_model`), evaluation
(:mod:`sim.planner.plan`), ranking (:mod:`sim.planner.plan_rank`) and published claims checked
(:mod:`sim.planner.plan_claims`)."""
