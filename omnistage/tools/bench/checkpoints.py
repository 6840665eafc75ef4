"""A slower random checkpoint for scheduling benchmarks: the tiny one with a wider vocoder.

The tiny checkpoint is so fast on a CPU that no stream ever runs dry; widening code2wav's decoder
(``decoder_dim``) makes audio cost real compute, so concurrency can push the pipeline past real time
and scheduling policies differ. ``python -m omnistage.tools.bench.checkpoints OUT --decoder-dim 384``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def make_wide_vocoder(out: str | Path, decoder_dim: int = 384, seed: int = 0) -> Path:
    from omnistage.families.qwen3_omni.make_tiny import _save_weights, tiny_model_dir

    src, dst = tiny_model_dir(seed=seed), Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, dst / f.name)
    config = json.loads((dst / "config.json").read_text())
    config["code2wav_config"]["decoder_dim"] = decoder_dim
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    _save_weights(dst, seed)
    return dst


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--decoder-dim", type=int, default=384)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    print(make_wide_vocoder(a.out, a.decoder_dim, a.seed))
