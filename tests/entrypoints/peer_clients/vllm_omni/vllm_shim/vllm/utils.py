"""vLLM's ``FlexibleArgumentParser`` is an ``argparse.ArgumentParser`` that also takes ``--a_b`` for ``--a-b``:
the client passes only dashed options."""

from argparse import ArgumentParser as FlexibleArgumentParser

__all__ = ["FlexibleArgumentParser"]
