"""The playground at ``/`` in a real browser: Debian's headless Chromium driven by Playwright, its fake microphone
fed from a WAV of espeak-ng speech. The page connects over WebRTC with a key it mints, the server's VAD hears the
turn, the reply's audio arrives and plays (the page's counters, ``window.omnistage.stats``), the transcript shows;
the TTS tab plays speech. Takes a screenshot mid-conversation into the test's temporary folder, and into
``docs/playground.png`` (the README's picture) only when ``OMNISTAGE_UPDATE_SCREENSHOT=1`` is set, so a test run
leaves the checkout clean. Skips, saying why, with no browser."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnistage.entrypoints.openai.api_server import build_app
from omnistage.entrypoints.openai.server_config import AccessPolicy, ServingOptions
from tests.entrypoints.conftest import TEST_LIMITS
from tests.entrypoints.fake_engine import FakeEngine, RecordingProcessor, fake_front_end
from tests.entrypoints.server_thread import ServerThread
from tests.entrypoints.speech_sample import speech, write_wav

CHROMIUM = Path("/usr/bin/chromium")
README_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "playground.png"
KEY = "sk-playground-0123456789"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--use-fake-ui-for-media-stream",
         "--use-fake-device-for-media-stream", "--autoplay-policy=no-user-gesture-required",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    samples, _ = speech("Hello there. What is the weather like today?", 48_000)
    # Chromium loops the file: a second of quiet, the sentence, then quiet long enough for the reply to play.
    return write_wav(tmp_path_factory.mktemp("mic") / "speech.wav", samples, 48_000, lead_s=1.0, tail_s=5.0)


@pytest.fixture(scope="module")
def browser(speech_wav: Path) -> Iterator[Any]:
    if not CHROMIUM.exists() and shutil.which("chromium") is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium): the playground was not tried in a browser")
    from playwright.sync_api import Error, sync_playwright

    with sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                                  args=[*FLAGS, f"--use-file-for-fake-audio-capture={speech_wav}"])
        except Error as exc:
            pytest.skip(f"Chromium would not start here: {str(exc).splitlines()[0]}")
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(processor: RecordingProcessor) -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(fake_front_end(processor))
    engine.chunk_seconds = 0.3  # a reply of ~2 s: it plays while the screenshot is taken
    app = build_app(engine, TEST_LIMITS, access=AccessPolicy(api_keys=(KEY,)), serving=ServingOptions(vad="energy"))
    thread = ServerThread(app)
    yield thread.start(), engine
    thread.stop()


def stats(page: Any) -> dict[str, Any]:  # noqa: ANN401 - a Playwright page
    return page.evaluate("() => ({...window.omnistage.stats})")


def wait_for(page: Any, condition: str, timeout_ms: int = 20_000) -> None:  # noqa: ANN401
    page.wait_for_function(f"() => {{ const s = window.omnistage.stats; return {condition}; }}", timeout=timeout_ms)


def test_talk_to_the_model_and_hear_the_tts_in_a_browser(browser: Any,  # noqa: ANN401 - Playwright's Browser
                                                          server: tuple[str, FakeEngine], tmp_path: Path) -> None:
    base_url, _ = server
    page = browser.new_page(viewport={"width": 1000, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(base_url + "/")
    page.fill("#api-key", KEY)  # the server has a key: the page asks for it once
    page.click("#key-form button")
    page.evaluate("() => window.omnistage.ready")
    assert page.locator("#model option").first.text_content() == "fake-omni"
    page.fill("#voice", "Ethan")
    page.fill("#instructions", "Answer in one sentence.")
    page.click("#connect")
    wait_for(page, "s.connected")
    wait_for(page, "s.turnsCommitted >= 1")  # the server's VAD heard the sentence
    wait_for(page, "s.loudReplyFrames >= 5 && s.transcriptChars > 0")  # the reply plays; its words show
    page.wait_for_function("() => document.querySelector('#transcript .line.user .text').textContent.length > 0")
    page.wait_for_timeout(300)  # one more refresh of the live figures
    update_readme = os.environ.get("OMNISTAGE_UPDATE_SCREENSHOT") == "1"
    screenshot = README_SCREENSHOT if update_readme else tmp_path / "playground.png"
    page.screenshot(path=str(screenshot))  # mid-conversation: the transcript and live figures
    assert screenshot.stat().st_size > 10_000  # a rendered page, not an empty image
    transcript = page.text_content("#transcript")
    assert "fake engine" in transcript and "You" in transcript and "Model" in transcript
    figures = stats(page)
    assert figures["firstAudioMs"] is not None and figures["firstAudioMs"] < 10_000
    assert figures["audioStarted"] >= 1 and figures["packetsReceived"] > 0 and figures["errors"] == []
    page.click("#hangup")
    wait_for(page, "!s.connected")

    page.click("#tab-tts")
    page.fill("#tts-text", "Hello from the text to speech tab.")
    page.click("#speak")
    wait_for(page, "s.ttsPlays >= 1 && s.ttsBytes > 1000")
    assert not errors, errors
    assert stats(page)["errors"] == []
    page.close()
