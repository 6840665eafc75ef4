"""Stage workers: one stage engine behind the typed messages a replica's loop moves."""
