"""``omnistage plan``: per-stage memory from config.json and a placement that fits the devices."""
