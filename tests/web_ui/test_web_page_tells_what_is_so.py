"""The web page says what is so (``localrun/server/web/``, docs/serve.md "Web page"), in Debian's chromium
driven by Playwright, against one ``localrun serve SMOLLM2 GEMMA`` for the module (a 512-token context, one
slot; its HOME has no ~/.cache, so Gemma's PyPI package has not assembled its file where this server would
put it: the package's catalog name points at a path that does not exist, as on a machine where the file was
given by path).

What it checks: the header names the model that answers (the server's default, not the first one listed; a
saved choice the server lacks is dropped with a notice), each request names it and each answer shows which
model wrote it; the Gemma file is listed once, and the picker says it has no chat template; the keyboard
reaches Import, moves into an opened drawer, and Escape closes the drawer (the focus goes back) or stops an
answer; a stopped answer and a stream that ended early show no "context NaN"; the server panel's request
count leaves out the page's own polling; a pull whose stream ends before its "success" line is not "Done";
with the server down a question says so in words and the model list empties; an answer that failed is left
out of the next request with its question (no two user turns in a row), so a 200 KB paste that overflows the
context does not spoil the questions after it; a temperature outside the field's range is refused before it
is sent.

A server that is down, a stream that drops and a pull that ends early are made in the browser
(``page.route``: the connection refused, a body cut short); everything else is the real server on real models.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_harness import (  # noqa: E402
    Page,
    Serve,
    active_sequences,
    wait_until,
)

pytestmark = pytest.mark.model

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
FINAL = ".msg.assistant:last-child:not([data-state='streaming'])"  # an answer that ended, however it ended


@pytest.fixture(scope="module")
def two(smollm_path, gemma_path, tmp_path_factory):
    """``localrun serve SMOLLM2 GEMMA --ctx 512 --parallel 1 --threads 1`` with an empty HOME (no ~/.cache)."""
    d = tmp_path_factory.mktemp("web_two")
    (d / "home").mkdir()
    with pytest.MonkeyPatch.context() as mp:  # the subprocess copies the environment as it starts
        mp.setenv("HOME", str(d / "home"))
        s = Serve(smollm_path, d / "serve", str(gemma_path), "--ctx", "512", "--parallel", "1", "--threads", "1")
    yield s
    s.close()


@pytest.fixture
def page(browser, two):
    p = Page(browser, two.url)
    yield p
    p.close()


def listed(url: str) -> list[dict]:
    return httpx.get(url + "/v1/models", timeout=60).json()["data"]


def default_id(url: str) -> str:
    ids = [m["id"] for m in listed(url) if m["meta"].get("default")]
    assert len(ids) == 1, ids
    return ids[0]


def active_id(p: Page) -> str:
    return p.page.evaluate("() => document.activeElement && document.activeElement.id")


def test_the_header_names_the_model_that_answers(page, two):
    p = page
    models = listed(two.url)
    default = default_id(two.url)
    assert "smollm2" in default.lower()
    # the scenario: Gemma loaded last, so it is listed first, and the default is another model
    assert models[0]["id"] != default and models[0]["meta"]["loaded"]
    p.page.wait_for_function("(d) => document.getElementById('model-name').textContent === d", arg=default)
    p.settings(max_tokens=1, temperature=0)
    with p.page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req, \
            p.page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as resp:
        p.ask("Hi")
    assert req.value.post_data_json["model"] == default  # the page names the model it shows
    assert resp.value.headers["x-localrun-model"] == default
    node = p.last_answer()
    assert node.query_selector(".model-tag").inner_text() == default
    # a saved choice the server does not have: dropped, said, and the default is named instead
    p.page.evaluate("""() => { const k = 'localrun.settings.v1';
        const s = JSON.parse(localStorage.getItem(k) || '{}');
        localStorage.setItem(k, JSON.stringify({...s, model: 'no-such-model'})); }""")
    p.page.reload()
    p.ready()
    p.page.wait_for_selector("#notice:not([hidden])")
    assert "no-such-model" in p.page.inner_text("#notice") and default in p.page.inner_text("#notice")
    assert p.page.inner_text("#model-name") == default
    assert p.errors == []


def test_one_file_is_listed_once_and_a_model_without_a_template_says_so(page, two):
    gemmas = [m for m in listed(two.url) if Path(m["meta"]["path"]).name == GEMMA_FILE]
    assert [m["meta"]["loaded"] for m in gemmas] == [True], [(m["id"], m["meta"]["path"]) for m in gemmas]
    p = page
    p.page.click("#btn-models")
    p.page.wait_for_selector(".model-item")
    items = p.page.locator(".model-item[data-model*='gemma']")
    assert items.count() == 1
    assert "no chat template" in items.inner_text()
    items.click()
    p.page.wait_for_selector(f"#plan[data-model='{gemmas[0]['id']}'][data-state='ready']")
    words = p.page.inner_text("#plan-words")
    assert "no chat template" in words and "--chat-template" in words and "text completion only" in words, words
    assert p.page.is_disabled("#btn-use")
    # a model with a template is offered for chat
    p.page.click(f".model-item[data-model='{default_id(two.url)}']")
    p.page.wait_for_selector("#plan[data-chat='yes'][data-state='ready']")
    assert "It fits on this machine." in p.page.inner_text("#plan-words") and p.page.is_enabled("#btn-use")
    assert p.errors == []


def test_the_keyboard_reaches_the_drawer_and_escape_stops_an_answer(page, two):
    p = page
    p.page.focus("#btn-export")
    p.page.keyboard.press("Tab")
    assert active_id(p) == "btn-import"
    # an opened drawer takes the focus; Escape closes it and gives the focus back
    for opener, inside in (("btn-models", ".model-item"), ("btn-settings", "#set-system")):
        p.page.focus("#" + opener)
        p.page.keyboard.press("Enter")
        p.page.wait_for_function("(s) => document.activeElement.matches(s)", arg=inside)
        assert p.page.evaluate("() => document.getElementById('drawer').contains(document.activeElement)")
        p.page.keyboard.press("Escape")
        p.page.wait_for_selector("#drawer", state="hidden")
        assert active_id(p) == opener
    # Escape stops an answer; the numbers under it carry no "NaN" once the model's context is known
    p.settings(max_tokens=400, temperature=0.8, extra={"ignore_eos": True})
    p.ask("Tell me a long story about a lighthouse.")
    p.page.wait_for_function("() => document.querySelector('.msg.assistant .content')?.textContent.length > 0")
    wait_until(lambda: active_sequences(two.url) >= 1, "the sequence to run on the server")
    p.page.keyboard.press("Escape")
    node = p.last_answer("stopped")
    wait_until(lambda: active_sequences(two.url) == 0, "the server to cancel the sequence")
    p.page.wait_for_function("() => (LR.chat.state.conv.messages.at(-1).stats || {}).n_ctx > 0")
    stats = p.page.inner_text(".msg.assistant:last-child .stats")
    assert "TTFT" in stats and "NaN" not in stats, stats
    assert node.query_selector(".model-tag").inner_text() == default_id(two.url)
    # a stream that ends before its [DONE] (the connection dropped): an error, not an answer, and no NaN
    chunk = {"id": "chatcmpl-cut", "object": "chat.completion.chunk", "created": 0, "model": default_id(two.url),
             "choices": [{"index": 0, "delta": {"content": "Once upon"}, "finish_reason": None}]}
    p.page.route("**/v1/chat/completions", lambda r: r.fulfill(
        status=200, content_type="text/event-stream", body="data: " + json.dumps(chunk) + "\n\n"))
    p.ask("Another story, please.")
    node = p.page.wait_for_selector(FINAL)
    p.page.unroute("**/v1/chat/completions")
    assert node.get_attribute("data-state") == "error"
    assert "dropped before the answer finished" in node.query_selector(".error").inner_text()
    p.page.wait_for_function("() => (LR.chat.state.conv.messages.at(-1).stats || {}).n_ctx > 0")
    assert "NaN" not in p.page.inner_text(".msg.assistant:last-child .stats")
    assert p.errors == []


def test_the_request_count_leaves_out_the_pages_own_polling(page, two):
    p = page
    p.page.click("#btn-server")
    p.page.wait_for_selector("#server-summary .stat")

    def stat(label: str) -> int:
        return int(p.page.evaluate("""(l) => [...document.querySelectorAll('#server-summary .stat')]
            .find((s) => s.querySelector('.stat-label').textContent === l).querySelector('.stat-value').textContent""",
                                   label))

    before, reads = stat("requests"), stat("status reads")
    for _ in range(3):
        p.page.evaluate("() => LR.panel.tick()")
    assert stat("requests") == before
    # each tick reads /api/ps and /metrics, counted apart: at least 5 more by the third tick's /metrics (a
    # response is counted as its last bytes go out, so a tick's own /metrics, and maybe its /api/ps, come later)
    assert stat("status reads") >= reads + 5
    # a request that asks a model for something (its tokens: no generation needed) is counted
    r = httpx.post(two.url + "/tokenize", timeout=120, json={"content": "Hi"})
    assert r.status_code == 200 and r.json()["tokens"]
    p.page.evaluate("() => LR.panel.tick()")
    assert stat("requests") == before + 1
    assert p.errors == []


def test_a_pull_that_ends_early_is_not_done(page):
    """The page's connection to the server drops halfway through a pull: the lines the server sends, with
    no ``{"status": "success"}`` at the end."""
    total, half = 639 * 2**20, 320 * 2**20
    lines = [{"status": "pulling manifest"}] + [
        {"status": "pulling 0123456789ab", "digest": "sha256:0123456789ab", "total": total, "completed": n}
        for n in (0, 2**20, half)]
    p = page
    p.page.route("**/api/pull", lambda r: r.fulfill(status=200, content_type="application/x-ndjson",
                                                     body="".join(json.dumps(x) + "\n" for x in lines)))
    p.page.click("#btn-models")
    p.page.fill("#pull-name", "smollm2-135m-instruct:Q4_1")
    p.page.click("#btn-pull")
    p.page.wait_for_selector("#pull[data-state='done'], #pull[data-state='error']")
    assert p.page.get_attribute("#pull", "data-state") == "error"
    status = p.page.inner_text("#pull-status")
    assert "stopped before it finished" in status and "320.0 MiB of 639.0 MiB" in status, status
    bar = p.page.evaluate("() => { const b = document.getElementById('pull-progress'); return [b.value, b.max]; }")
    assert bar == [half, total]
    assert p.errors == []


def test_failures_are_said_and_left_out_of_the_next_question(page, two):
    p = page
    sent: list[dict] = []
    p.page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/chat/completions") else None)
    # a temperature the server refuses: the field says so, and the question is not sent
    p.page.click("#btn-settings")
    p.page.fill("#set-temperature", "5")
    assert "Temperature must be between 0 and 2" in p.page.inner_text("#set-error")
    p.page.click("#drawer-close")
    p.ask("Hi")
    p.page.wait_for_selector("#notice:not([hidden])")
    assert "Temperature" in p.page.inner_text("#notice")
    assert sent == [] and p.page.query_selector(".msg.user") is None
    p.settings(temperature=0, max_tokens=1)
    # the server is down: said in words, and the model list is emptied
    down = re.compile(r"/(v1|api)/")
    p.page.route(down, lambda r: r.abort("connectionrefused"))
    p.ask("Hi")
    node = p.page.wait_for_selector(FINAL)
    assert node.get_attribute("data-state") == "error"
    error = node.query_selector(".error").inner_text()
    assert "not answering" in error and "Failed to fetch" not in error, error
    p.page.wait_for_function("() => document.getElementById('model-name').textContent === 'server unreachable'")
    p.page.click("#btn-models")
    p.page.wait_for_selector("#model-list .error")
    assert p.page.query_selector(".model-item") is None
    p.page.keyboard.press("Escape")
    p.page.unroute(down)
    # back: a paste far longer than the context, refused by the server (the model list comes back)
    p.page.fill("#input", "lorem ipsum " * 17_000)
    p.page.press("#input", "Enter")
    node = p.page.wait_for_selector(FINAL)
    assert node.get_attribute("data-state") == "error"
    assert len(sent[-1]["messages"][-1]["content"]) > 200_000
    # shown folded: its start and a button that shows it all
    shown = p.page.locator(".msg.user:nth-last-child(2) .content")
    assert len(shown.inner_text()) < 5000 and "Show all 204,000 characters" in shown.inner_text()
    p.page.wait_for_function("(d) => document.getElementById('model-name').textContent === d",
                             arg=default_id(two.url))
    # neither failed exchange is sent again: no two user turns in a row, no overflowing paste
    p.ask("Name a colour.")
    assert p.last_answer() is not None
    assert [(m["role"], m["content"]) for m in sent[-1]["messages"]] == [
        ("system", "You are a helpful assistant."), ("user", "Name a colour.")]
    assert len(p.page.query_selector_all(".msg.user")) == 3  # all three questions stay on the screen
