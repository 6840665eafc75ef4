"""A server missing some stages (their Ray node lost) is degraded, not down: a request is refused with 503 only if
it needs a missing stage (audio needs the talker and code2wav, text only the thinker); nothing served is unhealthy.
The live version, with a node killed in a network namespace, is ``tests/pipeline/test_ray_node_loss.py``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from omnistage.core import Modality
from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.common.admission import Admission, Overloaded
from omnistage.pipeline.reports import HealthReport, ReplicaHealth, StageHealth
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread

TEXT, AUDIO = frozenset({Modality.TEXT}), frozenset({Modality.TEXT, Modality.AUDIO})
NEEDS = ((Modality.TEXT, frozenset({"thinker"})), (Modality.AUDIO, frozenset({"thinker", "talker", "code2wav"})))


def _report(*down: str, needs: tuple = NEEDS) -> HealthReport:
    return HealthReport(tuple(StageHealth(stage, (ReplicaHealth(0, stage not in down, "lost" if stage in down else ""),
                                                  ReplicaHealth(1, False, "lost")))
                              for stage in ("thinker", "talker", "code2wav")), needs)


@pytest.mark.parametrize(("down", "status", "text", "audio"), [
    ((), "ok", (), ()),
    (("code2wav",), "degraded", (), ("code2wav",)),
    (("talker", "code2wav"), "degraded", (), ("talker", "code2wav")),
    (("thinker",), "unhealthy", ("thinker",), ("thinker",)),
])
def test_the_report_names_what_each_output_lacks(down: tuple[str, ...], status: str, text: tuple[str, ...],
                                                 audio: tuple[str, ...]) -> None:
    report = _report(*down)
    assert report.status == status
    assert report.down(TEXT) == text and report.down(AUDIO) == audio
    assert report.down() == down  # a request that names nothing needs every stage


def test_without_needs_any_missing_stage_is_unhealthy() -> None:
    """A report that does not say what each output needs (an engine that cannot tell) keeps the old rule."""
    report = _report("code2wav", needs=())
    assert report.status == "unhealthy" and report.down(TEXT) == ("code2wav",)


class _Engine:
    def __init__(self, report: HealthReport) -> None:
        self.report = report

    def health(self) -> HealthReport:
        return self.report


def test_admission_refuses_only_requests_that_need_a_missing_stage() -> None:
    admission = Admission(_Engine(_report("talker", "code2wav")), max_requests=4)  # type: ignore[arg-type]
    admission.admit(TEXT).release()
    for modalities in (AUDIO, None):
        with pytest.raises(Overloaded) as refused:
            admission.admit(modalities)
        assert refused.value.status_code == 503 and refused.value.detail.code == "stage_unavailable"
        assert "talker, code2wav" in refused.value.detail.message
        assert refused.value.response().headers["Retry-After"] == "5"
    assert admission.admitted == 0


class _LostAudioStages(FakeEngine):
    def health(self) -> HealthReport:
        return _report("talker", "code2wav")


@pytest.fixture()
def url(processor: RecordingProcessor) -> Iterator[str]:
    thread = ServerThread(build_app(_LostAudioStages(fake_front_end(processor))))
    yield thread.start()
    thread.stop()


def test_a_degraded_server_says_so_and_serves_what_it_can(url: str) -> None:
    health, ready = httpx.get(f"{url}/health"), httpx.get(f"{url}/ready")
    assert (health.status_code, health.json()["status"]) == (200, "degraded")  # alive: a restart would not help
    assert (ready.status_code, ready.json()["status"]) == (503, "degraded")
    chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}]}
    for path, body in (("/v1/chat/completions", {**chat, "modalities": ["text", "audio"]}),
                       ("/v1/responses", {"model": "fake-omni", "input": "hi", "audio": {"voice": "Ethan"},
                                          "stream": True, "modalities": ["text", "audio"]})):
        refused = httpx.post(f"{url}{path}", json=body, timeout=10)
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "5", (path, refused.text)
        assert refused.json()["error"]["code"] == "stage_unavailable"
    assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=10).status_code == 200
    assert httpx.post(f"{url}/v1/responses", json={"model": "fake-omni", "input": "hi"}, timeout=10).status_code == 200
