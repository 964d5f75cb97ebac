"""What the web-page tests share (tests/web_ui/): Debian's chromium driven by Playwright (installed with apt-get
when missing, as root; a failure, never a skip), how the module's server is started next to a loopback Hugging
Face hub, and ``Page``: one browser tab on the page, its console errors collected. The fixtures are in this
folder's conftest.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
from clients.harness import Serve  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
STATIC = Path(__file__).resolve().parents[2] / "localrun" / "server" / "web" / "static"
# SmolLM2 with Qwen's QwQ template (tests/test_reasoning_server.py): the generation prompt opens <think>, so
# every answer streams reasoning_content first; the budget (tokens) then forces the close and the answer
SERVE_ARGS = ("--ctx", "1024", "--parallel", "2", "--reasoning-budget", "4", "--threads", "1",
              "--chat-template", str(TESTS / "data" / "templates" / "Qwen-QwQ-32B.jinja"))
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
# what "Get a model" pulls from the loopback hub: SmolLM2's file under its catalog name
PULL_REPO, PULL_FILE, PULL_NAME = ("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf",
                                   "smollm2-135m-instruct:Q4_1")
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


def serve_with_hub(model: Path, home: Path, hub_url: str, *args: str) -> Serve:
    """``localrun serve`` whose pulls go to the hub at ``hub_url`` (HF_ENDPOINT, no token)."""
    with pytest.MonkeyPatch.context() as mp:  # the subprocess copies the environment as it starts
        mp.setenv("HF_ENDPOINT", hub_url)
        mp.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
        mp.delenv("HF_TOKEN", raising=False)
        return Serve(model, home, *args)


class Page:
    """A fresh browser context on ``/ui``, recording console errors and uncaught page errors. (Conditions are
    waited for with function predicates: a string one is an ``eval``, which the page's CSP refuses.)"""

    def __init__(self, browser, url: str, viewport=(1280, 800), path: str = "/ui") -> None:
        self.ctx = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=True)
        self.ctx.set_default_timeout(WAIT_MS)
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.url = url
        self.response = self.page.goto(url + path)
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


GIVE_IMAGE = """([how, b64]) => { const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dt = new DataTransfer(); dt.items.add(new File([bytes], how + '.png', {type: 'image/png'}));
    const init = {bubbles: true, cancelable: true};
    if (how === 'drop') document.querySelector('.chat').dispatchEvent(new DragEvent('drop',
        {...init, dataTransfer: dt}));
    else document.getElementById('input').dispatchEvent(new ClipboardEvent('paste',
        {...init, clipboardData: dt})); }"""


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
