"""transformers' Qwen2.5-Omni ``generate`` with the intermediate results verify compares: the thinker's tokens,
the talker's codes (its ``generate`` result) with the scores greedy chose them by, and token2wav's codes and
waveform. The reference instance's ``talker.generate`` and ``token2wav.forward`` are wrapped for the one call
(instance attributes, restored after), and the talker's forward gets back the attention mask ``generate`` drops
(:func:`_restore_attention_mask`, a forward pre-hook removed after)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ReferenceReply:
    text_tokens: list[int]
    codes: list[int]  # the talker's sampled codes (stop code included)
    wav_codes: list[int]  # what token2wav decoded
    wav: torch.Tensor
    code_scores: list[torch.Tensor]  # [V] per talker step: what greedy's argmax saw (after penalty and suppression)


@torch.no_grad()
def reference_reply(model: torch.nn.Module, ids: list[int], hf_kwargs: dict[str, object], speaker: str,
                    thinker_new_tokens: int, talker_new_tokens: int, seed: int = 0) -> ReferenceReply:
    seen: dict[str, object] = {}
    talker_generate, token2wav_forward = model.talker.generate, model.token2wav.forward

    def talker(*args: object, **kwargs: object) -> torch.Tensor:
        out = talker_generate(*args, **kwargs, output_scores=True, return_dict_in_generate=True)
        seen["codes"] = out.sequences[0, kwargs["input_ids"].shape[1]:].tolist()
        seen["scores"] = [step[0] for step in out.scores]
        return out.sequences

    def token2wav(code: torch.Tensor, **kwargs: object) -> torch.Tensor:
        seen["wav_codes"] = code[0].tolist()
        torch.manual_seed(seed)
        return token2wav_forward(code, **kwargs)

    model.talker.generate, model.token2wav.forward = talker, token2wav
    handle = model.talker.register_forward_pre_hook(_restore_attention_mask, with_kwargs=True)
    try:
        input_ids = torch.tensor([ids])
        text, wav = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), speaker=speaker,
                                   thinker_max_new_tokens=thinker_new_tokens, thinker_do_sample=False,
                                   talker_max_new_tokens=talker_new_tokens, talker_do_sample=False, **hf_kwargs)
    finally:
        handle.remove()
        del model.talker.generate, model.token2wav.forward
    return ReferenceReply(text[0, len(ids):].tolist(), seen["codes"], seen["wav_codes"], wav.reshape(-1),
                          seen["scores"])


def _restore_attention_mask(module: nn.Module, args: tuple, kwargs: dict[str, object]) -> tuple | None:
    """transformers' ``generate`` (5.x) drops an attention mask of all ones, as padding-free; but the Qwen2.5-Omni
    talker's forward takes a present mask as its cue to build the TMRoPE positions and add the codec pad and bos
    embeddings to the prompt's last two rows. Without it the talker runs on plain 1-D positions with no codec rows:
    not the model (the same prompt left-padded in a batch keeps its mask and speaks other codes). So each call
    without a mask gets one of ones over the cached and the new rows; a transformers that keeps the mask is left
    alone."""
    if kwargs.get("attention_mask") is not None:
        return None
    rows = kwargs["inputs_embeds"] if kwargs.get("inputs_embeds") is not None else kwargs["input_ids"]
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    cached = cache.get_seq_length() if cache is not None else 0
    mask = torch.ones(rows.shape[0], cached + rows.shape[1], dtype=torch.long, device=rows.device)
    return args, {**kwargs, "attention_mask": mask}
