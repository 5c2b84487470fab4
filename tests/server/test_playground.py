"""The playground page: served from the package's own files behind the API key, and driven in a real
browser (headless Chromium from the OS packages, through Playwright) that types a prompt, waits for
the answer and checks each denoising pass's canvas frame arrived, in order. The screenshot is kept
under $DLM_ARTIFACTS (default: .artifacts/ in the checkout)."""

import base64
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
import httpx  # noqa: E402
from tests.helpers import serve_in_thread  # noqa: E402

from dlm_backend.server import create_app  # noqa: E402
from dlm_backend.server.settings import ServerConfig  # noqa: E402

KEY = "playground-test-key"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("DLM_ARTIFACTS", ROOT / ".artifacts"))
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
NO_BROWSER = ("no Chromium on this machine (.ci/setup installs the OS package 'chromium' where it can: as root "
              "with apt-get)" if CHROMIUM is None else
              "Playwright is not installed (the [dev] extra has it)" if importlib.util.find_spec("playwright") is None
              else None)


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(config=ServerConfig(api_key=KEY))) as base:
        yield base


def _basic(password: str) -> dict:
    return {"authorization": "Basic " + base64.b64encode(f"me:{password}".encode()).decode()}


def test_the_page_and_its_files_are_behind_the_key(url):
    bare = httpx.get(url + "/playground")
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Basic")
    assert httpx.get(url + "/playground", headers=_basic("wrong")).status_code == 401
    page = httpx.get(url + "/playground", headers=_basic(KEY))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "/playground/playground.js" in page.text and "http" not in page.text.split("<body>")[1]  # no CDN
    script = httpx.get(url + "/playground/playground.js", headers={"authorization": f"Bearer {KEY}"})
    assert script.status_code == 200 and "include_canvas" in script.text
    missing = httpx.get(url + "/playground/secrets.txt", headers=_basic(KEY))
    assert missing.status_code == 404 and "playground.js" in missing.json()["error"]["message"]
    # an API route answers the browser's Basic credentials too, and still the bearer token
    assert httpx.get(url + "/v1/models", headers=_basic(KEY)).status_code == 200
    assert httpx.get(url + "/v1/models").headers["www-authenticate"] == "Bearer"


@pytest.mark.skipif(NO_BROWSER is not None, reason=NO_BROWSER or "")
def test_a_browser_chats_and_watches_each_pass_denoise(url):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            # bypass_csp: the test evaluates its own checks in the page; the page itself needs no eval
            page = browser.new_context(http_credentials={"username": "me", "password": KEY}, bypass_csp=True).new_page()
            page.goto(url + "/playground")
            page.wait_for_function("document.getElementById('model').options.length > 0")
            page.fill("#max_tokens", "32")
            page.fill("#block_length", "8")
            page.fill("#prompt", "What is the capital of France?")
            page.click("#send")
            page.wait_for_function("window.dlmDone === true", timeout=120_000)
            answer = page.locator("#transcript .assistant").inner_text()
            classes = page.locator("#transcript .assistant").get_attribute("class")
            frames = page.evaluate("window.dlmFrames")
            page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
        finally:
            browser.close()
    assert answer.strip() and "error" not in classes
    passes = [f["pass"] for f in frames]
    assert passes == list(range(1, len(passes) + 1))              # every pass, in order
    assert all(f["committed"] for f in frames)                    # each pass committed something
    assert (ARTIFACTS / "playground.png").stat().st_size > 0
