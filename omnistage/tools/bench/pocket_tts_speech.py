"""Runs in the baseline's subprocess (``pocket_env.run_pocket_tts``): Kyutai's ``pocket-tts`` package timing its
own streaming generation of each text, one at a time, on a checkpoint ``pocket_native`` wrote.

Job (JSON): ``config`` (the package's YAML), ``texts``, ``voice_wav`` (the voice prompt, cloned by the package's
own encoder), ``threads`` (torch threads; null: torch's default). Output (JSON): ``runs``, one per text:
``ttfp_s`` (first audio chunk), ``e2e_s``, ``audio_s``, ``cpu_s`` (the process's CPU seconds, its decoder thread's
included: what the run cost the machine, which a loaded machine's wall times hide); and ``load_s``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(job_path: str, out_path: str) -> None:
    import torch
    from pocket_tts import TTSModel

    job = json.loads(Path(job_path).read_text())
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    began = time.perf_counter()
    model = TTSModel.load_model(config=job["config"])
    voice = model.get_state_for_audio_prompt(Path(job["voice_wav"]))
    load_s = time.perf_counter() - began
    runs = []
    for text in job["texts"]:
        start, cpu, first, samples = time.perf_counter(), time.process_time(), None, 0
        for chunk in model.generate_audio_stream(voice, text):
            first = time.perf_counter() - start if first is None else first
            samples += chunk.shape[-1]
        runs.append({"ttfp_s": first or 0.0, "e2e_s": time.perf_counter() - start,
                     "audio_s": samples / model.sample_rate, "cpu_s": time.process_time() - cpu})
    Path(out_path).write_text(json.dumps({"runs": runs, "load_s": load_s}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
