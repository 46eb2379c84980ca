"""The web page of `hermes-video serve` in a real headless browser (Debian's chromium driven by
playwright): with the API key entered once it lists the streams, shows a frame, asks a question and
shows the streamed answer; a saved stream a restarted server could not open again is shown with why. A screenshot is written as a test artefact: to $HERMES_TEST_ARTEFACTS
when set (CI keeps that folder), else to the test's temporary folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
playwright_api = pytest.importorskip("playwright.sync_api")

from serve_fixtures import KEY, ServeProcess, synthetic_jpeg  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed "
                                 "(apt-get install -y chromium; .ci/run does)")]


def test_the_page_lists_streams_shows_a_frame_and_answers(tmp_path):
    artefacts = Path(os.environ.get("HERMES_TEST_ARTEFACTS") or tmp_path)
    artefacts.mkdir(parents=True, exist_ok=True)
    serve = ServeProcess([]).start()
    try:
        with serve.client() as c:
            for name in ("door", "yard"):
                assert c.post("/v1/streams", json={"source": "push", "name": name}).status_code == 201
            c.post("/v1/streams/door/watches", json={"question": "Is someone at the door?", "every_s": 1})
            for i in range(8):
                c.post("/v1/streams/door/frames", params={"t_s": i * 0.5}, content=synthetic_jpeg(i * 0.5))
            c.post("/v1/streams/yard/frames", params={"t_s": 0.0}, content=synthetic_jpeg(5.0))
            with playwright_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1100, "height": 800})
                page.goto(serve.url + "/")
                page.fill("#key", KEY)
                page.dispatch_event("#key", "change")  # entered once: kept for the page's every request
                door = page.locator('section[data-stream="door"]')
                door.wait_for(timeout=30_000)
                page.locator('section[data-stream="yard"]').wait_for(timeout=30_000)
                page.wait_for_function(
                    "() => { const i = document.querySelector('section[data-stream=door] img');"
                    " return i && i.complete && i.naturalWidth === 160; }", timeout=30_000)
                door.locator("input[placeholder^='Ask']").fill("What is at the door?")
                door.locator("form button", has_text="Ask").click()
                page.wait_for_selector('section[data-stream="door"] .answer[data-done="1"]', timeout=60_000)
                shown = door.locator(".answer").inner_text()
                door.locator(".events div").first.wait_for(timeout=30_000)  # the watch's first answer
                assert "Is someone at the door?" in door.locator(".events").inner_text()
                page.screenshot(path=str(artefacts / "serve-page.png"), full_page=True)
                assert page.evaluate("localStorage.getItem('hermes-api-key')") == KEY
                browser.close()
            # the same question on the same memory through the API gives the answer the page showed
            expected = c.post("/v1/streams/door/questions", json={"question": "What is at the door?"}).json()
            assert shown.strip() == expected["answer"]
            assert expected["frames_seen"] == 8
        assert (artefacts / "serve-page.png").stat().st_size > 10_000
    finally:
        serve.stop()


def test_the_fps_box_takes_whole_and_fractional_rates_up_to_the_apis_limit():
    """A stream opened from the page with a whole-number fps (once refused by the box's step of 0.5 from
    0.1) reaches the API with that rate; what the API refuses, the box refuses too."""
    from hermes.pipelines.serve.registry import MAX_FPS

    serve = ServeProcess([]).start()
    try:
        with serve.client() as c, playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(serve.url + "/")
            page.fill("#key", KEY)
            page.dispatch_event("#key", "change")
            valid = {}
            for value in ("1", "2", "25", "0.75", "1.3", f"{MAX_FPS:g}", f"{MAX_FPS + 1:g}", "0", "-1"):
                page.fill("#fps", value)
                valid[value] = page.evaluate("document.getElementById('fps').checkValidity()")
            assert valid == {"1": True, "2": True, "25": True, "0.75": True, "1.3": True, f"{MAX_FPS:g}": True,
                             f"{MAX_FPS + 1:g}": False, "0": False, "-1": False}
            page.fill("#source", "push")
            page.fill("#name", "whole")
            page.fill("#fps", "2")
            page.locator("#create button").click()
            page.locator('section[data-stream="whole"]').wait_for(timeout=30_000)
            browser.close()
            assert c.get("/v1/streams/whole").json()["fps"] == 2.0
    finally:
        serve.stop()


def test_the_page_shows_why_a_saved_stream_was_not_opened_again(tmp_path):
    root = tmp_path / "mem"
    (root / "_streams").mkdir(parents=True)
    door = {"source": "push", "memory": None, "fps": None, "name": "door", "watches": []}
    (root / "_streams" / "door.json").write_text(json.dumps(door))  # as a server that stopped left it
    (root / "_streams" / "yard.json").write_text('{"source": "pu')  # torn
    serve = ServeProcess(["--memory-root", str(root)]).start()
    try:
        with playwright_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(serve.url + "/")
            page.fill("#key", KEY)
            page.dispatch_event("#key", "change")
            page.wait_for_function("() => document.querySelector('section[data-stream=door] .gauge') !== null"
                                   " && document.querySelector('section[data-stream=yard] > div.muted')?.textContent",
                                   timeout=30_000)  # both cards drawn: the adopted one whole
            info = page.locator('section[data-stream="yard"] > div.muted').first.inner_text()
            assert info.startswith("error: stream 'yard' is saved but could not be opened again") and "JSON" in info
            assert page.locator("#status").inner_text() == "2 stream(s)"  # no error stopped the refresh
            browser.close()
    finally:
        serve.stop()
