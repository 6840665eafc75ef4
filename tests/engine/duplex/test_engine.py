"""The duplex engine's tick on a fake model and clock: batching, silence fill, late frames, admission, rows."""

import pytest
import torch

from omnistage.engine.duplex.admission import Admission, SessionRefused, StepTimes
from omnistage.engine.duplex.engine import DuplexEngine
from tests.engine.duplex.fake_model import EchoModel, FakeClock


def _engine(step_s=0.01, per_row_s=0.0, max_rows=8, times=None):
    clock = FakeClock()
    model = EchoModel(clock, max_rows, step_s, per_row_s)
    return DuplexEngine(model, times or StepTimes({1: 0.01}), clock=clock), model, clock


def _collect():
    frames = []
    return frames, frames.append


def test_every_live_session_is_one_row_of_one_step_and_hears_its_own_frames():
    engine, model, clock = _engine()
    (a, on_a), (b, on_b) = _collect(), _collect()
    sa, sb = engine.open(on_a, prompt=1), engine.open(on_b, prompt=2)
    sa.hear(torch.tensor([10, 0]))
    sb.hear(torch.tensor([20, 0]))
    report = engine.tick(clock())
    assert report.rows == 2 and not report.late
    assert [f.codes.tolist() for f in a] == [[1, 10]] and [f.codes.tolist() for f in b] == [[2, 20]]


def test_missing_input_is_heard_as_silence_and_counted():
    engine, model, clock = _engine()
    frames, on = _collect()
    session = engine.open(on, prompt=3)
    engine.tick(clock())
    session.hear(torch.tensor([5, 0]))
    engine.tick(clock())
    assert model.heard[0] == [-7, 5]
    assert session.stats.filled_frames == 1 and session.stats.frames_out == 2


def test_a_step_past_the_frame_sends_silence_counted_late():
    engine, model, clock = _engine(step_s=0.1)  # longer than the 80 ms frame
    frames, on = _collect()
    session = engine.open(on, prompt=4)
    report = engine.tick(clock())
    assert report.late and frames[0].late and frames[0].codes.tolist() == [-7, -7] and frames[0].text == -1
    assert session.stats.late_frames == 1 and frames[0].lateness_s == pytest.approx(0.1)


def test_a_closed_sessions_row_is_taken_by_the_last_and_streams_stay_apart():
    engine, model, clock = _engine()
    outs = [_collect() for _ in range(3)]
    sessions = [engine.open(on, prompt=tag) for tag, (_, on) in zip((1, 2, 3), outs)]
    engine.tick(clock())
    engine.close(sessions[0])
    for s, code in zip(sessions[1:], (22, 33)):
        s.hear(torch.tensor([code, 0]))
    engine.tick(clock())
    assert model.tags == [3, 2]  # the last row moved into the freed one
    assert outs[1][0][-1].codes.tolist() == [2, 22] and outs[2][0][-1].codes.tolist() == [3, 33]
    assert len(outs[0][0]) == 1


def test_admission_refuses_the_session_a_step_could_not_carry_in_real_time():
    times = StepTimes({1: 0.02, 2: 0.04, 4: 0.08})
    admission = Admission(times, frame_s=0.08, max_rows=8, budget=0.75)
    assert admission.capacity() == 3  # 3 rows: 0.06 s <= 0.06 s
    admission.check(2)
    with pytest.raises(SessionRefused, match=r"3 sessions live; a step of 4 would take 80.0 ms of the 80 ms frame"):
        admission.check(3)
    with pytest.raises(SessionRefused, match="all 8 session rows"):
        admission.check(8)


def test_the_engine_refuses_through_admission_and_keeps_times_current():
    engine, model, clock = _engine(step_s=0.05, times=StepTimes({1: 0.01, 2: 0.02}))
    engine.open(lambda f: None)
    engine.open(lambda f: None)
    for _ in range(40):  # ticks of 2 rows take 50 ms: the running average learns it
        engine.tick(clock())
    assert engine.admission.times.predict(2) == pytest.approx(0.05, rel=0.05)
    with pytest.raises(SessionRefused):
        engine.open(lambda f: None)


def test_falling_behind_skips_ticks_with_late_silence_instead_of_holding_everyone_back():
    engine, model, clock = _engine()
    frames, on = _collect()
    engine.open(on, prompt=1)
    assert engine.advance(0.0) == 0.0 and len(frames) == 1  # tick 0, on time
    clock.now = 1.0  # the engine thread was descheduled a second: 11 ticks behind
    engine.advance(0.0)
    assert len(frames) == 12 and all(f.late for f in frames[1:]) and engine._tick == 12
    engine.advance(0.0)  # back on the clock: tick 12 (due at 0.96 s) runs on time
    assert len(frames) == 13 and not frames[-1].late
    assert engine.advance(0.0) == pytest.approx(0.03)  # tick 13 waits for 1.04 s


def test_audio_chunks_of_any_size_become_whole_frames_in_order():
    from omnistage.engine.duplex.session import AudioFramer

    framer = AudioFramer(4)
    assert framer.frames(torch.arange(3.0)) == []
    frames = framer.frames(torch.arange(3.0, 13.0))
    assert [f.tolist() for f in frames] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [f.tolist() for f in framer.frames(torch.arange(13.0, 16.0))] == [[12, 13, 14, 15]]
