"""Images on the wire → ``backends.images.ImageInput``: data URLs, base64 fields and (opt-in) http(s) URLs.

* ``image_from_url``: OpenAI's ``image_url.url`` / Responses' ``image_url`` / Anthropic's url source: a
  ``data:[<type>];base64,<data>`` URL is decoded here; an ``http(s)://`` URL is kept for ``resolve_images``.
* ``image_from_base64``: Ollama's ``images`` items and Anthropic's base64 source.
* ``resolve_images``: in a worker thread, before tokenizing: refuses images for a model without a projector
  (naming ``--mmproj``), and fetches URLs only under ``serve --allow-image-urls``: http(s) only, at most
  ``MAX_IMAGE_BYTES``, no redirects, never from loopback, private, link-local or reserved addresses (the
  host's every address is checked before connecting).

Errors: ``ImageInputError`` (400) naming the request part; ``BackendUnavailableError`` (501) for MLX.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import socket
from dataclasses import replace
from urllib.parse import urlsplit

from localrun.backends.images import MAX_IMAGE_BYTES, ImageInput, ImageInputError, images_of, no_projector_error

FETCH_TIMEOUT_S = 10.0


def image_from_base64(data: str, part: str) -> ImageInput:
    """Base64 text (standard alphabet; whitespace ignored) → ``ImageInput``. Raises ImageInputError."""
    if not isinstance(data, str) or not data.strip():
        raise ImageInputError(f"{part}: empty image data", param=part, hint="send the image file's bytes in base64")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 8:
        raise ImageInputError(f"{part}: the image is over the {MAX_IMAGE_BYTES} bytes allowed", param=part,
                              hint="send a smaller image")
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageInputError(f"{part}: the image data is not valid base64", param=part,
                              hint="send the image file's bytes in standard base64") from None
    return ImageInput(raw, part)


def image_from_url(url: str, part: str) -> ImageInput:
    """A ``data:`` URL (decoded now) or an ``http(s)://`` URL (fetched by ``resolve_images``). Raises
    ImageInputError for any other scheme or a data URL that is not base64."""
    if not isinstance(url, str) or not url:
        raise ImageInputError(f"{part}: no image URL", param=part)
    if url[:5].lower() == "data:":
        head, sep, payload = url[5:].partition(",")
        if not sep or not head.lower().endswith(";base64"):
            raise ImageInputError(f"{part}: a data URL must be base64 (data:image/png;base64,…)", param=part)
        return image_from_base64(payload, part)
    if urlsplit(url).scheme.lower() in ("http", "https"):
        return ImageInput(None, part, url=url)
    raise ImageInputError(f"{part}: an image URL must be a data: URL or http(s)", param=part,
                          hint="send the image inline as data:image/png;base64,…")


def resolve_images(engine, messages: list, *, allow_urls: bool) -> list:
    """``messages`` (template dicts) with every URL image fetched. Raises ImageInputError (no projector:
    names ``--mmproj``; a URL while ``--allow-image-urls`` is off; a fetch that fails or is refused),
    BackendUnavailableError (MLX: images need mlx-vlm)."""
    imgs = [img for m in messages for img in images_of(m)]
    if not imgs:
        return messages
    if getattr(engine, "backend", "") == "mlx":
        from localrun.errors import BackendUnavailableError

        raise BackendUnavailableError("images on the MLX backend need mlx-vlm, which localrun does not drive yet",
                                      hint="serve the model's GGUF and its mmproj with --backend llamacpp")
    if getattr(engine, "projector", None) is None:
        raise no_projector_error(imgs[0].part)
    if not any(img.url for img in imgs):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and any(img.url for img in images_of(m)):
            m = {**m, "images": [_fetched(img, allow_urls) if img.url else img for img in images_of(m)]}
        out.append(m)
    return out


def _fetched(img: ImageInput, allow: bool) -> ImageInput:
    if not allow:
        raise ImageInputError(f"{img.part}: image URLs are not fetched by this server", param=img.part,
                              hint="send the image inline (data:image/png;base64,…), or start the server with "
                                   "--allow-image-urls")
    return replace(img, data=fetch_image(img.url, img.part), url=None)


def check_public_host(host: str, port: int, part: str) -> None:
    """Raise ImageInputError unless every address ``host`` resolves to is a public one."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except OSError as e:
        raise ImageInputError(f"{part}: cannot resolve {host} ({e})", param=part) from None
    for info in infos:
        addr = ipaddress.ip_address(info[4][0].split("%")[0])
        if not addr.is_global or addr.is_multicast:
            raise ImageInputError(f"{part}: {host} is a private, loopback or reserved address ({addr}); image URLs "
                                  "are fetched only from public hosts", param=part,
                                  hint="send the image inline (data:image/png;base64,…)")


def fetch_image(url: str, part: str) -> bytes:
    """GET ``url`` (no redirects, ``FETCH_TIMEOUT_S``) → at most ``MAX_IMAGE_BYTES``. Raises ImageInputError."""
    import httpx

    u = urlsplit(url)
    if u.scheme.lower() not in ("http", "https") or not u.hostname:
        raise ImageInputError(f"{part}: not an http(s) URL", param=part)
    check_public_host(u.hostname, u.port or (443 if u.scheme.lower() == "https" else 80), part)
    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=False) as r:
            if r.status_code != 200:
                raise ImageInputError(f"{part}: fetching the image gave HTTP {r.status_code}", param=part)
            data = bytearray()
            for piece in r.iter_bytes():
                data += piece
                if len(data) > MAX_IMAGE_BYTES:
                    raise ImageInputError(f"{part}: the image is over the {MAX_IMAGE_BYTES} bytes allowed",
                                          param=part, hint="send a smaller image")
            return bytes(data)
    except httpx.HTTPError as e:
        raise ImageInputError(f"{part}: the image could not be fetched ({e})", param=part) from None
