"""The web page's API key in a real browser (tests/web_ui/web_harness.py): ``/ui/`` with a trailing slash opens
before the key is given, and the page asks for the key once and keeps it for the tab."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_harness import (  # noqa: E402
    Page,
)

pytestmark = pytest.mark.model


def key_server(tmp_path):
    """A server with an API key and no model (its page, its key dialog, its 401s)."""
    from helpers import ServerThread

    from localrun.config import Settings
    from localrun.server.app import create_app
    from localrun.server.runtime import ServeOptions

    return ServerThread(create_app(None, Settings(home=tmp_path, models_dir=tmp_path / "models"),
                                   ServeOptions(api_key="sesame")))


def test_ui_with_a_trailing_slash_opens_before_the_key(browser, tmp_path):
    """``/ui/`` is the page as ``/ui`` is, with an API key too: the page loads, then asks for the key."""
    srv = key_server(tmp_path)
    p = None
    try:
        assert httpx.get(srv.url + "/ui/").status_code == 200
        p = Page(browser, srv.url, path="/ui/")
        assert p.response.status == 200
        p.page.wait_for_selector("#key-dialog[open]")
    finally:
        if p is not None:
            p.close()
        srv.stop()


def test_the_page_asks_for_the_api_key_once(browser, tmp_path):
    """A server with an API key (no model needed: its page, its key dialog, its 401s): the page itself is
    open, asks for the key on the first 401, keeps it for the tab (sessionStorage, not localStorage) and
    sends it from then on, after a reload too."""
    srv = key_server(tmp_path)
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
