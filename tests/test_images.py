"""Images in, through llama.cpp's multimodal library (mtmd): SmolLM2 with a tiny real Gemma-3 projector
(``tests/mmproj_tiny.py``, random weights, written into tmp). The answers mean nothing; the plumbing is real.

One engine (3 slots) and one server (``--mmproj``, 2 slots) for the module; greedy, a few tokens each."""

from __future__ import annotations

import base64
import ctypes
import sys
from pathlib import Path

import pytest
from mmproj_tiny import TOKENS_PER_IMAGE, png_bytes, write_tiny_mmproj

from localrun.backends.base import Message, SamplingParams
from localrun.backends.images import IMAGE_MARKER, ImageInput, ImageInputError

pytestmark = pytest.mark.model

GREEDY = dict(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory):
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-gemma3.gguf")


@pytest.fixture(scope="module")
def eng(smollm_path, mmproj):
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    plan = simple_plan(read_gguf(smollm_path), n_ctx=512)
    plan.n_parallel = 3
    plan.n_threads = plan.n_threads_batch = 1  # no thread barriers to stall on a busy CPU
    e = load_engine(smollm_path, plan, mmproj=str(mmproj))
    yield e
    e.close()


@pytest.fixture(scope="module")
def srv(smollm_path, mmproj, tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).parent / "clients"))
    from harness import Serve

    s = Serve(smollm_path, tmp_path_factory.mktemp("images-serve"), "--mmproj", str(mmproj), "--parallel", "2",
              "--ctx", "512", "--threads", "1")
    yield s
    s.close()


def _msg(seed: int, text: str = "What is in this picture?") -> Message:
    return Message("user", text + IMAGE_MARKER, images=[ImageInput(png_bytes(seed), "messages[0].content[1]")])


def _run(eng, gens):
    """Step ``gens`` together to the end → their texts (released, KV kept)."""
    out = {id(g): "" for g in gens}
    while not all(g.done for g in gens):
        for g, chunk in eng.step([g for g in gens if not g.done]):
            out[id(g)] += chunk.text
    for g in gens:
        eng.release(g)
    return [out[id(g)] for g in gens]


def _generate(eng, messages, slot=None):
    _, ids = eng.tokenize_chat(messages)
    g = eng.start(ids, SamplingParams(**GREEDY), slot)
    return _run(eng, [g])[0], g


def _mtmd_image_tokens(eng, data: bytes) -> int:
    """The image's token count as llama.cpp's mtmd says it (mtmd_tokenize → mtmd_input_chunk_get_n_tokens)."""
    import llama_cpp.mtmd_cpp as M

    ctx = eng.projector.ctx
    buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
    bm = M.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False)
    text = M.mtmd_input_text()
    text.text = M.mtmd_default_marker()
    text.text_len, text.add_special, text.parse_special = len(text.text), False, True
    chunks = M.mtmd_input_chunks_init()
    assert M.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (M.mtmd_bitmap_p_ctypes * 1)(bm), 1) == 0
    n = sum(M.mtmd_input_chunk_get_n_tokens(M.mtmd_input_chunks_get(chunks, i))
            for i in range(M.mtmd_input_chunks_size(chunks))
            if M.mtmd_input_chunk_get_type(M.mtmd_input_chunks_get(chunks, i)) == 1)
    M.mtmd_input_chunks_free(chunks)
    M.mtmd_bitmap_free(bm)
    return n


def test_image_tokens_are_what_mtmd_says(eng):
    _, ids = eng.tokenize_chat([_msg(1)])
    n = _mtmd_image_tokens(eng, png_bytes(1))
    assert n == TOKENS_PER_IMAGE
    assert sum(1 for t in ids if t < 0) == n  # the image's positions in the prompt, one per mtmd token
    _, g = _generate(eng, [_msg(1)])
    assert g.stats(eng.n_ctx).prompt_tokens == len(ids)


def test_same_image_same_output_other_image_other_logits(eng):
    a0, _ = _generate(eng, [_msg(1)], eng.slots[0])
    a1, _ = _generate(eng, [_msg(1)], eng.slots[1])  # fresh KV on another slot
    a2, _ = _generate(eng, [_msg(1)], eng.slots[0])  # the cached prefix, image included
    assert a0 == a1 == a2

    def first_logits(seed):
        _, ids = eng.tokenize_chat([_msg(seed)])
        g = eng.start(ids, SamplingParams(**GREEDY), eng.slots[2])
        while not g.generated:
            eng.step([g])
        row = eng.logits_row(-1).copy()
        eng.release(g, keep_kv=False)
        return row

    import numpy as np

    assert not np.allclose(first_logits(1), first_logits(2))


