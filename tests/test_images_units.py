"""Images, the parts that need no model: wire parsing (data URLs, base64), the URL guard, the pseudo-tokens an
image takes in a prompt, and where the planner puts a projector (``offload.plan.add_projector``)."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest

from localrun.errors import ImageInputError


def test_data_urls_and_base64_decode_and_bad_ones_name_the_part():
    from localrun.server.images import image_from_base64, image_from_url

    raw = b"\x89PNG\r\n\x1a\nrest"
    b64 = base64.b64encode(raw).decode()
    assert image_from_url("data:image/png;base64," + b64, "p").data == raw
    assert image_from_base64(b64[:8] + "\n" + b64[8:], "p").data == raw  # whitespace is ignored
    img = image_from_url("https://example.com/cat.png", "messages[0].content[1]")
    assert img.data is None and img.url == "https://example.com/cat.png"
    for bad, needle in (("file:///etc/passwd", "data: URL or http"), ("data:image/png,abc", "must be base64"),
                        ("data:image/png;base64,@@@", "not valid base64"), ("", "no image URL")):
        with pytest.raises(ImageInputError, match=needle) as e:
            image_from_url(bad, "messages[2].content[0]")
        assert e.value.param == "messages[2].content[0]"


def test_only_public_hosts_are_fetched():
    from localrun.server.images import check_public_host

    for host in ("127.0.0.1", "10.1.2.3", "192.168.0.9", "169.254.169.254", "::1", "localhost", "0.0.0.0"):
        with pytest.raises(ImageInputError, match="private, loopback or reserved"):
            check_public_host(host, 80, "p")
    check_public_host("8.8.8.8", 443, "p")  # a public address literal: no lookup, allowed


def test_an_image_takes_pseudo_tokens_derived_from_its_key():
    from localrun.backends.llamacpp.mtmd import KEY_BITS, head_key, pseudo_tokens

    a, b = pseudo_tokens(5, 16), pseudo_tokens(6, 16)
    assert len(a) == 16 and all(t < 0 for t in a + b) and a[0] != b[0] and a[1] != b[1]
    assert head_key(a[0]) == 5 and head_key(a[1]) is None and head_key(42) is None
    top = pseudo_tokens((1 << KEY_BITS) - 1, 2)
    assert min(top) >= -(2**31) and head_key(top[0]) == (1 << KEY_BITS) - 1 and head_key(top[1]) is None


def test_the_planner_puts_the_projector_on_the_gpu_when_it_fits():
    from localrun.offload.plan import Plan, add_projector

    mib = 2**20

    def plan(**kw):
        return Plan(n_gpu_layers=30, vram_budget_bytes=1000 * mib, vram_bytes=600 * mib, ram_bytes=100 * mib, **kw)

    p = add_projector(plan(), SimpleNamespace(tensor_bytes=300 * mib))
    assert p.mmproj_on_gpu and p.vram_bytes == 900 * mib and p.ram_bytes == 100 * mib and p.mmproj_bytes == 300 * mib
    p = add_projector(plan(), SimpleNamespace(tensor_bytes=500 * mib))  # over the VRAM left
    assert not p.mmproj_on_gpu and p.ram_bytes == 600 * mib and p.vram_bytes == 600 * mib
    p = add_projector(plan(no_mmproj_offload=True), SimpleNamespace(tensor_bytes=300 * mib))
    assert not p.mmproj_on_gpu and p.ram_bytes == 400 * mib
    p = add_projector(Plan(n_gpu_layers=0, ram_budget_bytes=200 * mib), SimpleNamespace(tensor_bytes=300 * mib))
    assert not p.fits and "does not fit" in p.reasons[-1]
