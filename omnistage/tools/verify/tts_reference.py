"""The reference side of ``omnistage verify`` for Qwen3-TTS: ``qwen_tts`` itself, run in its own environment.

Run as a script by the interpreter of the reference environment (:mod:`omnistage.tools.verify.tts_reference_env`:
qwen-tts 0.1.1 with the transformers 4.57.3 it pins), never imported by omnistage, and importing nothing of it:
``python tts_reference.py JOB.json OUT.safetensors``. The job names the checkpoint and the cases; for each case it
calls the public wrapper (``Qwen3TTSModel.generate_custom_voice`` / ``generate_voice_design`` /
``generate_voice_clone``) greedily and records the talker codes the codec decoder receives and the waveform
returned; probes record the codec's decode of given codes, its encoding and the speaker x-vector of given audio.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import torch
from safetensors.torch import save_file


def _run_case(model, case: dict, max_new_tokens: int) -> dict[str, torch.Tensor]:
    seen: list[torch.Tensor] = []
    decoder = model.model.speech_tokenizer.model.decoder
    handle = decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].clone()))
    common = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": max_new_tokens,
              "repetition_penalty": case.get("repetition_penalty", 1.05), "language": case.get("language", "auto")}
    if "non_streaming" in case:
        common["non_streaming_mode"] = case["non_streaming"]
    ref_len = 0
    try:
        if case["kind"] == "custom_voice":
            wavs, _ = model.generate_custom_voice(text=case["text"], speaker=case["speaker"],
                                                  instruct=case.get("instruct"), **common)
        elif case["kind"] == "voice_design":
            wavs, _ = model.generate_voice_design(text=case["text"], instruct=case["instruct"], **common)
        else:
            audio = np.load(case["ref_audio"]).astype(np.float32)
            items = model.create_voice_clone_prompt(ref_audio=(audio, case["sample_rate"]),
                                                    ref_text=case.get("ref_text"),
                                                    x_vector_only_mode=not case.get("ref_text"))
            ref_len = 0 if items[0].ref_code is None else int(items[0].ref_code.shape[0])
            wavs, _ = model.generate_voice_clone(text=case["text"], voice_clone_prompt=items, **common)
    finally:
        handle.remove()
    if len(seen) > 1:
        raise RuntimeError("the reference decoded in several chunks; keep max_new_tokens small")
    codes = seen[0][:, ref_len:].T.contiguous() if seen else torch.zeros(0, 0, dtype=torch.long)
    return {"codes": codes, "wav": torch.from_numpy(np.asarray(wavs[0], dtype=np.float32)).contiguous()}


def _probes(model, probe: dict) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    tokenizer = model.model.speech_tokenizer
    if "codes" in probe:
        codes = torch.from_numpy(np.load(probe["codes"])).long()  # [G, T]
        out["decoder_wav"] = tokenizer.model.decoder(codes[None])[0, 0].contiguous()
    if "audio" in probe:
        audio = np.load(probe["audio"]).astype(np.float32)
        out["encoder_codes"] = tokenizer.encode(audio, sr=24000).audio_codes[0].contiguous()
        if model.model.speaker_encoder is not None:
            out["speaker_embedding"] = model.model.extract_speaker_embedding(audio, 24000).float().contiguous()
    return out


def main(job_path: str, out_path: str) -> int:
    from qwen_tts import Qwen3TTSModel

    job = json.loads(open(job_path).read())
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = Qwen3TTSModel.from_pretrained(job["model"], dtype=torch.float32)
    tensors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for case in job.get("cases", []):
            for key, value in _run_case(model, case, job["max_new_tokens"]).items():
                tensors[f"{case['name']}.{key}"] = value
        for key, value in _probes(model, job.get("probes", {})).items():
            tensors[f"probe.{key}"] = value
    save_file(tensors, out_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
