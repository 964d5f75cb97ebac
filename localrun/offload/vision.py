"""A vision projector in the plan: its weights, its compute buffer for one image, and an image's tokens.

What llama.cpp's multimodal library (tools/mtmd/clip.cpp) does with a projector, reduced to sizes:

* **weights**: every tensor of the ``mmproj`` GGUF, loaded whole (``clip_model_loader``; its "model size"
  log line). From the file's tensor table, or the catalog's file size before the file is here.
* **image tokens** (``clip_n_output_tokens``): the image is resized to ``image_size``² pixels and cut into
  ``patch_size``² patches, P = (image_size / patch_size)²; Gemma 3, SmolVLM (idefics3), InternVL and
  Llama 4 then merge ``n_merge``² patches into one token: T = P / n_merge². Gemma 3: (896 / 14 / 4)² = 256.
* **compute buffer**: ``clip.cpp`` reserves the graph of one warm-up image of ``warmup_image_size``² (=
  ``image_size`` for fixed-size projectors) with ``ggml_backend_sched_reserve`` and logs "compute buffer
  size". The ViT graph's peak (``clip_graph::build_vit`` / ``build_attn``, f32 activations, d = the
  vision width, F = its FFN width, h = its heads) is the largest of these live sets, in bytes:

  - patch embedding: the image S²·3·4 + its im2col P·3·p²·2;
  - attention without flash attention: the scores h·P²·4 + six P·d·4 tensors (residual, q, k, v, the
    contiguous V and the output) — the P² term is why flash attention matters (Gemma 3: 1 GiB of 1.1);
  - the FFN (also attention's peak with flash attention): P·F·4 + 2·P·d·4, plus Gemma 3's contiguous
    copy of the transposed ``mm.input_projection`` (d × n_embd_text, its type);
  - the projection: that copy + T·d·4 + T·n_embd_text·4.

  Checked against the log line for a one-layer Gemma-3 projector at the real vision size (896 / 14, d 1152,
  F 4304, 16 heads): 1132.00 MiB without flash attention and 105.78 MiB with it, both exact; and for the
  tests' tiny projector within 10% with flash attention (tests/test_images.py). Other projectors run the same
  ViT (their own merge and projection after it): the same terms, an estimate. Flash attention ``None`` (auto)
  counts as on: clip.cpp's warm-up tries it first and falls back only where the backend lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass

# projectors whose tokens are the patches merged n_merge × n_merge (clip.cpp clip_n_output_tokens)
MERGED = frozenset({"gemma3", "idefics3", "internvl", "llama4"})
# projectors made for M-RoPE text models (clip-impl.h PROJECTOR_TYPE names): their image tokens take several
# position ids each, which localrun does not do yet (backends/llamacpp/mtmd.py refuses their images; llama.cpp
# itself decides by the text model's rope type, mtmd.cpp pos_type). The catalog marks these ``refused``.
MROPE = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "glm4v"})


@dataclass(frozen=True)
class VisionSpec:
    """A projector's vision dimensions. Pixels, patches, widths; ``proj_copy_bytes``: Gemma 3's copy of the
    transposed input projection (bytes, 0 for other projectors)."""

    projector: str
    image_size: int  # pixels per side of the warm-up (and fixed-size) image
    patch_size: int  # pixels per side of a patch
    n_embd: int  # vision width d
    n_ff: int  # vision FFN width F
    n_head: int
    n_merge: int = 1  # patches merged per side into one token
    n_embd_text: int = 0  # the text model's width (the projection's output)
    proj_copy_bytes: int = 0

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def image_tokens(self) -> int:
        """Tokens one image takes in the context (clip.cpp ``clip_n_output_tokens``)."""
        n = self.n_patches
        return n // (self.n_merge ** 2) if self.projector in MERGED else n

    @property
    def mrope(self) -> bool:
        return self.projector in MROPE

    def compute_bytes(self, flash_attn: bool | None = None) -> int:
        """The compute buffer clip.cpp reserves for one image (module docstring), bytes."""
        s, p, d, f, h = self.image_size, self.patch_size, self.n_embd, self.n_ff, self.n_head
        n, t = self.n_patches, self.image_tokens
        patch = s * s * 3 * 4 + n * 3 * p * p * 2
        ffn = n * f * 4 + 2 * n * d * 4 + self.proj_copy_bytes
        attn = h * n * n * 4 + 6 * n * d * 4 if flash_attn is False else 0
        out = self.proj_copy_bytes + t * d * 4 + t * self.n_embd_text * 4
        return max(patch, attn, ffn, out)


def vision_from_gguf(spec) -> VisionSpec | None:
    """The VisionSpec of an ``mmproj`` GGUF (``ModelSpec`` of a ``clip`` file: the ``clip.vision.*`` keys
    clip.cpp ``load_hparams`` reads), None when it has no vision encoder."""
    m = getattr(spec, "metadata", None) or {}
    if not m.get("clip.has_vision_encoder", "clip.vision.image_size" in m):
        return None
    proj = str(m.get("clip.projector_type") or m.get("clip.vision.projector_type") or "mlp")
    w = spec.tensor("mm.input_projection.weight")
    copy = 0
    if proj == "gemma3" and w is not None:  # ggml_cont of its transpose: same type, same elements
        copy = w.n_bytes if w.type_name in ("F32", "F16", "BF16") else w.n_elements * 4
    # clip.cpp load_hparams: Gemma 3's merge defaults to 4 (its real projector files do not store it)
    merge = int(m.get("clip.vision.projector.scale_factor") or (4 if proj == "gemma3" else 1))
    return VisionSpec(
        projector=proj, image_size=int(m.get("clip.vision.image_size", 0)),
        patch_size=int(m.get("clip.vision.patch_size", 1)) or 1,
        n_embd=int(m.get("clip.vision.embedding_length", 0)), n_ff=int(m.get("clip.vision.feed_forward_length", 0)),
        n_head=int(m.get("clip.vision.attention.head_count", 1)),
        n_merge=merge,
        n_embd_text=int(m.get("clip.vision.projection_dim", 0)), proj_copy_bytes=copy)


def vision_from_catalog(mmproj: dict, n_embd_text: int) -> VisionSpec:
    """The VisionSpec of a catalog entry's ``mmproj`` table (models.toml; the projector's own GGUF keys,
    read from the file on the hub). Gemma 3's projection copy is counted as F16, the type of the catalog's
    ``mmproj-model-f16.gguf`` files."""
    proj = mmproj["projector"]
    d = int(mmproj["n_embd"])
    return VisionSpec(projector=proj, image_size=int(mmproj["image_size"]), patch_size=int(mmproj["patch_size"]),
                      n_embd=d, n_ff=int(mmproj["n_ff"]), n_head=int(mmproj["n_head"]),
                      n_merge=int(mmproj.get("n_merge", 1)), n_embd_text=n_embd_text,
                      proj_copy_bytes=d * n_embd_text * 2 if proj == "gemma3" else 0)


def add_vision(plan, weights_bytes: int, vision: VisionSpec | None, *, source: str) -> None:
    """Count a projector in ``plan`` (``offload.plan.Plan``), in place: its weights and one image's compute
    buffer on the GPU when the plan offloads layers and both fit in the VRAM left (llama-server's
    ``--mmproj-offload`` default) unless ``plan.no_mmproj_offload``, else in RAM; ``plan.vision`` says the
    projector, the image's tokens and the buffer, with ``source`` (the file, or the catalog). Sets ``fits``
    False when the RAM budget is then exceeded."""
    from localrun.units import fmt_bytes

    compute = vision.compute_bytes(plan.flash_attn) if vision is not None else 0
    need = weights_bytes + compute
    plan.mmproj_bytes = int(weights_bytes)
    plan.mmproj_on_gpu = bool(plan.n_gpu_layers != 0 and plan.vram_budget_bytes and not plan.no_mmproj_offload
                              and need <= plan.vram_budget_bytes - plan.vram_bytes)
    what = f"vision projector ({fmt_bytes(weights_bytes)} weights + {fmt_bytes(compute)} compute buffer for one image)"
    if plan.mmproj_on_gpu:
        plan.vram_bytes += need
        plan.reasons.append(f"{what} on the GPU")
    else:
        plan.ram_bytes += need
        plan.ram_anon_bytes += need
        why = " (--no-mmproj-offload)" if plan.no_mmproj_offload and plan.n_gpu_layers else ""
        plan.reasons.append(f"{what} in RAM{why}")
        if plan.ram_budget_bytes and plan.ram_anon_bytes > plan.ram_budget_bytes:
            plan.fits = False
            plan.reasons.append("the vision projector does not fit next to the model")
    if vision is None:
        plan.vision = {"source": source, "compute_bytes": 0}
        return
    plan.vision = {"projector": vision.projector, "image_size": vision.image_size,
                   "image_tokens": vision.image_tokens, "compute_bytes": compute, "source": source}
    tiles = " (a larger image: that per tile, plus the whole image scaled down)" if vision.projector == "idefics3" \
        else ""
    plan.reasons.append(f"one {vision.image_size}² image = {vision.image_tokens} tokens of the {plan.n_ctx}-token "
                        f"context{tiles} (clip.cpp clip_n_output_tokens)")
