"""Images in a chat: what a wire format hands the engine, whatever the backend.

A message with images carries them in order (``Message.images``, or an ``"images"`` list in a message dict)
and marks where each one goes in its text with ``IMAGE_MARKER`` (private-use code points, which no template
strips or escapes). The engine renders the chat template with the markers in place, then turns each marker
into the image's tokens (llama.cpp: ``backends/llamacpp/mtmd.py``).

Errors: ``ImageInputError`` (a 400 naming the request part: no projector, an image that does not decode,
one too large, markers that do not match the images).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from localrun.errors import ImageInputError

IMAGE_MARKER = "\ue200image\ue201"
MAX_IMAGE_BYTES = 20 * 1024 * 1024  # one encoded image file (PNG, JPEG, …), as sent: 20 MiB
__all__ = ["IMAGE_MARKER", "MAX_IMAGE_BYTES", "ImageInput", "ImageInputError", "images_of", "without_images",
           "has_images", "no_projector_error"]


@dataclass(frozen=True)
class ImageInput:
    """One image of a request: ``data`` the encoded file's bytes (PNG, JPEG, GIF, BMP, … as stb_image reads
    them), or None until ``url`` (an http(s) URL the server fetches) is read; ``part`` the request part it came
    from, named in errors."""

    data: bytes | None
    part: str
    url: str | None = None


def images_of(message) -> list[ImageInput]:
    """The images of ``message`` (a ``Message`` or a template dict), in order; [] for none."""
    imgs = message.get("images") if isinstance(message, dict) else getattr(message, "images", None)
    return list(imgs or [])


def without_images(message):
    """``message`` as the chat template sees it: a dict without its ``images`` (the markers stay in the
    text); a ``Message`` → its ``to_dict()``."""
    d = dict(message) if isinstance(message, dict) else message.to_dict()
    d.pop("images", None)
    return d


def has_images(messages: Sequence) -> bool:
    return any(images_of(m) for m in messages)


def no_projector_error(part: str | None) -> ImageInputError:
    """The refusal for an image sent to a model without a vision projector."""
    return ImageInputError(
        "this model takes no images: it was loaded without a vision projector (mmproj)", param=part,
        hint="start it with --mmproj FILE (the model's mmproj-*.gguf; one beside the model is found by "
             "itself), or send text only")
