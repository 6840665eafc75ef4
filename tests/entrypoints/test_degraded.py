"""A server missing some stages (their Ray node lost) is degraded, not down: a request is refused with 503 only if
it needs a missing stage (audio needs the talker and code2wav, text only the thinker); nothing served is unhealthy.
The live version, with a node killed in a network namespace, is ``tests/pipeline/test_ray_node_loss.py``."""

from __future__ import annotations

import pytest

from omnistage.core import Modality
from omnistage.entrypoints.openai.common.admission import Admission, Overloaded
from omnistage.pipeline.reports import HealthReport, ReplicaHealth, StageHealth

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
