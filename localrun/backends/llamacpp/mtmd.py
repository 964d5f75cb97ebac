"""Images into a llama.cpp sequence through llama.cpp's multimodal library (``llama_cpp.mtmd_cpp``, tools/mtmd).

A ``Projector`` holds the vision projector (``mmproj-*.gguf``) loaded against the engine's model. The shape
follows llama-server (tools/server ``server_tokens``) and mtmd-helper (``mtmd_helper_eval_chunk_single``):

* tokenize: each image is decoded (stb_image, ``mtmd_helper_bitmap_init_from_buf``), hashed (SHA-256 of its
  size and decoded RGB pixels) and run through ``mtmd_tokenize`` on its own → the projector's text around the
  image (Gemma 3's ``<start_of_image>``) and one image chunk of ``mtmd_input_chunk_get_n_tokens`` positions;
* an image chunk enters the prompt as that many pseudo-tokens derived from the hash (negative ids, never sent
  to llama.cpp: a head ``-(2^30) - 1 - key``, then ``-1 - key``; key = 30 bits of the hash), so the prefix
  cache compares images by content: another image never reuses a cached KV, the same one does;
* prefill: when a sequence's prompt reaches an image, that step decodes the image alone (``prefill``): its
  embeddings (``mtmd_encode_chunk``, or the RAM cache by hash) go into the sequence as an embedding batch,
  with non-causal attention when the projector wants it (``mtmd_decode_use_non_causal``: the whole image in one
  ubatch). Other sequences' steps are untouched, so their outputs stay what they are alone.

Positions: one per image token (llama.cpp's usual case). Projectors with M-RoPE positions (Qwen2-VL and
later: ``mtmd_decode_use_mrope``) are refused with an ImageInputError.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from localrun.backends.images import MAX_IMAGE_BYTES, ImageInput, ImageInputError
from localrun.backends.llamacpp.lib import LlamaLog, last_errors
from localrun.backends.llamacpp.params import new_mtmd_context
from localrun.errors import BackendError

KEY_BITS = 30
_HEAD = -(1 << KEY_BITS) - 1  # head pseudo-token = _HEAD - key; body = -1 - key
SENTINEL = -(1 << 40)  # where an image goes while the chat template's text is tokenized (never in a prompt)
CHUNK_TEXT, CHUNK_IMAGE = 0, 1  # mtmd.h enum mtmd_input_chunk_type


def is_pseudo(tok: int) -> bool:
    return tok < 0


def head_key(tok: int) -> int | None:
    """The image key of a head pseudo-token, None for any other token."""
    return _HEAD - tok if tok <= _HEAD else None


def known_head(tokens: Sequence[int]) -> int:
    """The head pseudo-token among an image's tokens (the projector's text around it comes first)."""
    return next(t for t in tokens if head_key(t) is not None)


def pseudo_tokens(key: int, n_tokens: int) -> list[int]:
    """The ``n_tokens`` pseudo-tokens an image with ``key`` occupies in a prompt."""
    return [_HEAD - key] + [-1 - key] * (n_tokens - 1)


@dataclass
class _Image:
    """A tokenized image: its mtmd chunk (owned), content hash and size in positions."""

    chunk: object
    digest: str
    n_tokens: int


class EmbeddingCache:
    """Encoded image embeddings by content hash, least recently used out past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.items: OrderedDict[str, object] = OrderedDict()

    def get(self, digest: str):
        arr = self.items.get(digest)
        if arr is not None:
            self.items.move_to_end(digest)
        return arr

    def put(self, digest: str, arr) -> None:
        if arr.nbytes > self.max_bytes:
            return
        if digest in self.items:
            self.bytes -= self.items.pop(digest).nbytes
        self.items[digest] = arr
        self.bytes += arr.nbytes
        while self.bytes > self.max_bytes:
            self.bytes -= self.items.popitem(last=False)[1].nbytes


