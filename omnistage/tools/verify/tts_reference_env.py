"""The environment the Qwen3-TTS reference runs in, made on first use under ``$OMNISTAGE_CACHE``.

``qwen-tts`` 0.1.1 pins transformers 4.57.3; omnistage runs transformers 5.24, where its 12 Hz tokenizer cannot be
built (transformers 5 reorganised ``MimiModel``, whose encoder ``Qwen3TTSTokenizerV2Encoder`` subclasses; the
``qwen-tts-compat`` fork fails the same way). So the reference gets its own virtual environment: torch 2.13 (the
same CPU wheel as omnistage), transformers 4.57.3, librosa, einops, soundfile, safetensors, and qwen-tts 0.1.1
without its remaining pins (torchaudio, sox and onnxruntime serve only the 25 Hz tokenizer; import-only stand-ins
in ``tts_shims/`` take their place, on the subprocess's ``PYTHONPATH`` only). ``$OMNISTAGE_TTS_REFERENCE_PYTHON``
names an interpreter that already has all this, instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from omnistage.tiny.cache import cache_root

REFERENCE_PACKAGES = ("torch==2.13.0", "transformers==4.57.3", "librosa==0.11.0", "einops==0.8.2",
                      "soundfile==0.14.0", "safetensors==0.8.0", "numpy==2.4.6")
REFERENCE_NO_DEPS = ("qwen-tts==0.1.1",)
ENV_VERSION = 1
PYTHON_ENV = "OMNISTAGE_TTS_REFERENCE_PYTHON"
HERE = Path(__file__).resolve().parent
SCRIPT, SHIMS = HERE / "tts_reference.py", HERE / "tts_shims"


class ReferenceUnavailable(RuntimeError):
    """The reference environment could not be made (no package index, no disk): the check cannot run here."""


def reference_python(create: bool = True) -> Path:
    """The reference interpreter: ``$OMNISTAGE_TTS_REFERENCE_PYTHON``, or the cached environment's (made when
    absent and ``create``; a few minutes, once)."""
    if os.environ.get(PYTHON_ENV):
        return Path(os.environ[PYTHON_ENV])
    target = cache_root() / f"qwen-tts-reference-v{ENV_VERSION}"
    python = target / "bin" / "python"
    if (target / "ready").is_file():
        return python
    if not create:
        raise ReferenceUnavailable(f"no reference environment at {target}")
    _create(target)
    return python


def _create(target: Path) -> None:
    """Built in a temporary sibling and renamed into place, so a crash never leaves a half-made environment."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".qwen-tts-reference-", dir=target.parent))
    print(f"omnistage: making the Qwen3-TTS reference environment in {target} (once; a few minutes)", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, capture_output=True)
        pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q"]
        for args in ([*REFERENCE_PACKAGES], ["--no-deps", *REFERENCE_NO_DEPS]):
            done = subprocess.run([*pip, *args], capture_output=True, text=True)
            if done.returncode:
                raise ReferenceUnavailable(f"pip install {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
        (tmp / "ready").write_text(json.dumps({"packages": [*REFERENCE_PACKAGES, *REFERENCE_NO_DEPS]}) + "\n")
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "ready").is_file():
                raise
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ReferenceUnavailable(f"could not make the reference environment: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_reference(job: dict[str, object], workdir: Path, timeout_s: float = 900.0) -> dict[str, torch.Tensor]:
    """Runs ``tts_reference.py`` on ``job`` (see its docstring) and returns the tensors it wrote."""
    out_path = workdir / "reference_out.safetensors"
    run_reference_script(SCRIPT, job, out_path, workdir, timeout_s)
    return load_file(str(out_path))


def run_reference_script(script: Path, job: dict[str, object], out_path: Path, workdir: Path,
                         timeout_s: float = 900.0) -> None:
    """``python SCRIPT JOB.json OUT`` in the reference environment (its shims on the path, offline)."""
    python = reference_python()
    job_path = workdir / f"{script.stem}_job.json"
    job_path.write_text(json.dumps(job, indent=2))
    env = {**os.environ, "PYTHONPATH": str(SHIMS), "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(python), str(script), str(job_path), str(out_path)], capture_output=True, text=True,
                          env=env, timeout=timeout_s, cwd=str(workdir))
    if done.returncode:
        raise RuntimeError(f"the qwen-tts reference failed (exit {done.returncode}): {done.stderr.strip()[-3000:]}")