def test_text_requests_beside_an_image_keep_their_solo_output(eng):
    texts = [[Message("user", "Name a colour.")], [Message("user", "Count to three.")]]
    for s in eng.slots:  # nothing cached: every request prefills
        s.tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, s.seq_id, 0, -1)
    solo = [_generate(eng, m, eng.slots[0])[0] for m in texts]
    solo_img = _generate(eng, [_msg(3)], eng.slots[0])[0]
    for s in eng.slots:
        s.tokens.clear()
        eng.C.llama_memory_seq_rm(eng.mem, s.seq_id, 0, -1)
    gens = []
    for i, m in enumerate([[_msg(3)]] + texts):
        _, ids = eng.tokenize_chat(m)
        gens.append(eng.start(ids, SamplingParams(**GREEDY), eng.slots[i]))
    together = _run(eng, gens)
    assert together[1:] == solo
    assert together[0] == solo_img


def test_second_turn_reuses_the_image_kv_and_encodes_once(eng):
    first = [_msg(4)]
    reply, g1 = _generate(eng, first, eng.slots[0])
    encoded, decoded = eng.projector.n_encoded, eng.projector.n_decoded
    _, ids = eng.tokenize_chat(first)
    image_end = max(i for i, t in enumerate(ids) if t < 0) + 1
    turn2 = first + [Message("assistant", reply), Message("user", "And the colours?")]
    _, g2 = _generate(eng, turn2)
    assert g2.slot is g1.slot and g2.cached_tokens >= image_end
    assert eng.projector.n_encoded == encoded  # the KV held it: no encode
    assert eng.projector.n_decoded == decoded  # the same file's bytes: its tokens were kept, no decode
    _generate(eng, first, eng.slots[1] if eng.slots[1] is not g1.slot else eng.slots[2])
    assert eng.projector.n_encoded == encoded  # another slot: the embeddings came from the RAM cache


def test_refusals_in_the_engine(eng, smollm_engine):
    with pytest.raises(ImageInputError, match="could not be decoded") as e:
        eng.tokenize_chat([Message("user", "x" + IMAGE_MARKER, images=[ImageInput(b"not an image", "p[0]")])])
    assert e.value.param == "p[0]"
    with pytest.raises(ImageInputError, match="image places"):
        eng.tokenize_chat([Message("user", "no marker", images=[ImageInput(png_bytes(1), "p[0]")])])
    with pytest.raises(ImageInputError) as e:  # a model loaded without a projector
        smollm_engine.tokenize_chat([_msg(1)])
    assert "--mmproj" in e.value.hint


# ---------------------------------------------------------------------------------------------- the wire formats
def _data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def test_openai_chat_counts_the_image_tokens(srv, eng):
    import openai

    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    parts = [{"type": "text", "text": "What is in this picture?"},
             {"type": "image_url", "image_url": {"url": _data_url(1)}}]
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}], **GREEDY)
    _, ids = eng.tokenize_chat([_msg(1)])
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content
    again = c.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}], **GREEDY)
    assert again.choices[0].message.content == r.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= max(i for i, t in enumerate(ids) if t < 0)


def test_openai_refusals_name_the_part_and_the_server_stays_up(srv):
    import openai

    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    bad = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].content\[1\]: the image could not be decoded"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": bad}], **GREEDY)
    url = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with pytest.raises(openai.BadRequestError, match="--allow-image-urls"):
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": url}], **GREEDY)
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], **GREEDY)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_responses_input_image(srv):
    import openai

    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x")
    r = c.responses.create(model="m", max_output_tokens=4, temperature=0, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": _data_url(2)}]}])
    assert r.output_text and r.usage.input_tokens > TOKENS_PER_IMAGE


def test_anthropic_image_block(srv, eng):
    import anthropic

    c = anthropic.Anthropic(base_url=srv.url, api_key="x")
    b64 = base64.b64encode(png_bytes(2)).decode()
    msgs = [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
        {"type": "text", "text": "What is in this picture?"}]}]
    r = c.messages.create(model="m", max_tokens=4, messages=msgs)
    assert r.content[0].text and r.usage.input_tokens > TOKENS_PER_IMAGE
    # the blocks joined as the route joins them: the image's place, a blank line, the text
    _, ids = eng.tokenize_chat([Message("user", IMAGE_MARKER + "\n\nWhat is in this picture?",
                                        images=[ImageInput(png_bytes(2), "p")])])
    assert c.messages.count_tokens(model="m", messages=msgs).input_tokens == len(ids)


