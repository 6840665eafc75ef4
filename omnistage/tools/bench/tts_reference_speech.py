"""``bench serve --backend openai-audio-speech --baseline reference``: ``qwen_tts``'s own generation, timed.

Run as a script by the reference environment's interpreter (:mod:`omnistage.tools.verify.tts_reference_env`, as
``omnistage verify`` runs it), importing nothing of omnistage: ``python tts_reference_speech.py JOB.json
OUT.json``. The job names the checkpoint, the utterances, the speaker (or the voice description) and the frame
count; each utterance is one ``generate_custom_voice`` / ``generate_voice_design`` call, greedy, one at a time,
after one short warm-up. Written: each call's wall seconds and the seconds of audio it returned.
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch


def _generate(model, job: dict, text: str, max_new_tokens: int):  # noqa: ANN001, ANN202
    common = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": max_new_tokens,
              "repetition_penalty": 1.05, "language": "auto"}
    if job.get("speaker"):
        return model.generate_custom_voice(text=text, speaker=job["speaker"], **common)
    return model.generate_voice_design(text=text, instruct=job["instruct"], **common)


def main(job_path: str, out_path: str) -> int:
    from qwen_tts import Qwen3TTSModel

    job = json.loads(open(job_path).read())
    warnings.simplefilter("ignore")
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    model = Qwen3TTSModel.from_pretrained(job["model"], dtype=torch.float32)
    runs = []
    with torch.no_grad():
        _generate(model, job, job["texts"][0], 3)  # warm-up: first-call allocations
        for text in job["texts"]:
            start = time.perf_counter()
            wavs, rate = _generate(model, job, text, job["max_new_tokens"])
            runs.append({"e2e_s": time.perf_counter() - start, "audio_s": len(wavs[0]) / rate})
    with open(out_path, "w") as out:
        json.dump({"runs": runs}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
