"""Turns a prompt (token ids or chat messages) plus raw audio/images/videos into thinker inputs.

transformers' ``Qwen3OmniMoeProcessor`` cannot be built without torchvision
(its video processor), so this does the same work from the parts that load
without it: the tokenizer, the Whisper feature extractor and the PIL image
processor (which ``video_processor.py`` also uses for video frames). Each
``<|audio_pad|>``/``<|image_pad|>``/``<|video_pad|>`` placeholder is expanded to
the number of encoder outputs its item produces, exactly as the processor does.
When the folder has no tokenizer or processor configs (a bare checkpoint), the
feature extractor, image and video processors are built from the model config.
With ``use_audio_in_video`` each video's sound track joins the prompt's audios
and its placeholder interleaves both (``audio_in_video.py``). It meets the family-neutral
``omnistage.processing.prompt.PromptProcessor`` the chat front end is written against.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from omnistage.models.qwen3_omni.config import ProcessorSettings, Qwen3OmniConfig, quiet_known_rope_keys
from omnistage.models.qwen3_omni.inputs import MultimodalInputs
from omnistage.families.qwen3_omni.audio_in_video import AudioInVideoTokens, audio_order, interleaved_placeholder
from omnistage.families.qwen3_omni.video_processor import VideoProcessor
from omnistage.processing.identity_memo import IdentityMemo
from omnistage.processing.listened_audio import ListenedAudio, WindowedLogMel, listened_features
from omnistage.processing.placeholders import expand_placeholders
from omnistage.processing.prompt import AUDIO_SAMPLE_RATE
from omnistage.processing.user_text import guard_for
from omnistage.processing.video import Video


@dataclass(frozen=True)
class Qwen3OmniPrompt:
    """A Qwen3-Omni request's prompt: chat template applied, placeholders expanded, encoder inputs made."""

    token_ids: list[int]
    mm: MultimodalInputs = field(default_factory=MultimodalInputs)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def audio_token_count(feature_lengths: torch.Tensor, n_window: int) -> torch.Tensor:
    """Encoder outputs per audio item: the audio tower's conv strides over windows of 2·n_window frames."""
    chunk = n_window * 2
    rest = feature_lengths % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (feature_lengths // chunk) * 13


class Qwen3OmniPromptProcessor:
    """Prompt preprocessing for one checkpoint folder."""

    def __init__(self, folder: str | Path, settings: ProcessorSettings) -> None:
        self.folder = Path(folder)
        self.audio_token_id = settings.audio_token_id
        self.image_token_id = settings.image_token_id
        self.video_token_id = settings.video_token_id
        self.n_window = settings.n_window
        self.n_window_infer = settings.n_window_infer
        self.merge_size = settings.merge_size
        self.position_id_per_seconds = settings.position_id_per_seconds
        self.tokenizer = self._load_tokenizer()
        self.audio_in_video_tokens = self._audio_in_video_tokens(settings)
        self.features = self._load_feature_extractor(settings.num_mel_bins)
        self._memo: IdentityMemo[np.ndarray | ListenedAudio, dict[str, torch.Tensor]] = IdentityMemo()
        self.images = self._load_image_processor(settings)
        self.videos = VideoProcessor.from_folder(self.folder, settings)

    @classmethod
    def from_folder(cls, folder: str | Path) -> Qwen3OmniPromptProcessor:
        return cls(folder, Qwen3OmniConfig.from_folder(folder).processor)

    def _load_tokenizer(self):  # noqa: ANN202 - transformers tokenizer type
        if not (self.folder / "tokenizer_config.json").exists():
            return None
        from transformers import AutoTokenizer

        with quiet_known_rope_keys():  # AutoTokenizer reads config.json through transformers' config classes
            return AutoTokenizer.from_pretrained(self.folder)

    def _audio_in_video_tokens(self, settings: ProcessorSettings) -> AudioInVideoTokens | None:
        """The markers of an interleaved video, from the config or else the tokenizer (None: neither has them)."""
        start = settings.audio_start_token_id
        end = settings.audio_end_token_id
        if end is None and self.tokenizer is not None:
            found = self.tokenizer.convert_tokens_to_ids("<|audio_end|>")
            end = found if found != self.tokenizer.unk_token_id else None
        if start is None or end is None:
            return None
        return AudioInVideoTokens(self.video_token_id, self.audio_token_id, int(start), int(end))

    def _load_feature_extractor(self, mel_bins: int):  # noqa: ANN202
        from transformers import WhisperFeatureExtractor

        if (self.folder / "preprocessor_config.json").exists():
            return WhisperFeatureExtractor.from_pretrained(self.folder)
        return WhisperFeatureExtractor(feature_size=mel_bins, sampling_rate=AUDIO_SAMPLE_RATE, hop_length=160,
                                       chunk_length=300, n_fft=400, return_attention_mask=True)

    def listener(self) -> WindowedLogMel | None:
        """Features of a growing audio, frozen window by window as the encoder's windows complete (streaming
        input); None when its encoder does not attend in windows of whole conv chunks."""
        chunk = 2 * self.n_window
        if self.n_window_infer <= 0 or self.n_window_infer % chunk or getattr(self.features, "dither", 0.0):
            return None
        return WindowedLogMel(self.features, self.n_window_infer)

    def _load_image_processor(self, settings: ProcessorSettings):  # noqa: ANN202
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        if (self.folder / "preprocessor_config.json").exists():
            cfg = json.loads((self.folder / "preprocessor_config.json").read_text())
            if "patch_size" in cfg:
                keys = ("patch_size", "temporal_patch_size", "merge_size", "size", "image_mean", "image_std")
                return Qwen2VLImageProcessorPil(**{k: cfg[k] for k in keys if k in cfg})
        return Qwen2VLImageProcessorPil(
            patch_size=settings.patch_size, temporal_patch_size=settings.temporal_patch_size,
            merge_size=self.merge_size, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        )

    def apply_chat_template(self, messages: list[dict[str, object]], tools: list[dict[str, object]] | None = None,
                            template_kwargs: dict[str, object] | None = None, assistant_prefix: str = "",
                            ) -> list[int]:
        """The chat as prompt ids, the assistant turn opened. ``tools``: function schemas the template renders;
        ``template_kwargs``: extra template variables (vLLM's ``chat_template_kwargs``, e.g. ``enable_thinking``);
        ``assistant_prefix``: text the answer is made to start with (a forced tool call). Every client string
        stays ordinary text, its control-token strings included (``processing/user_text.py``)."""
        if self.tokenizer is None:
            raise ValueError(f"{self.folder} has no tokenizer: pass prompt token ids instead of messages")
        return guard_for(self.tokenizer).chat_ids(messages, tools, template_kwargs, assistant_prefix)

    def process(self, token_ids: list[int], audios: list[np.ndarray] = (), images: list = (),
                videos: list[Video] = (), use_audio_in_video: bool = False) -> Qwen3OmniPrompt:
        """Expands each placeholder of ``token_ids`` to its item's encoder length; audio is 16 kHz mono float.

        A video's placeholder is one ``<|video_pad|>``, as the chat template renders a video part. With
        ``use_audio_in_video`` every video must carry its sound track (``Video.audio``): the tracks join the
        audios in token order and each video's placeholder becomes the interleaved layout."""
        audios, videos = list(audios), list(videos)
        if use_audio_in_video and videos:
            return self._process_audio_in_video(token_ids, audios, images, videos)
        audio_in, counts_a = self._audio(audios)
        image_in, counts_i = self._images(list(images))
        video_in, counts_v = self._videos(videos)
        expanded = expand_placeholders(token_ids, {self.audio_token_id: counts_a, self.image_token_id: counts_i,
                                                   self.video_token_id: counts_v})
        return self._prompt(expanded, audio_in, image_in, video_in)

    def _process_audio_in_video(self, token_ids: list[int], audios: list[np.ndarray], images: list,
                                videos: list[Video]) -> Qwen3OmniPrompt:
        tokens = self.audio_in_video_tokens
        if tokens is None:
            raise ValueError("use_audio_in_video needs the <|audio_start|>/<|audio_end|> ids (config or tokenizer)")
        missing = [j for j, v in enumerate(videos) if v.audio is None]
        if missing:
            raise ValueError(f"use_audio_in_video: video {missing[0]} has no audio track")
        order = audio_order(token_ids, self.audio_token_id, self.video_token_id, len(audios), len(videos))
        audio_in, counts = self._audio([audios[i] if kind == "audio" else videos[i].audio for kind, i in order])
        image_in, counts_i = self._images(list(images))
        video_in, _ = self._videos(videos)
        standalone = [n for (kind, _), n in zip(order, counts) if kind == "audio"]
        tracks = [n for (kind, _), n in zip(order, counts) if kind == "video"]
        layouts = [interleaved_placeholder(video_in[1][j].tolist(), self.videos.temporal_patch_size / v.fps,
                                           tracks[j], self.merge_size, self.position_id_per_seconds, tokens)
                   for j, v in enumerate(videos)]
        # Each video's one placeholder becomes its interleaved layout, in order.
        expanded = expand_placeholders(token_ids, {self.audio_token_id: standalone, self.image_token_id: counts_i,
                                                   self.video_token_id: layouts})
        return self._prompt(expanded, audio_in, image_in, video_in)

    @staticmethod
    def _prompt(expanded: list[int], audio_in: tuple, image_in: tuple, video_in: tuple) -> Qwen3OmniPrompt:
        mm = MultimodalInputs(
            input_features=audio_in[0], feature_attention_mask=audio_in[1],
            pixel_values=image_in[0], image_grid_thw=image_in[1],
            pixel_values_videos=video_in[0], video_grid_thw=video_in[1], video_second_per_grid=video_in[2],
        )
        return Qwen3OmniPrompt(token_ids=expanded, mm=mm)

    def _audio(self, audios: list[np.ndarray]) -> tuple[tuple, list[int]]:
        if not audios:
            return (None, None), []
        # One audio at a time, then padded: batched, the extractor pads the waveforms first and a shorter
        # audio's last frame sees zeros instead of its own reflection, so its features (and every KV row
        # after it) would depend on the other audios of the prompt and a next turn could not reuse them.
        # A conversation's earlier audios come back at every turn as the same objects: their features once.
        outs = [self._memo.get(a, self._features) for a in audios]
        frames = max(out["input_features"].shape[-1] for out in outs)
        features = torch.zeros(len(outs), outs[0]["input_features"].shape[1], frames)
        mask = torch.zeros(len(outs), frames, dtype=outs[0]["attention_mask"].dtype)
        for i, out in enumerate(outs):
            n = out["input_features"].shape[-1]
            features[i, :, :n] = out["input_features"][0]
            mask[i, :n] = out["attention_mask"][0]
        counts = audio_token_count(mask.sum(-1), self.n_window).tolist()
        return (features, mask), [int(c) for c in counts]

    def _features(self, audio: np.ndarray | ListenedAudio) -> dict[str, torch.Tensor]:
        """One audio's features; a listened one keeps the frames frozen while it was spoken (its leading windows:
        the ones its prompt's earlier requests prefilled), and only the frames after them are computed."""
        if isinstance(audio, ListenedAudio):
            if audio.head.shape[0] != self.features.feature_size:
                raise ValueError(f"listened features of {audio.head.shape[0]} mel bins, the extractor makes "
                                 f"{self.features.feature_size}")
            features = listened_features(self.features, audio).to(torch.float32)
            # The extractor's mask for one unpadded clip: every frame valid.
            return {"input_features": features[None], "attention_mask": torch.ones(1, features.shape[1],
                                                                                   dtype=torch.int32)}
        return self.features(audio.astype(np.float32), sampling_rate=AUDIO_SAMPLE_RATE, return_attention_mask=True,
                             padding=True, truncation=False, return_tensors="pt")

    def _images(self, images: list) -> tuple[tuple, list[int]]:
        if not images:
            return (None, None), []
        out = self.images(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]
        counts = (grid.prod(-1) // self.merge_size**2).tolist()
        return (out["pixel_values"], grid), [int(c) for c in counts]

    def _videos(self, videos: list[Video]) -> tuple[tuple, list[int]]:
        if not videos:
            return (None, None, None), []
        out = self.videos(videos)
        return (out.pixel_values, out.grid_thw, out.second_per_grid), self.videos.token_count(out.grid_thw)
