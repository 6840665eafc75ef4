"""Media content parts reach the processor decoded: audio at 16 kHz mono, images as RGB, a video as its sampled
RGB frames and their rate."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.models.qwen3_omni.mrope import audio_output_length
from tests.audio.signals import mp3_bytes, peak_hz, soundfile_bytes, tone
from tests.entrypoints.conftest import LiveServer
from tests.entrypoints.fake_engine import RecordingProcessor
from tests.entrypoints.media_samples import b64, data_url, mp4_bytes, png_bytes


def _ask(server: LiveServer, *parts: dict[str, object]) -> None:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    server.client().chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": content}])


def _input_audio(data: bytes, fmt: str) -> dict[str, object]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}}


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_input_audio_is_resampled_to_16k_mono(server: LiveServer, processor: RecordingProcessor, fmt: str) -> None:
    stereo_44k = tone(440, 1.0, 44100, channels=2)
    _ask(server, _input_audio(soundfile_bytes(stereo_44k, 44100, fmt.upper()), fmt))
    (audio,) = processor.seen_audios
    assert audio.ndim == 1 and audio.dtype == np.float32
    assert len(audio) == 16000
    assert abs(peak_hz(audio, 16000) - 440) < 2
    # The prompt the engine got has the placeholder expanded for one second of audio.
    mm = server.engine.requests[-1].prompt.mm
    assert int(mm.feature_attention_mask.sum()) == 100  # 16 kHz / hop 160


def test_input_audio_mp3(server: LiveServer, processor: RecordingProcessor) -> None:
    _ask(server, _input_audio(mp3_bytes(tone(300, 1.0, 24000), 24000), "mp3"))
    (audio,) = processor.seen_audios
    assert abs(len(audio) - 16000) < 1200
    assert abs(peak_hz(audio, 16000) - 300) < 3


def test_audio_url_data_url(server: LiveServer, processor: RecordingProcessor) -> None:
    wav = soundfile_bytes(tone(440, 0.5, 8000), 8000)
    _ask(server, {"type": "audio_url", "audio_url": {"url": data_url("audio/wav", wav)}})
    assert len(processor.seen_audios[0]) == 8000


def test_image_url_data_url(server: LiveServer, processor: RecordingProcessor) -> None:
    _ask(server, {"type": "image_url", "image_url": {"url": data_url("image/png", png_bytes()), "detail": "low"}})
    (image,) = processor.seen_images
    assert image.mode == "RGB" and image.size == (64, 48)
    assert server.engine.requests[-1].prompt.mm.image_grid_thw is not None


def test_video_url_becomes_one_video(server: LiveServer, processor: RecordingProcessor) -> None:
    _ask(server, {"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4_bytes())}})
    (video,) = processor.seen_videos
    # 2 s at 2 fps would be 4 frames; the test server caps videos at 3, spread over the clip: t = 0, 0.7, 1.4 s.
    assert len(video.frames) == 3 and all(img.size == (64, 64) for img in video.frames)
    assert video.fps == pytest.approx(2 / 1.4)
    assert not processor.seen_images
    request = server.engine.requests[-1].prompt
    # 3 frames padded to 4 → 2 temporal patches; 64-px frames scaled up to the video minimum (384 px, 24 patches).
    assert request.mm.video_grid_thw.tolist() == [[2, 24, 24]]
    assert request.mm.video_second_per_grid.tolist() == pytest.approx([2 / video.fps])
    assert request.token_ids.count(processor.video_token_id) == 2 * 24 * 24 // 4


def _ask_audio_in_video(server: LiveServer, *parts: dict[str, object]) -> None:
    content = [{"type": "text", "text": "What is this?"}, *parts]
    server.client().chat.completions.create(model="fake-omni", messages=[{"role": "user", "content": content}],
                                            extra_body={"mm_processor_kwargs": {"use_audio_in_video": True}})


def test_video_sound_track_is_interleaved_with_its_frames(server: LiveServer, processor: RecordingProcessor) -> None:
    """use_audio_in_video: the track (AAC at 44.1 kHz) is decoded to 16 kHz and joins the audios where the video
    stands, after an earlier audio part; the video's placeholder holds both kinds of tokens."""
    spoken = soundfile_bytes(tone(300, 0.5, 16000), 16000)
    video = mp4_bytes(seconds=2.0, tone_hz=440)
    _ask_audio_in_video(server, _input_audio(spoken, "wav"),
                        {"type": "video_url", "video_url": {"url": data_url("video/mp4", video)}})
    (clip,) = processor.seen_videos
    assert clip.audio is not None and abs(len(clip.audio) - 32000) < 1200  # AAC adds its encoder delay
    assert abs(peak_hz(clip.audio, 16000) - 440) < 3
    prompt = server.engine.requests[-1].prompt
    frames = prompt.mm.feature_attention_mask.sum(-1).tolist()
    assert frames[0] == 50 and abs(frames[1] - 200) <= 8  # the spoken part first, then the track
    ids, tokens = prompt.token_ids, processor.audio_in_video_tokens
    vision_start = ids.index(processor.tokenizer.convert_tokens_to_ids("<|vision_start|>"))
    assert ids[vision_start + 1] == tokens.audio_start_token_id
    body = ids[vision_start + 2:ids.index(tokens.audio_end_token_id, vision_start)]
    assert body.count(processor.video_token_id) == 2 * 24 * 24 // 4
    assert set(body) == {processor.video_token_id, processor.audio_token_id}
    assert body.count(processor.audio_token_id) == audio_output_length(frames[1], processor.n_window)
    # Frames at t = 0 and 1.4 s (fps 1/0.7): temporal steps at 0 and 2 * 0.7 * 13 = 18.2 position ids; each
    # step's 144 tokens come before the audio tokens at or after its time.
    assert body[:144] == [processor.video_token_id] * 144
    assert body[144:144 + 19] == [processor.audio_token_id] * 19
    assert body[144 + 19:2 * 144 + 19] == [processor.video_token_id] * 144


