"""Pocket TTS against transformers on random checkpoints make-tiny writes (greedy: zero flow noise)."""

import pytest
import torch

from omnistage.families.pocket_tts.checkpoint import load_decoder, load_model
from omnistage.families.pocket_tts.config import PocketCheckpoint
from omnistage.families.pocket_tts.generate import FlowSampling, generate_latents
from omnistage.families.pocket_tts.verify import run_pocket_verify, verification_prompt

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("flow", ["pocket_lsd", "pocket_drifting"])
def test_verify_cases_hold(flow, request):
    """Latents within 1e-5 of transformers' generate, the waveform and the streamed decode within 1e-4."""
    results = run_pocket_verify(request.getfixturevalue(flow), frames=12)
    assert [r.name for r in results] == ["latents", "waveform", "streamed"]
    for r in results:
        assert r.ok, r


def test_lsd_euler_steps_match_transformers(pocket_lsd):
    """More Euler steps change the latents, the same way on both sides."""
    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    model = load_model(pocket_lsd, ckpt)
    ids = verification_prompt(ckpt, [7, 8, 9])
    voice = torch.randn(3, ckpt.model.latent_dim, generator=torch.Generator().manual_seed(3))
    ours = generate_latents(model, ids, FlowSampling(greedy=True, num_flow_steps=3, max_frames=6), voice=voice)
    one = generate_latents(model, ids, FlowSampling(greedy=True, num_flow_steps=1, max_frames=6), voice=voice)
    reference = transformers.PocketTTSForConditionalGeneration.from_pretrained(pocket_lsd).eval()
    out = reference.generate(input_ids=ids[None], audio_prompt_latents=voice[None], do_sample=False,
                             max_new_tokens=6, num_flow_steps=3, frames_after_eos=2, return_dict_in_generate=True)
    torch.testing.assert_close(ours, out.audio_latents[0], atol=1e-5, rtol=0)
    assert (ours - one).abs().max() > 1e-3


def test_eos_stops_as_the_reference(pocket_lsd):
    """A confident EOS head: the first frame past min_frames_before_eos starts the countdown, as transformers'."""
    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    model = load_model(pocket_lsd, ckpt)
    with torch.no_grad():
        model.eos_head.bias.fill_(50.0)
    ids = verification_prompt(ckpt, [7, 8])
    voice = torch.zeros(3, ckpt.model.latent_dim)
    sampling = FlowSampling(greedy=True, max_frames=40, min_frames_before_eos=5, frames_after_eos=3)
    ours = generate_latents(model, ids, sampling, voice=voice)
    assert ours.shape[0] == 5 + 1 + 3  # frames 0-4 cannot end; frame 5 ends; three more
    reference = transformers.PocketTTSForConditionalGeneration.from_pretrained(pocket_lsd).eval()
    with torch.no_grad():
        reference.eos_head.bias.fill_(50.0)
    out = reference.generate(input_ids=ids[None], audio_prompt_latents=voice[None], do_sample=False,
                             max_new_tokens=40, min_frames_before_eos=5, frames_after_eos=3,
                             return_dict_in_generate=True)
    torch.testing.assert_close(ours, out.audio_latents[0], atol=1e-5, rtol=0)


def test_sampling_is_seeded_and_noisy(pocket_lsd):
    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    model = load_model(pocket_lsd, ckpt)
    ids = verification_prompt(ckpt, [7, 8])
    voice = torch.zeros(3, ckpt.model.latent_dim)
    a, b, c = (generate_latents(model, ids, FlowSampling(max_frames=4, seed=s), voice=voice) for s in (1, 1, 2))
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert (a - c).abs().max() > 1e-3


def test_streamed_decode_equals_whole_at_every_split(pocket_lsd):
    """Chunks of 1, 2, 5... frames across the tiny decoder's 12-frame attention window join to the whole."""
    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    decoder = load_decoder(pocket_lsd, ckpt)
    latents = torch.randn(30, ckpt.codec.latent_dim, generator=torch.Generator().manual_seed(5))
    whole = decoder.decode(latents)
    assert whole.shape == (30 * 1920,)
    for size in (1, 2, 5, 13):
        state = decoder.new_state()
        parts = [decoder.decode(latents[i:i + size], state) for i in range(0, 30, size)]
        torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=0)


def test_batched_step_equals_each_sequence_alone(pocket_lsd):
    """Three sequences of different lengths stepped together: each as its own single-sequence step."""
    from omnistage.models.sequence_cache import SequenceCache

    ckpt = PocketCheckpoint.from_folder(pocket_lsd)
    model = load_model(pocket_lsd, ckpt)
    gen = torch.Generator().manual_seed(4)
    prompts = [verification_prompt(ckpt, list(range(5, 5 + n))) for n in (2, 7, 4)]
    voice = torch.randn(3, ckpt.model.latent_dim, generator=gen)
    alone, together = [], []
    latents = torch.randn(3, ckpt.model.latent_dim, generator=gen)
    with torch.inference_mode():
        caches = [SequenceCache() for _ in prompts]
        for ids, cache in zip(prompts, caches):
            model.model(model.prompt_embeds(ids, voice), cache)
        copies = [c.copy() for c in caches]
        for i, cache in enumerate(copies):
            alone.append(model.model(model.latent_embeds(latents[i:i + 1]), cache)[:, -1])
        together = model.model.step(model.latent_embeds(latents), caches)[:, -1]
    torch.testing.assert_close(together, torch.cat(alone), atol=1e-5, rtol=0)
    assert [c.length for c in caches] == [c.length for c in copies]
