"""``omnistage verify`` on a Qwen3-TTS checkpoint: omnistage's engine against ``qwen_tts`` on the same cases.

The cases follow the checkpoint's type: CustomVoice speaks with a named speaker (and with instructions where the
model takes them), VoiceDesign from a description, Base clones a synthetic reference recording both ways (in
context with its transcript, and from the x-vector alone). Each compares the greedy talker codes (identical) and
the waveform (within the tolerance); the reference runs in its own environment
(:mod:`omnistage.tools.verify.tts_reference_env`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnistage.models.qwen3_tts.checkpoint import Qwen3TTSModels
from omnistage.models.qwen3_tts.config import Qwen3TTSConfig
from omnistage.families.qwen3_tts.offline import SpeechOutput, TTSSettings, generate_offline
from omnistage.models.qwen3_tts.request import SpeechInput, TextTokenizer, make_voice_clone
from omnistage.tools.verify.tts_reference_env import run_reference
from omnistage.tools.verify.cases import TOLERANCE, TTS_CASE_NAMES  # noqa: F401 - re-exported

TEXT = "Hello, how are you today? The weather is sunny and warm."
REF_TEXT = "The quick brown fox jumps over the lazy dog."
INSTRUCTIONS = "Speak slowly, in a warm and happy voice."


def synthetic_voice(seconds: float = 1.5, pitch: float = 140.0, seed: int = 0) -> np.ndarray:
    """A speech-like 24 kHz recording: a gliding voiced tone with harmonics and a little noise."""
    rng = np.random.RandomState(seed)
    t = np.arange(int(24000 * seconds)) / 24000
    f0 = pitch * (1 + 0.1 * np.sin(2 * np.pi * 1.5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / 24000
    voiced = sum(0.2 / k * np.sin(k * phase) for k in range(1, 6))
    return (voiced + 0.01 * rng.randn(t.size)).astype(np.float32)


@dataclass(frozen=True)
class TTSCase:
    name: str
    kind: str  # custom_voice | voice_design | voice_clone (the reference wrapper method)
    speaker: str | None = None
    instruct: str | None = None
    ref_text: str | None = None


def cases_for(config: Qwen3TTSConfig) -> list[TTSCase]:
    kind = config.tts_model_type
    if kind == "custom_voice":
        speaker = sorted(config.talker.speakers)[0] if config.talker.speakers else None
        if speaker is None:
            raise ValueError("this CustomVoice checkpoint names no speakers (talker_config.spk_id)")
        out = [TTSCase("custom-voice", "custom_voice", speaker=speaker)]
        if config.takes_instructions:
            out.append(TTSCase("custom-voice+instructions", "custom_voice", speaker=speaker, instruct=INSTRUCTIONS))
        return out
    if kind == "voice_design":
        return [TTSCase("voice-design", "voice_design", instruct=INSTRUCTIONS)]
    return [TTSCase("voice-clone", "voice_clone", ref_text=REF_TEXT), TTSCase("voice-clone-xvector", "voice_clone")]


@dataclass(frozen=True)
class TTSCaseReport:
    name: str
    codes_identical: bool
    wav_max_abs_diff: float  # inf when the lengths differ
    frames: int
    reference_frames: int
    samples: int
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        return self.codes_identical and self.wav_max_abs_diff <= self.tolerance

    def to_json(self) -> dict[str, object]:
        diff = self.wav_max_abs_diff
        return {"name": self.name, "ok": self.ok, "codes_identical": self.codes_identical,
                "wav_max_abs_diff": diff if diff != float("inf") else None, "frames": self.frames,
                "reference_frames": self.reference_frames, "samples": self.samples}


@dataclass(frozen=True)
class TTSVerifyReport:
    model: str
    cases: list[TTSCaseReport] = field(default_factory=list)
    tolerance: float = TOLERANCE

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(case.ok for case in self.cases)

    def dumps(self) -> str:
        return json.dumps({"model": self.model, "family": "qwen3_tts", "tolerance": self.tolerance, "ok": self.ok,
                           "cases": [c.to_json() for c in self.cases]}, indent=2)


def run_tts_verify(folder: str | Path, *, max_new_tokens: int = 24, cases: list[str] | None = None,
                   tolerance: float = TOLERANCE) -> TTSVerifyReport:
    """Greedy, fp32, CPU: the reference and omnistage on every case of the checkpoint's type."""
    folder = Path(folder).resolve()
    models = Qwen3TTSModels.load(folder)
    selected = [c for c in cases_for(models.config) if not cases or c.name in cases]
    if not selected:
        raise ValueError(f"no case of this {models.config.tts_model_type} checkpoint in {cases}")
    tokenizer = TextTokenizer(folder)
    settings = TTSSettings(max_new_tokens=max_new_tokens)
    with tempfile.TemporaryDirectory(prefix="omnistage-tts-verify-") as tmp:
        work = Path(tmp)
        voice = synthetic_voice()
        np.save(work / "voice.npy", voice)
        job = {"model": str(folder), "max_new_tokens": max_new_tokens,
               "cases": [job_case(c, work / "voice.npy") for c in selected]}
        theirs = run_reference(job, work)
    reports = []
    for case in selected:
        ours = generate_offline(models, tokenizer, speech_input(models, tokenizer, case, voice), settings)
        reports.append(compare_case(case.name, ours, theirs[f"{case.name}.codes"], theirs[f"{case.name}.wav"],
                                tolerance))
    return TTSVerifyReport(str(folder), reports, tolerance)


