"""The plan: what llama.cpp will allocate where and which budget each part counts against (plan.memory and
plan.compute, against plan.target's limits), the ladder of degraded settings (plan.planner), the policy
those come from (configs/planner.toml and the user's config.toml) and the plan rendered as text or JSON.

Owns every decision about settings. Pure: model facts, a request and a target in; settings and reasons out.
Must not probe or run anything."""
