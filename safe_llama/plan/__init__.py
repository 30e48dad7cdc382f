"""The plan: where every allocation lives and which budget it counts against (per backend), the ladder of
degraded settings, the policy those come from (configs/planner.toml and the user's config.toml), the
plan rendered as text or JSON, and what would have let a failed start fit (remedies, from a plan or from
a log's numbers, in the plain words of configs/explain.toml).

Pure: model facts, a request and a target in; settings and reasons out. Must not probe or run anything."""
