"""Sesame's CSM-1B: a Llama backbone picks each frame's first Mimi codebook, a depth decoder the other 31."""
