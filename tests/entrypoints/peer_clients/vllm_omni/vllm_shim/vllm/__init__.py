"""A stand-in for the two names vLLM-Omni's chat client imports from vLLM (not installed here: vLLM is a GPU
inference engine, far too large for a test dependency); only what the client touches."""
