"""What every family's random checkpoints share: the offline tokenizer, the chat template, confident heads,
an audible vocoder and the cache of embedded checkpoints (each family's make-tiny hook lives in its package)."""