class Projector:
    """The vision projector of a ``LlamaCppEngine``: ``mmproj`` loaded with ``mtmd_init_from_file``.

    ``n_encoded``: images encoded so far (a cache hit or a reused KV prefix does not count); ``n_decoded``:
    image files decoded (the same bytes again reuse their tokens, ``by_file``). ``cache``: the
    embeddings by hash (``cache_bytes`` of RAM at most, float32 [n_tokens, n_embd] each). Raises BackendError
    when llama.cpp cannot load the projector (wrong file, another model's width)."""

    def __init__(self, engine, path: str, *, cache_bytes: int = 256 * 1024 * 1024, max_images: int = 256) -> None:
        import llama_cpp.mtmd_cpp as M

        self.M, self.C = M, engine.C
        self.path = str(path)
        LlamaLog.install_mtmd(M)
        mark = LlamaLog.mark()
        self.ctx = new_mtmd_context(M, path, engine.model, engine.plan)
        self.load_log = LlamaLog.since(mark)
        if not self.ctx:
            raise BackendError(f"llama.cpp could not load the projector {path}: {last_errors(self.load_log)}",
                               hint="pass the mmproj file made for this model (--mmproj), or run with "
                                    "LOCALRUN_DEBUG=1 to see llama.cpp's log")
        self.vision = bool(M.mtmd_support_vision(self.ctx))
        self.mrope = bool(M.mtmd_decode_use_mrope(self.ctx))
        inp = getattr(self.C, "llama_model_n_embd_inp", self.C.llama_model_n_embd)
        self.n_embd = int(inp(engine.model))
        self.marker = M.mtmd_default_marker()
        self.images: OrderedDict[int, _Image] = OrderedDict()  # key → image, least recently tokenized first
        # SHA-256 of the file's bytes → its tokens: the same file again (a re-sent screenshot) is not decoded again
        self.by_file: OrderedDict[str, list[int]] = OrderedDict()
        self.max_images = max_images
        self.cache = EmbeddingCache(cache_bytes)
        self.n_encoded = 0
        self.n_decoded = 0  # image files decoded (stb_image) and tokenized; a file seen before is not
        self._lock = threading.Lock()  # tokenizing runs in the server's worker threads
        self._batch = None
        self._batch_n = 0

    # ------------------------------------------------------------------ tokenize (any thread)
    def tokenizer(self, tokenize: Callable[..., list[int]]) -> Callable[..., list[int]]:
        """``tokenize(text, add_special=, parse_special=)`` that turns each image marker (``IMAGE_MARKER``)
        into ``SENTINEL`` and tokenizes the text between markers alone (no BPE merge across an image)."""
        from localrun.backends.images import IMAGE_MARKER

        def tok(text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
            out: list[int] = []
            for i, piece in enumerate(text.split(IMAGE_MARKER)):
                if i:
                    out.append(SENTINEL)
                if piece or (i == 0 and add_special):
                    out += tokenize(piece, add_special=add_special and i == 0, parse_special=parse_special)
            return out

        return tok

    def expand(self, ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
        """``ids`` with the k-th ``SENTINEL`` replaced by image k's tokens (``image_tokens``). Raises
        ImageInputError when the markers and the images do not match."""
        n_marks = sum(1 for t in ids if t == SENTINEL)
        if n_marks != len(images):
            raise ImageInputError(f"the prompt holds {n_marks} image places for {len(images)} images",
                                  param=images[0].part if images else None,
                                  hint="send each image as its own content part")
        out: list[int] = []
        it = iter(images)
        for t in ids:
            out += self.image_tokens(next(it)) if t == SENTINEL else [t]
        return out

    def image_tokens(self, img: ImageInput) -> list[int]:
        """One image → its prompt tokens: the projector's text before and after it and the image's
        pseudo-tokens (``mtmd_tokenize``). Raises ImageInputError (not decodable, too large, no vision
        encoder, M-RoPE positions)."""
        M = self.M
        if not self.vision:
            raise ImageInputError("this model's projector has no vision encoder", param=img.part)
        if self.mrope:
            raise ImageInputError("this projector places images with M-RoPE positions, which localrun does not "
                                  "support yet", param=img.part, hint="use a model without M-RoPE (Gemma 3, SmolVLM)")
        data = img.data or b""
        if len(data) > MAX_IMAGE_BYTES:
            raise ImageInputError(f"{img.part}: the image is {len(data)} bytes, over the {MAX_IMAGE_BYTES} "
                                  "bytes allowed", param=img.part, hint="send a smaller image")
        file_digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            known = self.by_file.get(file_digest)
            if known is not None and head_key(known_head(known)) in self.images:
                self.by_file.move_to_end(file_digest)
                self.images.move_to_end(head_key(known_head(known)))
                return list(known)
            buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data) if data else None
            bm = M.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False) if data else None
            if not bm:
                raise ImageInputError(f"{img.part}: the image could not be decoded", param=img.part,
                                      hint="send a PNG, JPEG, GIF or BMP file's bytes (base64)")
            self.n_decoded += 1
            try:
                tokens = self._tokenize_bitmap(bm, img.part)
            finally:
                M.mtmd_bitmap_free(bm)
            self.by_file[file_digest] = tokens
            while len(self.by_file) > self.max_images:
                self.by_file.popitem(last=False)
            return list(tokens)

    def _tokenize_bitmap(self, bm, part: str) -> list[int]:
        M = self.M
        nx, ny, n = M.mtmd_bitmap_get_nx(bm), M.mtmd_bitmap_get_ny(bm), M.mtmd_bitmap_get_n_bytes(bm)
        pixels = ctypes.string_at(M.mtmd_bitmap_get_data(bm), n)
        digest = hashlib.sha256(f"{nx}x{ny}:".encode() + pixels).hexdigest()
        M.mtmd_bitmap_set_id(bm, digest.encode())
        text = M.mtmd_input_text()
        text.text, text.text_len = self.marker, len(self.marker)
        text.add_special, text.parse_special = False, True
        chunks = M.mtmd_input_chunks_init()
        try:
            rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), (M.mtmd_bitmap_p_ctypes * 1)(bm), 1)
            if rc != 0:
                raise ImageInputError(f"{part}: llama.cpp could not tokenize the image (code {rc})", param=part)
            out: list[int] = []
            for i in range(M.mtmd_input_chunks_size(chunks)):
                out += self._chunk_tokens(M.mtmd_input_chunks_get(chunks, i), digest, part)
            return out
        finally:
            M.mtmd_input_chunks_free(chunks)

    def _chunk_tokens(self, chunk, digest: str, part: str) -> list[int]:
        M = self.M
        kind = M.mtmd_input_chunk_get_type(chunk)
        if kind == CHUNK_TEXT:
            n = ctypes.c_size_t(0)
            ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            return [int(ptr[i]) for i in range(n.value)]
        if kind != CHUNK_IMAGE:
            raise ImageInputError(f"{part}: not an image", param=part)
        n_tok = int(M.mtmd_input_chunk_get_n_tokens(chunk))
        if int(M.mtmd_input_chunk_get_n_pos(chunk)) != n_tok:
            raise ImageInputError(f"{part}: this projector's images take other positions than tokens", param=part)
        key = int(digest[:8], 16) & ((1 << KEY_BITS) - 1)
        old = self.images.pop(key, None)
        if old is not None and old.digest == digest:
            self.images[key] = old
        else:
            if old is not None:
                M.mtmd_input_chunk_free(old.chunk)
            self.images[key] = _Image(M.mtmd_input_chunk_copy(chunk), digest, n_tok)
        while len(self.images) > self.max_images:
            M.mtmd_input_chunk_free(self.images.popitem(last=False)[1].chunk)
        return pseudo_tokens(key, n_tok)

    # ------------------------------------------------------------------ sequences (the engine's thread)
    def spans(self, prompt: Sequence[int]) -> list[tuple[int, int]]:
        """[(start, end)] of the images in ``prompt``. Raises ImageInputError for an image this projector
        no longer holds (tokenized too long ago) or a prompt that ends inside an image."""
        out = []
        for i, t in enumerate(prompt):
            key = head_key(t)
            if key is None:
                continue
            img = self.images.get(key)
            if img is None:
                raise ImageInputError("an image of the prompt is no longer held by the projector",
                                      hint="send the request again")
            if list(prompt[i:i + img.n_tokens]) != pseudo_tokens(key, img.n_tokens):
                raise ImageInputError("the prompt holds part of an image", hint="send the image whole")
            out.append((i, i + img.n_tokens))
        if sum(e - s for s, e in out) != sum(1 for t in prompt if t < 0):
            raise ImageInputError("the prompt holds negative token ids outside any image")
        if out and out[-1][1] >= len(prompt):
            raise ImageInputError("a prompt may not end with an image", hint="add text after the image")
        return out

    def embeddings(self, img: _Image):
        """float32 [n_tokens, n_embd] for ``img``: from the cache, else ``mtmd_encode_chunk``."""
        import numpy as np

        arr = self.cache.get(img.digest)
        if arr is not None:
            return arr
        mark = LlamaLog.mark()
        if self.M.mtmd_encode_chunk(self.ctx, img.chunk) != 0:
            raise BackendError("llama.cpp could not encode an image: " + last_errors(LlamaLog.since(mark)))
        self.n_encoded += 1
        ptr = self.M.mtmd_get_output_embd(self.ctx)
        arr = np.ctypeslib.as_array(ptr, shape=(img.n_tokens * self.n_embd,)).reshape(img.n_tokens, self.n_embd).copy()
        self.cache.put(img.digest, arr)
        return arr

    def prefill(self, engine, g, start: int) -> None:
        """Decode the image whose head is ``g.prompt[start]`` into ``g``'s sequence (positions start ..
        start + n_tokens - 1) and account it (``g.slot.tokens``, ``g.n_prompt_done``). Raises BackendError
        (encode or decode failed: the sequence's KV is cut back to ``start``)."""
        C = self.C
        img = self.images[head_key(g.prompt[start])]
        embd = self.embeddings(img)
        n, seq = img.n_tokens, g.slot.seq_id
        non_causal = bool(self.M.mtmd_decode_use_non_causal(self.ctx, img.chunk))
        if non_causal and n > int(C.llama_n_ubatch(engine.ctx)):
            raise BackendError(f"an image of {n} tokens needs a micro-batch of at least {n} tokens",
                               hint=f"raise --ubatch to {n} or more")
        step = n if non_causal else int(engine.n_batch)
        batch = self._embd_batch(step)
        if non_causal:
            C.llama_set_causal_attn(engine.ctx, False)
        try:
            for i in range(0, n, step):
                m = min(step, n - i)
                ctypes.memmove(batch.embd, embd[i:i + m].ctypes.data, m * self.n_embd * 4)
                for j in range(m):
                    batch.pos[j], batch.n_seq_id[j], batch.logits[j] = start + i + j, 1, 0
                    batch.seq_id[j][0] = seq
                batch.n_tokens = m
                mark = LlamaLog.mark()
                rc = C.llama_decode(engine.ctx, batch)
                if rc != 0:
                    if not C.llama_memory_seq_rm(engine.mem, seq, start, -1):  # a recurrent state: not cut back
                        C.llama_memory_seq_rm(engine.mem, seq, 0, -1)
                        g.slot.forget()
                        g.n_prompt_done = 0
                    raise BackendError(f"llama_decode failed on an image (code {rc}): "
                                       + last_errors(LlamaLog.since(mark)))
        finally:
            if non_causal:
                C.llama_set_causal_attn(engine.ctx, True)
        g.slot.tokens.extend(g.prompt[start:start + n])
        g.n_prompt_done = start + n

    def _embd_batch(self, n: int):
        if self._batch is None or self._batch_n < n:
            if self._batch is not None:
                self.C.llama_batch_free(self._batch)
            self._batch, self._batch_n = self.C.llama_batch_init(n, self.n_embd, 1), n
        return self._batch

    def close(self) -> None:
        M = self.M
        for img in self.images.values():
            M.mtmd_input_chunk_free(img.chunk)
        self.images.clear()
        if self._batch is not None:
            self.C.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None
