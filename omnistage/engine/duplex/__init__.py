"""Duplex sessions as an engine mode: input-clocked, every live session's frame batched into one step a tick."""