def test_ollama_images(srv):
    import httpx
    import ollama

    c = ollama.Client(host=srv.url)
    r = c.chat(model="m", messages=[{"role": "user", "content": "What is in this picture?", "images": [png_bytes(5)]}],
               options={"temperature": 0, "num_predict": 4})
    assert r.message.content and r.prompt_eval_count > TOKENS_PER_IMAGE
    g = c.generate(model="m", prompt="What is in this picture?", images=[png_bytes(6)],
                   options={"temperature": 0, "num_predict": 4})
    assert g.response and g.prompt_eval_count > TOKENS_PER_IMAGE
    assert any(t < 0 for t in g.context)  # the image's place: the next request may send it back
    body = {"model": "m", "prompt": "And the colours?", "context": g.context, "stream": False,
            "options": {"temperature": 0, "num_predict": 4}}
    g2 = httpx.post(srv.url + "/api/generate", json=body, timeout=300).json()
    assert g2["response"] and g2["prompt_eval_count"] > len(g.context)  # the whole prompt, cached or not
    assert g2["prompt_eval_count"] - g2["prompt_cached_count"] < len(g.context)  # the image's KV was reused
    with pytest.raises(ollama.ResponseError, match="could not be decoded"):
        c.chat(model="m", messages=[{"role": "user", "content": "x", "images": [b"not an image"]}])


def test_chat_session_sends_an_attached_image(eng, tmp_path):
    from localrun.chat import ChatSession

    pic = tmp_path / "pic.png"
    pic.write_bytes(png_bytes(7))
    s = ChatSession(eng, SamplingParams(**GREEDY), system=None)
    assert s.attach_image(pic) == 1
    answer = "".join(piece.text for piece in s.send("What is it?"))
    assert answer and s.messages[0].images and not s.images
    assert s.last_stats.prompt_tokens > TOKENS_PER_IMAGE
    saved = s.save(tmp_path / "chat.json").read_text()
    assert "[image]" in saved and IMAGE_MARKER not in saved


def test_fit_inspect_and_show_count_and_name_the_projector(eng, smollm_path, mmproj, tmp_path, capsys, srv):
    import json
    import re
    import shutil

    import httpx

    from localrun.commands.fit import run_fit
    from localrun.commands.inspect import projector_facts
    from localrun.loading import plan_load
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.vision import vision_from_gguf

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / smollm_path.name).symlink_to(smollm_path)
    shutil.copy(mmproj, folder / "mmproj-tiny.gguf")  # found beside the model
    model = str(folder / smollm_path.name)
    # what llama.cpp allocated for the projector's weights: clip.cpp logs each tensor's size, and their sum
    allocated = sum(int(m) for m in re.findall(r"tensor_size=(\d+)", "\n".join(eng.projector.load_log)))
    mib = next(float(m) for m in re.findall(r"model size:\s+([\d.]+) MiB", "\n".join(eng.projector.load_log)))
    assert allocated and round(allocated / 2**20, 2) == mib
    prep = plan_load(model, backend="llamacpp", warn=False)
    assert prep.mmproj_path == folder / "mmproj-tiny.gguf" and prep.plan.mmproj_bytes == allocated
    # its compute buffer for one image: what clip.cpp reserved (its log line), as flash attention went
    fa, logged = _logged_compute(eng.projector.load_log)
    assert vision_from_gguf(read_gguf(mmproj)).compute_bytes(fa) == pytest.approx(logged, rel=0.1)
    assert prep.plan.vision["image_tokens"] == TOKENS_PER_IMAGE == _mtmd_image_tokens(eng, png_bytes(3))
    assert run_fit(model, json_out=True) == 0
    assert json.loads(capsys.readouterr().out)["mmproj_bytes"] == allocated
    assert projector_facts(model) == {"path": str(folder / "mmproj-tiny.gguf"), "projector_type": "gemma3",
                                      "bytes": allocated}
    name = httpx.get(srv.url + "/api/tags").json()["models"][0]["name"]
    show = httpx.post(srv.url + "/api/show", json={"model": name}).json()
    assert "vision" in show["capabilities"] and show["projector_info"]["path"] == str(mmproj)