def job_case(case: TTSCase, voice_path: Path) -> dict[str, object]:
    out: dict[str, object] = {"name": case.name, "kind": case.kind, "text": TEXT}
    for key in ("speaker", "instruct", "ref_text"):
        if getattr(case, key):
            out[key] = getattr(case, key)
    if case.kind == "voice_clone":
        out.update(ref_audio=str(voice_path), sample_rate=24000)
    return out


def speech_input(models: Qwen3TTSModels, tokenizer: TextTokenizer, case: TTSCase, voice: np.ndarray) -> SpeechInput:
    clone = make_voice_clone(models, tokenizer, voice, 24000, case.ref_text) if case.kind == "voice_clone" else None
    return SpeechInput(TEXT, speaker=case.speaker, instructions=case.instruct, voice_clone=clone)


def compare_case(name: str, ours: SpeechOutput, codes: torch.Tensor, wav: torch.Tensor, tolerance: float) -> TTSCaseReport:
    same_shape = ours.codes.shape == codes.shape
    identical = same_shape and torch.equal(ours.codes.long(), codes.long())
    diff = float((ours.wav - wav).abs().max()) if ours.wav.shape == wav.shape and wav.numel() else (
        0.0 if ours.wav.shape == wav.shape else float("inf"))
    return TTSCaseReport(name, identical, diff, ours.codes.shape[0], codes.shape[0], ours.wav.numel(), tolerance)


def format_tts_table(report: TTSVerifyReport) -> str:
    lines = [f"omnistage verify: {report.model} (qwen3_tts vs qwen-tts 0.1.1; greedy, fp32, cpu; tolerance "
             f"{report.tolerance:.0e})", f"{'case':<26} {'frames':>6}  {'codes':<10} {'wav diff':>9}  result"]
    for c in report.cases:
        frames = str(c.frames) if c.frames == c.reference_frames else f"{c.frames}/{c.reference_frames}"
        lines.append(f"{c.name:<26} {frames:>6}  {'identical' if c.codes_identical else 'DIFFER':<10} "
                     f"{c.wav_max_abs_diff:>9.2e}  {'ok' if c.ok else 'FAIL'}")
    lines.append("PASS" if report.ok else "FAIL")
    return "\n".join(lines)
