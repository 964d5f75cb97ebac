"""The web-page tests' fixtures: the loopback hub, the module's server on SmolLM2 (and one with a tiny vision
projector), the browser, and a fresh page on the server (tests/web_ui/web_harness.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from web_harness import (  # noqa: E402
    PULL_FILE,
    PULL_REPO,
    SERVE_ARGS,
    Page,
    Serve,
    launch,
    serve_with_hub,
)


@pytest.fixture(scope="module")
def hub(smollm_path):
    """A loopback Hugging Face hub (tests/test_pull_fakehub.py) that has SmolLM2's file as ``PULL_REPO``."""
    from test_pull_fakehub import FakeHub

    h = FakeHub({PULL_REPO: {PULL_FILE: smollm_path}})
    yield h
    h.close()


@pytest.fixture(scope="module")
def server(smollm_path, gemma_path, hub, tmp_path_factory):
    """One ``localrun serve`` on SmolLM2 for the module (a thinking template: ``SERVE_ARGS``); Gemma
    (``gemma_path``: assembled) is listed by name and loads on demand; it pulls from ``hub``."""
    s = serve_with_hub(smollm_path, tmp_path_factory.mktemp("web_serve"), hub.url, *SERVE_ARGS)
    yield s
    s.close()


@pytest.fixture(scope="module")
def vision_server(smollm_path, tmp_path_factory):
    """A second, cheap server (1 thread, a 512-token context, 1 slot) on SmolLM2 with the tiny vision
    projector (tests/mmproj_tiny.py), started by the one test that sends an image."""
    from mmproj_tiny import write_tiny_mmproj

    d = tmp_path_factory.mktemp("web_vision")
    mmproj = write_tiny_mmproj(d / "mmproj-tiny-gemma3.gguf")
    s = Serve(smollm_path, d / "home", "--mmproj", str(mmproj), "--ctx", "512", "--parallel", "1", "--threads", "1")
    yield s
    s.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


@pytest.fixture
def ui(browser, server):
    pages: list[Page] = []

    def make(**kw) -> Page:
        pages.append(Page(browser, server.url, **kw))
        return pages[-1]

    yield make
    for p in pages:
        p.close()


# hands the page a PNG as a drop on the chat or a paste into the message box would (a DataTransfer with a File)
