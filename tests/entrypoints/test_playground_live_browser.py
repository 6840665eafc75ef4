"""The playground's duplex mode in a real browser (Debian's headless Chromium, its fake microphone fed espeak-ng
speech): the page opens its call through ``POST /v1/live/sessions`` (GPT-Live) with a key it mints, the turn is
heard, the reply plays on the call's track and both speakers' transcripts show. Skips with no browser."""

from __future__ import annotations

from typing import Any

from tests.entrypoints.fake_engine import FakeEngine
from tests.entrypoints.test_playground_browser import KEY, browser, server, speech_wav, stats, wait_for  # noqa: F401


def test_duplex_mode_talks_over_gpt_live(browser: Any, server: tuple[str, FakeEngine]) -> None:  # noqa: ANN401, F811
    base_url, _ = server
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base_url + "/")
    page.fill("#api-key", KEY)
    page.click("#key-form button")
    page.evaluate("() => window.omnistage.ready")
    page.select_option("#protocol", "live")
    page.click("#connect")
    wait_for(page, "s.connected")
    assert page.evaluate("() => window.omnistage.stats.callId").startswith("rtc_")  # the Live session's id
    wait_for(page, "s.loudReplyFrames >= 5 && s.transcriptChars > 0 && s.userTranscriptChars > 0")
    transcript = page.text_content("#transcript")
    assert "fake engine" in transcript and "You" in transcript and "Model" in transcript
    page.click("#hangup")
    wait_for(page, "!s.connected")
    assert not errors, errors
    assert stats(page)["errors"] == []
    page.close()
