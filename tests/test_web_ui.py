"""llama.cpp's own web UI served by `ggspec serve`, in a real browser: Debian's Chromium driven by
Playwright for Python (the system browser: nothing downloaded). The page loads, a question typed
into it streams an answer with its speed, and nothing the page asks of the server fails.

The UI is built once from the pinned tree by `ggspec build --ui` (or `--tools`); without npm,
Chromium or Playwright these skip, saying which is missing."""

from __future__ import annotations

import shutil

import pytest
from helpers.serving import LiveServer

from ggspec.native import web_ui

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    if web_ui.built() is None:
        pytest.skip("the web UI is not built (`ggspec build --ui`, which needs npm)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python (pip install -e '.[test]')")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


def ask(browser, url: str, question: str, screenshot=None) -> tuple[str, list[str]]:
    """Type a question into the page and wait for its answer to finish: (the page's text, the
    failed requests the page made to the server)."""
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.request.method} {r.url}")
            if r.status >= 400 and r.url.startswith(url) else None)
    try:
        page.goto(url + "/", wait_until="networkidle")
        box = page.locator("textarea").first
        box.fill(question)
        box.press("Enter")
        page.get_by_text("t/s").first.wait_for(timeout=120_000)  # the answer's speed: it is done
        if screenshot is not None:
            page.screenshot(path=str(screenshot))
        return page.locator("body").inner_text(), failed
    finally:
        page.close()


def test_the_page_answers_a_question_streamed_with_its_speed(browser, build_info, tmp_path):
    s = LiveServer("--pair", "tiny-coder", "-np", "2", "-c", "512", ui=True)
    try:
        code, html = s.get("/")
        assert code == 200 and "<html" in html.lower()
        text, failed = ask(browser, s.url, "def add(a, b):", tmp_path / "page.png")
        assert "def add(a, b):" in text and "tokens" in text and "t/s" in text
        # every route the page calls answers as llama-server's would: /tools is llama-server's 403
        # too, where it is started without its built-in tools
        assert [f for f in failed if not f.startswith("403") or not f.endswith("/tools")] == [], failed
        assert s.health()["slots_processing"] == 0
    finally:
        code, log = s.stop()
    assert code == 0, log[-2000:]
    assert "llama.cpp's web UI: http://127.0.0.1" in log


def test_the_page_loads_without_a_key_and_the_api_still_needs_one(browser, build_info):
    """llama-server's rule: the page's own files are open (it loads before a key is typed into its
    settings); every API route still answers 401 without the key."""
    s = LiveServer("--pair", "tiny-coder", "-np", "1", "--api-key", "k", ui=True, api_key="k")
    try:
        import urllib.error
        import urllib.request

        for path in ("/", "/favicon.svg", "/build.json"):
            with urllib.request.urlopen(s.url + path, timeout=30) as r:
                assert r.status == 200, path
        for path in ("/props", "/v1/models", "/slots"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(s.url + path, timeout=30)
            assert e.value.code == 401, path
    finally:
        assert s.stop()[0] == 0


def test_without_npm_the_build_is_one_line_naming_it(monkeypatch):
    """Where the UI is not built and npm is missing, building it is one BuildError naming npm
    (`serve` prints it as a warning and serves the API; `build --ui` as its error line)."""
    from ggspec.native.errors import BuildError

    monkeypatch.setattr(web_ui, "built", lambda key=None: None)
    monkeypatch.setattr(web_ui.shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="npm, which is not installed"):
        web_ui.ensure(log=lambda line: None)
