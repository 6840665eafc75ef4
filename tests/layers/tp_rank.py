"""Rank 1 of the layer tests' gloo group: ``python -m tests.layers.tp_rank ADDRESS_JSON``.

Waits for (case index, rows) headers from rank 0; for each, receives the input and runs its shard of the case's
layer (the all-reduces inside meet rank 0's). A negative case index ends it.
"""

from __future__ import annotations

import json
import sys

import torch

from omnistage.layers.parallel import TensorParallel
from omnistage.runner.tp_group import GroupAddress, TPGroup
from tests.layers.tp_cases import HIDDEN, build, run


def main(address_json: str) -> None:
    group = TPGroup.join(GroupAddress(**json.loads(address_json)), 1, torch.device("cpu"))
    tp = TensorParallel(1, group.size, group)
    names = sorted(__import__("tests.layers.tp_cases", fromlist=["CASES"]).CASES)
    layers = {}
    while True:
        header = torch.empty(2, dtype=torch.int64)
        group.broadcast_cpu(header)
        case, rows = header.tolist()
        if case < 0:
            return
        x = torch.empty(rows, HIDDEN)
        group.broadcast_device(x)
        name = names[case]
        layers.setdefault(name, build(name, tp))
        with torch.inference_mode():
            run(layers[name], x)


if __name__ == "__main__":
    main(sys.argv[1])
