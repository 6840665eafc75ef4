"""transformers' Qwen2.5-Omni ``generate`` with the intermediate results verify compares: the thinker's tokens,
the talker's codes (its ``generate`` result) and token2wav's codes and waveform. The reference instance's
``talker.generate`` and ``token2wav.forward`` are wrapped for the one call (instance attributes, restored after)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ReferenceReply:
    text_tokens: list[int]
    codes: list[int]  # the talker's sampled codes (stop code included)
    wav_codes: list[int]  # what token2wav decoded
    wav: torch.Tensor


@torch.no_grad()
def reference_reply(model: torch.nn.Module, ids: list[int], hf_kwargs: dict[str, object], speaker: str,
                    thinker_new_tokens: int, talker_new_tokens: int, seed: int = 0) -> ReferenceReply:
    seen: dict[str, object] = {}
    talker_generate, token2wav_forward = model.talker.generate, model.token2wav.forward

    def talker(*args: object, **kwargs: object) -> torch.Tensor:
        out = talker_generate(*args, **kwargs)
        seen["codes"] = out[0, kwargs["input_ids"].shape[1]:].tolist()
        return out

    def token2wav(code: torch.Tensor, **kwargs: object) -> torch.Tensor:
        seen["wav_codes"] = code[0].tolist()
        torch.manual_seed(seed)
        return token2wav_forward(code, **kwargs)

    model.talker.generate, model.token2wav.forward = talker, token2wav
    try:
        input_ids = torch.tensor([ids])
        text, wav = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), speaker=speaker,
                                   thinker_max_new_tokens=thinker_new_tokens, thinker_do_sample=False,
                                   talker_max_new_tokens=talker_new_tokens, talker_do_sample=False, **hf_kwargs)
    finally:
        del model.talker.generate, model.token2wav.forward
    return ReferenceReply(text[0, len(ids):].tolist(), seen["codes"], seen["wav_codes"], wav.reshape(-1))
