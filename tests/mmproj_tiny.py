"""A tiny real vision projector for tests: a Gemma-3 ``mmproj`` GGUF with random weights.

No small vision model can be had here, so the tests write one in the layout llama.cpp's multimodal library
reads (tools/mtmd/clip.cpp ``load_hparams``/``load_tensors`` for ``PROJECTOR_TYPE_GEMMA3``, graph in
tools/mtmd/models/siglip.cpp): a one-layer SigLIP ViT over ``image_size``² pixels in ``patch_size``²
patches, a ``scale_factor``² average pool, an RMS norm and a projection to the text model's ``n_embd``.
Tokens per image = (image_size / patch_size / scale_factor)²; with the defaults 32 / 4 / 2 → 16.
Its answers mean nothing; the plumbing (``mtmd_init_from_file``, ``mtmd_tokenize``, ``mtmd_encode_chunk``,
the embeddings decoded into the text model) is real.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

IMAGE_SIZE = 32
PATCH_SIZE = 4
SCALE_FACTOR = 2
N_EMBD_VISION = 32
N_FF_VISION = 64
N_HEAD_VISION = 2
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH_SIZE // SCALE_FACTOR) ** 2


def write_tiny_mmproj(path: Path, n_embd_text: int = 576, seed: int = 0, *, image_size: int = IMAGE_SIZE,
                      patch_size: int = PATCH_SIZE, n_embd: int = N_EMBD_VISION, n_ff: int = N_FF_VISION,
                      n_head: int = N_HEAD_VISION, scale_factor: int = SCALE_FACTOR) -> Path:
    """Write the projector to ``path`` and return it. ``n_embd_text``: the text model's embedding width
    (SmolLM2-135M: 576), which ``mtmd_init_from_file`` checks against ``mm.input_projection``. The keywords
    give other vision dimensions (one layer always; Gemma 3's real ones are 896 / 14 / 1152 / 4304 / 16 / 4)."""
    import gguf

    rng = np.random.default_rng(seed)
    d, ff, p = n_embd, n_ff, patch_size
    n_patches = (image_size // p) ** 2

    def rand(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "localrun-tiny-gemma3-mmproj")
    w.add_uint32("general.file_type", 0)  # all F32
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", p)
    w.add_uint32("clip.vision.embedding_length", d)
    w.add_uint32("clip.vision.feed_forward_length", ff)
    w.add_uint32("clip.vision.block_count", 1)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projector.scale_factor", scale_factor)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    # numpy shapes are ggml's ne reversed: a (rows, cols) matrix is ne [cols, rows]
    tensors = {
        "v.patch_embd.weight": rand(d, 3, p, p),  # conv2d kernel, ne [p, p, 3, d]
        "v.patch_embd.bias": rand(d),
        "v.position_embd.weight": rand(n_patches, d),
        "v.post_ln.weight": np.ones(d, np.float32),
        "v.post_ln.bias": np.zeros(d, np.float32),
        "mm.soft_emb_norm.weight": np.ones(d, np.float32),
        "mm.input_projection.weight": rand(d, n_embd_text, scale=0.05),  # ne [n_embd_text, d]
    }
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"v.blk.0.{name}.weight"] = rand(d, d)
        tensors[f"v.blk.0.{name}.bias"] = rand(d)
    for name in ("ln1", "ln2"):
        tensors[f"v.blk.0.{name}.weight"] = np.ones(d, np.float32)
        tensors[f"v.blk.0.{name}.bias"] = np.zeros(d, np.float32)
    tensors["v.blk.0.ffn_up.weight"] = rand(ff, d)  # ne [d, ff]
    tensors["v.blk.0.ffn_up.bias"] = rand(ff)
    tensors["v.blk.0.ffn_down.weight"] = rand(d, ff)  # ne [ff, d]
    tensors["v.blk.0.ffn_down.bias"] = rand(d)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def png_bytes(seed: int, size: int = 48) -> bytes:
    """A ``size``² RGB PNG of seeded random pixels (different seeds → different images)."""
    import io

    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, format="PNG")
    return buf.getvalue()
