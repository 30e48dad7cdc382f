"""The plan: where every allocation lives and which budget it counts against (per backend), the ladder of
degraded settings, the policy those come from (configs/planner.toml and the user's config.toml), and the
plan rendered as text or JSON.

Pure: model facts, a request and a target in; settings and reasons out. Must not probe or run anything."""
