"""Where ``bench serve --baseline pocket-tts`` runs Kyutai's ``pocket-tts`` package: made on first use under
``$OMNISTAGE_CACHE``, never a runtime dependency of omnistage.

``pocket-tts`` 4.0.1's pins (torch >= 2.5, numpy >= 2, safetensors, tokenizers, scipy, pydantic, fastapi, typer,
uvicorn...) are all met by omnistage's own environment, so it needs no virtual environment of its own: the package
and the two it adds (einops, sentencepiece) are installed ``--no-deps`` into a folder that only the baseline's
subprocess has on its ``PYTHONPATH``, run by omnistage's interpreter (the same torch, the same threads).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from omnistage.tiny.cache import cache_root

PACKAGES = ("pocket-tts==4.0.1", "einops==0.8.2", "sentencepiece==0.2.3")
ENV_VERSION = 1
SCRIPT = Path(__file__).with_name("pocket_tts_speech.py")


class PocketTTSUnavailable(RuntimeError):
    """The package could not be installed (no package index, no disk): the baseline cannot run here."""


def pocket_tts_path(create: bool = True) -> Path:
    """The folder holding the package (made when absent and ``create``; seconds, once)."""
    target = cache_root() / f"pocket-tts-v{ENV_VERSION}"
    if (target / "ready").is_file():
        return target
    if not create:
        raise PocketTTSUnavailable(f"no pocket-tts installation at {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".pocket-tts-", dir=target.parent))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               *PACKAGES], capture_output=True, text=True)
        if done.returncode:
            raise PocketTTSUnavailable(f"pip install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-2000:]}")
        (tmp / "ready").write_text(json.dumps({"packages": PACKAGES}) + "\n")
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "ready").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_pocket_tts(job: dict[str, object], workdir: Path, timeout_s: float = 1800.0) -> dict[str, object]:
    """``python pocket_tts_speech.py JOB OUT`` with the package on the path, offline; its JSON result."""
    job_path, out_path = workdir / "pocket_job.json", workdir / "pocket_out.json"
    job_path.write_text(json.dumps(job, indent=2))
    env = {**os.environ, "PYTHONPATH": str(pocket_tts_path()), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), str(job_path), str(out_path)], capture_output=True,
                          text=True, env=env, timeout=timeout_s, cwd=str(workdir))
    if done.returncode:
        raise RuntimeError(f"pocket-tts failed (exit {done.returncode}): {done.stderr.strip()[-3000:]}")
    return json.loads(out_path.read_text())