def _logged_compute(log: list[str]) -> tuple[bool, float]:
    """(flash attention on, the compute buffer in bytes) from clip.cpp's warm-up log lines (the last reserve)."""
    import re

    text = "\n".join(log)
    mib = [float(m) for m in re.findall(r"compute buffer size =\s+([\d.]+) MiB", text)]
    return "flash attention is enabled" in text, mib[-1] * 2**20


@pytest.mark.parametrize("flash_attn", [False, True])
def test_compute_buffer_at_gemma3_size_is_what_clip_reserves(smollm_path, tmp_path, flash_attn):
    """A one-layer projector at Gemma 3's real vision size (896² image, 14-pixel patches, width 1152, FFN 4304,
    16 heads): the planner's compute buffer equals clip.cpp's reserve to its log's 0.01 MiB, with and without
    flash attention (1132 MiB without: the 16 × 4096² attention scores)."""
    from localrun.backends import load_engine
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan
    from localrun.offload.vision import vision_from_gguf

    mm = write_tiny_mmproj(tmp_path / "mmproj-gemma3-size.gguf", image_size=896, patch_size=14, n_embd=1152,
                           n_ff=4304, n_head=16, scale_factor=4)
    plan = simple_plan(read_gguf(smollm_path), n_ctx=256, flash_attn=flash_attn)
    plan.n_threads = plan.n_threads_batch = 1
    e = load_engine(smollm_path, plan, mmproj=str(mm))
    try:
        fa, logged = _logged_compute(e.projector.load_log)
    finally:
        e.close()
    v = vision_from_gguf(read_gguf(mm))
    assert fa == flash_attn and v.image_tokens == 256
    assert abs(v.compute_bytes(flash_attn) - logged) <= 0.005 * 2**20


def test_a_projector_for_another_model_is_refused_or_skipped(smollm_path, tmp_path):
    from localrun.backends import load_engine
    from localrun.errors import BackendError
    from localrun.model.gguf_info import read_gguf
    from localrun.offload.plan import simple_plan

    other = write_tiny_mmproj(tmp_path / "mmproj-other.gguf", n_embd_text=512)
    plan = simple_plan(read_gguf(smollm_path), n_ctx=256)
    with pytest.raises(BackendError, match="n_embd = 576.*n_embd = 512"):
        load_engine(smollm_path, plan, mmproj=str(other))
    e = load_engine(smollm_path, plan, mmproj=str(other), mmproj_optional=True)  # found beside: text only
    try:
        assert e.projector is None
    finally:
        e.close()


def test_url_images_need_the_flag_and_are_size_capped(monkeypatch, eng):
    import http.server
    import threading

    from localrun.server import images as server_images

    png = png_bytes(8)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = png if self.path == "/a.png" else b""
            self.send_response(200 if body else 302)
            self.send_header("Location", "http://127.0.0.1/")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        img = server_images.image_from_url(url + "/a.png", "p")
        msgs = [{"role": "user", "content": IMAGE_MARKER, "images": [img]}]
        with pytest.raises(ImageInputError, match="not fetched") as e:
            server_images.resolve_images(eng, msgs, allow_urls=False)
        assert "--allow-image-urls" in e.value.hint
        with pytest.raises(ImageInputError, match="private, loopback or reserved"):
            server_images.resolve_images(eng, msgs, allow_urls=True)
        monkeypatch.setattr(server_images, "check_public_host", lambda *a: None)  # as if the host were public
        assert server_images.resolve_images(eng, msgs, allow_urls=True)[0]["images"][0].data == png
        with pytest.raises(ImageInputError, match="HTTP 302"):  # redirects are not followed
            server_images.fetch_image(url + "/elsewhere", "p")
        monkeypatch.setattr(server_images, "MAX_IMAGE_BYTES", 100)
        with pytest.raises(ImageInputError, match="over the 100 bytes"):
            server_images.fetch_image(url + "/a.png", "p")
    finally:
        httpd.shutdown()