def test_video_sound_track_counts_against_the_audio_budget(server: LiveServer) -> None:
    import openai

    video = mp4_bytes(seconds=6.0, fps=2, tone_hz=440)  # the test server allows 5 s of audio
    with pytest.raises(openai.BadRequestError) as info:
        _ask_audio_in_video(server, {"type": "video_url", "video_url": {"url": data_url("video/mp4", video)}})
    assert info.value.body["code"] == "audio_too_long"
    assert not server.engine.requests


def test_media_order_is_kept(server: LiveServer, processor: RecordingProcessor) -> None:
    first = soundfile_bytes(tone(440, 0.25, 16000), 16000)
    second = soundfile_bytes(tone(440, 0.5, 16000), 16000)
    _ask(server, _input_audio(first, "wav"), {"type": "image_url", "image_url": {"url": data_url("image/png",
                                                                                                 png_bytes())}},
         _input_audio(second, "wav"))
    assert [len(a) for a in processor.seen_audios] == [4000, 8000]


def test_local_file_under_allowed_folder(server: LiveServer, processor: RecordingProcessor) -> None:
    path = server.media_dir / "clip.wav"
    path.write_bytes(soundfile_bytes(tone(440, 0.5, 16000), 16000))
    _ask(server, {"type": "audio_url", "audio_url": {"url": path.as_uri()}})
    assert len(processor.seen_audios[0]) == 8000


def test_frames_spread_over_a_long_video() -> None:
    from omnistage.entrypoints.openai.media.loaders import decode_video
    from omnistage.entrypoints.openai.server_config import ServerLimits

    video = decode_video(mp4_bytes(seconds=6.0), ServerLimits(max_video_frames=3))
    # Frame i of the sample video is grey level 10*i at 10 fps: t = 0, 2, 4 s → levels 0, 200, 400 % 255.
    levels = [int(np.asarray(f)[32, 32, 0]) for f in video.frames]
    assert video.fps == pytest.approx(0.5)
    assert [abs(a - b) <= 12 for a, b in zip(levels, [0, 200, 145], strict=True)] == [True] * 3
