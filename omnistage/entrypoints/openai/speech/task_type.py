"""vLLM-Omni's ``task_type`` (CustomVoice, VoiceDesign, Base): a request's claim about the served checkpoint.

vLLM-Omni serves one Qwen3-TTS checkpoint and its clients name the checkpoint's
type on each request; here the type is read off the front end (what ``voice``
means on it), so a claim that does not match is a 400 naming both, not a request
spoken in a way the client did not ask for.
"""

from __future__ import annotations

from omnistage.entrypoints.openai.common.errors import bad_request, quoted
from omnistage.families.speech import SpeechFrontEnd


def task_type_of(speech: SpeechFrontEnd) -> str:
    if speech.clones_voices:
        return "Base"
    return "VoiceDesign" if speech.needs_instructions else "CustomVoice"


def check_task_type(speech: SpeechFrontEnd, claimed: str | None) -> None:
    served = task_type_of(speech)
    if claimed is not None and claimed != served:
        raise bad_request(f"task_type {quoted(claimed)} does not match the served checkpoint, a {served} model",
                          param="task_type", code="invalid_task_type")
