"""What a chat request asks for, read once from its body: output, voice, tools, choices, sampling.

Unknown top-level fields were kept aside by the body's model; they are logged
here at debug and otherwise ignored. ``sampling_params_list`` (vLLM-Omni) gives
the thinker's knobs in its first entry, used where the request's own fields are
unset; later entries (the talker's, the vocoder's) are ignored, the talker
keeping its stage's sampling.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omnistage.audio import AudioFormat
from omnistage.entrypoints.openai.chat.inputs import TemplateOptions
from omnistage.entrypoints.openai.chat.protocol import ChatCompletionRequest
from omnistage.entrypoints.openai.common.errors import bad_request
from omnistage.entrypoints.openai.common.request_checks import (
    require_chat,
    completion_budget,
    make_sampling,
    require_audio_support,
    resolve_voice,
    top_k_of,
)
from omnistage.entrypoints.openai.common.served_model import ServedModel, audio_rate
from omnistage.entrypoints.openai.common.tool_calls import ToolSetup, tool_setup
from omnistage.entrypoints.openai.engine_protocol import OmniEngine
from omnistage.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
# Template variables a request may not set: the server passes them itself.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "conversation", "tools", "tokenize", "return_dict",
                                      "chat_template", "add_generation_prompt"})


@dataclass(frozen=True)
class AudioOutput:
    voice: str
    format: AudioFormat
    source_rate: int  # the served family's audio rate: what the encoders resample from


@dataclass(frozen=True)
class ChatPlan:
    """audio: speech asked for (None: text only); text: whether ``content`` carries the text (False for
    ``modalities: ["audio"]``, where it is only the transcript); split: text and audio in separate choices
    (vLLM-Omni's shape, non-streamed)."""

    audio: AudioOutput | None
    text: bool
    tools: ToolSetup
    choices: int
    template: TemplateOptions
    logprobs: int | None
    split: bool = False


def _log_ignored(body: ChatCompletionRequest) -> None:
    ignored = sorted(body.model_extra or {})
    for i, message in enumerate(body.messages):
        ignored += [f"messages[{i}].{k}" for k in sorted(message.model_extra or {})]
    if ignored:
        logger.debug("chat request: ignoring fields %s", ", ".join(ignored))


def audio_output(body: ChatCompletionRequest, engine: OmniEngine, served: ServedModel,
                  modalities: list[str]) -> AudioOutput | None:
    if "audio" not in modalities:
        if body.audio is not None:
            raise bad_request("'audio' is set but modalities does not include 'audio'", param="audio")
        return None
    require_audio_support(engine, "modalities")
    name, param = (body.audio.voice_name, "audio.voice") if body.audio is not None else (None, "audio.voice")
    if body.speaker is not None:
        if name is not None and name.lower() != body.speaker.lower():
            raise bad_request("'speaker' and 'audio.voice' name different voices", param="speaker")
        name, param = body.speaker, "speaker"
    fmt = AudioFormat.parse(body.audio.format if body.audio is not None else "wav")
    return AudioOutput(voice=resolve_voice(served.voices, name, param), format=fmt, source_rate=audio_rate(engine))


def chat_plan(body: ChatCompletionRequest, engine: OmniEngine, served: ServedModel) -> ChatPlan:
    _log_ignored(body)
    served.check(body.model)
    require_chat(engine)
    modalities = list(body.modalities or served.default_modalities)
    audio = audio_output(body, engine, served, modalities)
    if audio is not None and body.choices > 1:
        raise bad_request("n > 1 is supported for text output only", param="n")
    try:
        tools = tool_setup([t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None,
                           body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump")
                           else body.tool_choice, body.parallel_tool_calls)
    except ValueError as exc:
        raise bad_request(str(exc), param="tool_choice") from exc
    kwargs = dict(body.chat_template_kwargs or {})
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs")
    audio_in_video = body.mm_processor_kwargs is not None and body.mm_processor_kwargs.use_audio_in_video
    template = TemplateOptions(tools=tools.tools, kwargs=kwargs or None, assistant_prefix=tools.prefix,
                               use_audio_in_video=audio_in_video)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    text = "text" in modalities or audio is None
    return ChatPlan(audio, text, tools, body.choices, template, logprobs,
                    split=body.split_modalities and text and audio is not None and not body.stream)


def chat_sampling(body: ChatCompletionRequest, engine: OmniEngine, prompt_len: int, plan: ChatPlan,
                  ) -> SamplingParams:
    """The thinker's sampling for one choice: the request's knobs, then ``sampling_params_list[0]``'s, then the
    server's defaults (stage config under the checkpoint's generation config)."""
    stage = body.sampling_params_list[0] if body.sampling_params_list else None

    def pick(name: str) -> object:
        value = getattr(body, name, None)
        return value if value is not None or stage is None else getattr(stage, name)

    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    requested = body.max_completion_tokens or body.max_tokens
    if requested is None and stage is not None and stage.max_tokens is not None:
        # A stage default, as vLLM-Omni's clients send it (16384 for a 64k-context model): a cap, clamped to the
        # room the prompt leaves, as vLLM clamps it, not a request refused on a smaller model.
        requested = max(1, min(stage.max_tokens, engine.max_model_len - prompt_len))
    defaults = engine.default_sampling
    budget = completion_budget(requested, prompt_len, engine.max_model_len, param, defaults.max_tokens)
    ignore_eos = body.ignore_eos or bool(stage and stage.ignore_eos)
    return make_sampling(
        max_tokens=budget, defaults=defaults, temperature=pick("temperature"), top_p=pick("top_p"),
        top_k=top_k_of(engine, pick("top_k")), repetition_penalty=pick("repetition_penalty"), seed=pick("seed"),
        stop=body.stop_sequences, presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0, logprobs=plan.logprobs, ignore_eos=ignore_eos,
        min_tokens=body.min_tokens or 0, stop_token_ids=tuple(body.stop_token_ids or ()),
    )
