"""Qwen2.5-Omni's chat prompt processing: the family's :class:`omnistage.processing.prompt.PromptProcessor`.

transformers' ``Qwen2_5OmniProcessor`` cannot be built without torchvision (its video processor), so this does
its work from the parts that load without it: the tokenizer (and its chat template), the Whisper feature
extractor, the PIL image processor. Each ``<|audio_pad|>``/``<|image_pad|>`` placeholder is expanded to its
item's encoder rows as the processor does (audio: ``((frames - 1) // 2 + 1 - 2) // 2 + 1``; image: grid / merge²).
Videos go through the shared video patching (:mod:`omnistage.processing.video_patches`: frames paired into
temporal patches as transformers' video processor does, with the image processor's sizes); each
``<|video_pad|>`` becomes grid / merge² tokens; with ``use_audio_in_video`` its sound track joins the audios in
token order and the placeholder becomes the interleaved layout (:mod:`.audio_in_video`).

Streaming input (a realtime turn prefilled while it is spoken): :meth:`listener` freezes a growing audio's log-mel
chunk by chunk (the audio encoder's 2 s conv chunks, whose rows are their frames' alone), and an audio given back
as :class:`ListenedAudio` keeps those frozen frames in front of the extractor's, so its chunks' keys
(:mod:`.media_keys`) are the ones the prefill requests made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnistage.families.qwen2_5_omni.audio_in_video import AudioInVideoLayout
from omnistage.families.qwen2_5_omni.voices import SYSTEM_PROMPT
from omnistage.models.qwen2_5_omni.inputs import OmniInputs
from omnistage.models.qwen2_5_omni.tmrope import audio_output_length
from omnistage.processing.listened_audio import ListenedAudio, WindowedLogMel
from omnistage.processing.placeholders import expand_placeholders
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from omnistage.processing.user_text import guard_for
from omnistage.processing.video import Video
from omnistage.processing.video_patches import VideoPatches


@dataclass(frozen=True)
class Qwen25OmniPrompt:
    """A Qwen2.5-Omni request's prompt: template applied, placeholders expanded, encoder inputs made."""

    token_ids: list[int]
    mm: OmniInputs = field(default_factory=OmniInputs)
    speech_system_prompt: bool = False  # the prompt holds the system prompt the talker was trained under

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class Qwen25OmniPromptProcessor:
    def __init__(self, folder: str | Path, thinker_config: object) -> None:
        from transformers import AutoTokenizer, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.folder = Path(folder)
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder)
        self.features = WhisperFeatureExtractor.from_pretrained(self.folder)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(self.folder)
        self.audio_token_id = thinker_config.audio_token_index
        self.image_token_id = thinker_config.image_token_index
        self.video_token_id = thinker_config.video_token_index
        self.merge_size = thinker_config.vision_config.spatial_merge_size
        self.audio_chunk_frames = 2 * thinker_config.audio_config.n_window
        self.videos = _video_patches(self.images, thinker_config.vision_config.temporal_patch_size)
        self.layout = AudioInVideoLayout.from_config(thinker_config)
        self.system_ids = self.tokenizer.encode(SYSTEM_PROMPT, add_special_tokens=False)

    def apply_chat_template(self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None,
                            template_kwargs: Mapping[str, object] | None = None, assistant_prefix: str = "",
                            ) -> list[int]:
        # Client strings stay ordinary text, their control-token strings included (processing/user_text.py).
        return guard_for(self.tokenizer).chat_ids(messages, tools, template_kwargs, assistant_prefix)

    def listener(self) -> WindowedLogMel | None:
        """A growing audio's features, frozen chunk by chunk as the encoder's chunks complete (None with dither:
        the extractor's frames would not be its own twice)."""
        return None if getattr(self.features, "dither", 0.0) else WindowedLogMel(self.features, self.audio_chunk_frames)

    def process(self, token_ids: list[int], audios: Sequence[np.ndarray | ListenedAudio] = (),
                images: Sequence[object] = (), videos: Sequence[Video] = (),
                use_audio_in_video: bool = False) -> Qwen25OmniPrompt:
        if use_audio_in_video:
            audios = self._with_sound_tracks(token_ids, audios, videos)
        audio = self._audio_inputs(audios)
        image = self._image_inputs(images)
        video = self._video_inputs(videos)
        audio_rows = _audio_rows(audio)
        video_rows: list[int] | list[list[int]] = _video_rows(video, self.merge_size)
        if use_audio_in_video:
            video_rows = self._interleaved(token_ids, video, audio_rows)
        counts = {self.audio_token_id: audio_rows, self.image_token_id: _image_rows(image, self.merge_size),
                  self.video_token_id: video_rows}
        ids = expand_placeholders(token_ids, counts)
        mm = OmniInputs(**audio, **image, **video, use_audio_in_video=use_audio_in_video)
        return Qwen25OmniPrompt(ids, mm, _contains(ids, self.system_ids))

    def _with_sound_tracks(self, token_ids: list[int], audios: Sequence[np.ndarray],
                           videos: Sequence[Video]) -> list[np.ndarray]:
        """The audios in token order, each video's sound track at its placeholder."""
        if any(v.audio is None for v in videos):
            raise ValueError("use_audio_in_video needs every video's sound track")
        media = (self.audio_token_id, self.video_token_id)
        if token_ids.count(self.audio_token_id) != len(audios) or token_ids.count(self.video_token_id) != len(videos):
            raise ValueError("use_audio_in_video: the audio and video placeholders do not match the items given")
        given, tracks = iter(audios), iter(v.audio for v in videos)
        return [next(given) if t == self.audio_token_id else next(tracks) for t in token_ids if t in media]

    def _interleaved(self, token_ids: list[int], video: Mapping[str, torch.Tensor],
                     audio_rows: list[int]) -> list[list[int]]:
        """Each video's placeholder expansion: its sound track's rows (the audio item at its place) interleaved;
        the audio placeholders and rows of the sound tracks are taken out of ``audio_rows``."""
        order = [t for t in token_ids if t in (self.audio_token_id, self.video_token_id)]
        track_rows = [rows for t, rows in zip(order, audio_rows, strict=True) if t == self.video_token_id]
        audio_rows[:] = [rows for t, rows in zip(order, audio_rows, strict=True) if t == self.audio_token_id]
        grids, seconds = video["video_grid_thw"].tolist(), video["video_second_per_grid"].tolist()
        return [self.layout.tokens(g, s, r) for g, s, r in zip(grids, seconds, track_rows, strict=True)]

    def _audio_inputs(self, audios: Sequence[np.ndarray | ListenedAudio]) -> dict[str, torch.Tensor]:
        if not audios:
            return {}
        # Each audio alone (the processor pads them together, changing the last mel frame of shorter ones).
        feats = [self._features(a) for a in audios]
        return {"input_features": torch.cat([f["input_features"] for f in feats]),
                "feature_attention_mask": torch.cat([f["attention_mask"] for f in feats])}

    def _features(self, audio: np.ndarray | ListenedAudio) -> dict[str, torch.Tensor]:
        """One audio's features as transformers' processor makes them (padded to the extractor's ``n_samples``,
        beyond which it truncates); a listened one's leading frames are the ones frozen while it was spoken."""
        samples = audio.samples if isinstance(audio, ListenedAudio) else audio
        out = self.features(samples, sampling_rate=AUDIO_SAMPLE_RATE, return_attention_mask=True,
                            padding="max_length", return_tensors="pt")
        if isinstance(audio, ListenedAudio):
            head, frames = audio.head, out["input_features"]
            if head.shape[0] != frames.shape[1]:
                raise ValueError(f"listened features of {head.shape[0]} mel bins, the extractor makes "
                                 f"{frames.shape[1]}")
            kept = min(head.shape[1], int(out["attention_mask"].sum()))  # none past the extractor's truncation
            frames[0, :, :kept] = head[:, :kept].to(frames.dtype)
        return out

    def _video_inputs(self, videos: Sequence[Video]) -> dict[str, torch.Tensor]:
        if not videos:
            return {}
        out = self.videos(videos)
        return {"pixel_values_videos": out.pixel_values, "video_grid_thw": out.grid_thw,
                "video_second_per_grid": out.second_per_grid}

    def _image_inputs(self, images: Sequence[object]) -> dict[str, torch.Tensor]:
        if not images:
            return {}
        out = self.images(images=list(images), return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _video_patches(images: object, temporal_patch_size: int) -> VideoPatches:
    """The video path's per-frame processor: the image processor's sizes and normalisation, one frame a patch."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    frames = Qwen2VLImageProcessorPil(patch_size=images.patch_size, temporal_patch_size=1,
                                      merge_size=images.merge_size, size=dict(images.size),
                                      image_mean=images.image_mean, image_std=images.image_std)
    return VideoPatches(frames, temporal_patch_size)


def _video_rows(video: Mapping[str, torch.Tensor], merge: int) -> list[int]:
    grid = video.get("video_grid_thw")
    return [] if grid is None else [int(g.prod()) // merge**2 for g in grid]


def _audio_rows(audio: Mapping[str, torch.Tensor]) -> list[int]:
    mask = audio.get("feature_attention_mask")
    return [] if mask is None else [audio_output_length(int(n)) for n in mask.sum(-1)]


def _image_rows(image: Mapping[str, torch.Tensor], merge: int) -> list[int]:
    grid = image.get("image_grid_thw")
    return [] if grid is None else [int(g.prod()) // merge**2 for g in grid]


def _contains(ids: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(ids[i:i + n] == part for i in range(len(ids) - n + 1) if ids[i] == part[0])
