"""The plan: what llama.cpp will allocate where and which budget each part counts against (plan.memory and
plan.compute, against plan.target's limits), the ladder of degraded settings (plan.planner), the policy
those come from (configs/planner.toml and the user's config.toml), the plan rendered as text or JSON, and
what would have let a failed start fit (remedies, from a plan or from a log's numbers, in the plain words
of configs/explain.toml).

Owns every decision about settings. Pure: model facts, a request and a target in; settings and reasons out.
Must not probe or run anything."""
