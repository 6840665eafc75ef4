"""Moshi as the duplex engine's model: rows batched without changing any session's stream, bounded KV, prompts."""

import torch

from omnistage.engine.duplex.admission import calibrate
from omnistage.engine.duplex.engine import DuplexEngine
from omnistage.families.moshi.checkpoint import load_moshi
from omnistage.families.moshi.duplex_model import (
    PROMPT_SILENCE_FRAMES,
    MimiFrames,
    PersonaPrompt,
    load_duplex_model,
    persona_frames,
)
from omnistage.families.moshi.model import DuplexSampling
from omnistage.families.moshi.streams import MoshiStreams
from omnistage.families.moshi.verify import random_prompt


def _run(streams, users, steps):
    texts = []
    for t in range(steps):
        texts.append(streams.step(torch.stack([u[t] for u in users])).text.clone())
    return torch.stack(texts)


def test_a_session_streams_the_same_alone_and_batched_with_others_closing(moshi_tiny):
    model = load_moshi(moshi_tiny)
    cfg = model.cfg
    users = [random_prompt(cfg, 16, seed=s).user for s in range(3)]
    alone = MoshiStreams(model, 1, DuplexSampling.greedy())
    alone.open(random_prompt(cfg, 3, seed=7))
    expected = _run(alone, users[:1], 16)[:, 0]

    batched = MoshiStreams(model, 3, DuplexSampling.greedy())
    batched.open(random_prompt(cfg, 5, seed=8))  # row 0: another session
    batched.open(random_prompt(cfg, 3, seed=7))  # row 1: the session
    batched.open(None)  # row 2
    head = _run(batched, [users[1], users[0], users[2]], 8)[:, 1]
    assert batched.close(0) == 2  # row 2 moves into row 0; the session stays in row 1
    tail = _run(batched, [[u[t + 8] for t in range(8)] for u in (users[2], users[0])], 8)[:, 1]
    assert torch.equal(torch.cat([head, tail]), expected)


def test_a_long_session_keeps_only_its_window_of_kv(moshi_tiny):
    model = load_moshi(moshi_tiny)
    streams = MoshiStreams(model, 1, DuplexSampling.greedy())
    streams.open()
    steps, window = 3 * model.cfg.context + 5, model.cfg.context
    users = random_prompt(model.cfg, steps, seed=2).user
    for t in range(steps):
        streams.step(users[t:t + 1])
    assert streams.cache.keys.shape[3] == window
    assert sorted(streams.cache.positions[0].tolist()) == list(range(steps - window, steps))


def test_a_persona_prompt_is_voice_silence_text_silence_prefilled_at_once(personaplex_tiny):
    duplex = load_duplex_model(personaplex_tiny, max_sessions=2, sampling=DuplexSampling.greedy())
    cfg = duplex.streams.cfg
    frames = MimiFrames((1,) * 8, (2,) * 8)
    voice = torch.randint(0, cfg.audio_vocab_size, (4, 8))
    prompt = persona_frames(PersonaPrompt(voice, [7, 8, 9]), frames, cfg)
    assert len(prompt) == 4 + 2 * PROMPT_SILENCE_FRAMES + 3
    assert prompt.text.tolist() == [3] * (4 + PROMPT_SILENCE_FRAMES) + [7, 8, 9] + [3] * PROMPT_SILENCE_FRAMES
    assert torch.equal(prompt.agent[:4], voice) and (prompt.agent[4:] == 1).all() and (prompt.user == 2).all()
    row = duplex.open(PersonaPrompt(voice, [7, 8, 9]))
    assert int(duplex.streams.pos[row]) == len(prompt)
    out = duplex.step(duplex.silence()[None])
    assert not bool(out.complete[0])  # the prompt's last frame completes; it is not sent
    assert bool(duplex.step(duplex.silence()[None]).complete[0])


def test_the_engine_ticks_moshi_sessions_after_calibrating(moshi_tiny):
    duplex = load_duplex_model(moshi_tiny, max_sessions=4, sampling=DuplexSampling.greedy())
    times = calibrate(duplex, steps=1)
    assert sorted(times.seconds) == [1, 2, 4] and duplex.rows == 0
    engine = DuplexEngine(duplex, times, budget=100.0)  # this test checks the frames, not the host's speed
    got = [[], []]
    sessions = [engine.open(got[i].append) for i in range(2)]
    for t in range(6):
        sessions[0].hear(duplex.silence())
        engine.tick(engine.clock())
    assert [len(g) for g in got] == [6, 6] and sessions[1].stats.filled_frames == 6
    assert got[0][0].text == -1 and all(f.text >= 0 for f in got[0][1:] if not f.late)


def test_agent_audio_is_mimis_whole_decode_of_the_frames_sent_while_rows_move(moshi_tiny):
    """Two sessions open together (one batched codec stream), a third a tick later (its own); the first closes:
    its row leaves the batch, the third's rows move, and every other session's audio stays the whole decode."""
    from omnistage.families.moshi.duplex_model import load_duplex

    served = load_duplex(moshi_tiny, max_sessions=3)
    # a clock that stands still: no frame is late (late frames go out silent), so every frame sent is decoded
    engine = DuplexEngine(served.model, calibrate(served.model, sizes=(1,), steps=1, codec=served.codec),
                          budget=100.0, codec=served.codec, clock=lambda: 0.0)
    got = [[], [], []]
    sessions = [engine.open(got[0].append), engine.open(got[1].append)]
    speech = torch.randn(12, served.codec.samples_per_frame) * 0.1
    for t in range(12):
        if t == 2:
            sessions.append(engine.open(got[2].append))
        if t == 4:
            engine.close(sessions[0])
        for s in sessions[1:]:
            s.hear(speech[t])
        engine.tick(0.0)
    assert len(served.codec.groups) == 2 and [len(g) for g in got] == [4, 12, 10]
    for frames in got[1:]:
        assert not any(f.late for f in frames)
        codes = torch.stack([f.codes for f in frames]).T[None]  # every frame its decoder stream advanced by
        whole = served.codec.codec.decode(codes)[0].view(len(frames), -1)
        for i, f in enumerate(frames):
            torch.testing.assert_close(f.audio, whole[i], rtol=1e-4, atol=1e-5)


def test_personaplex_takes_a_live_sessions_instructions_as_its_text_prompt_and_moshi_none(moshi_tiny,
                                                                                         personaplex_tiny):
    """The ``duplex`` hook's ``prompt``: PersonaPlex's server wraps the text in ``<system>`` tags; the session's
    prompt is prefilled when it opens. Moshi takes none (a live session's instructions are left unused)."""
    from omnistage.families.moshi.duplex_model import load_duplex
    from omnistage.families.moshi.family import tokenizer_of

    persona = load_duplex(personaplex_tiny, 1)
    prompt = persona.prompt("  Be kind. ", "marin")
    tokenizer = tokenizer_of(personaplex_tiny)
    assert prompt.text == tokenizer.encode("<system> Be kind. <system>").ids and len(prompt.voice) == 0
    assert persona.prompt("<system> Hi <system>", None).text == tokenizer.encode("<system> Hi <system>").ids
    assert persona.prompt(None, None) is None and persona.prompt("  ", None) is None
    row = persona.model.open(prompt)
    assert int(persona.model.streams.pos[row]) == 2 * PROMPT_SILENCE_FRAMES + len(prompt.text)
    moshi = load_duplex(moshi_tiny, 1)
    assert moshi.prompt is None and moshi.silent_text == {0, 3}
