"""The planner's KV cache and recurrent state for the 2026 layouts (Qwen3.5/3.6 dense and MoE, LFM2, Nemotron-H,
Granite 4.0-H, Gemma 4), held against llama.cpp's own allocation log.

The models are tiny random-weight GGUFs in the real layouts (tests/tiny_layouts.py). Fast tier: the header
facts alone (which layers hold KV, which a recurrent state, how big), from hand-written expectations of
each arch's llama.cpp rules. Model tier: each file loaded by the vendored llama.cpp with localrun's own
model and context parameters at 2 contexts × 2 sequence counts, its ``KV buffer size`` and ``RS buffer
size`` lines against ``offload.memory.kv_cache`` (within 1 %, or within the log's 0.01 MiB print rounding
where a buffer is that small), and the layer counts of each KV cache exactly.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from tiny_layouts import WRITERS, cached_layout

from localrun.model.gguf_info import read_gguf
from localrun.offload.memory import MiB, kv_cache

# widths for the log comparison: big enough that most buffers are ≥ 0.5 MiB at 256 cells and one sequence, so
# the log's 2-decimal MiB print is itself within 1 % (LFM2's short-conv state stays small: 0.03-0.13 MiB)
WIDE = {
    "qwen35": dict(n_head_kv=4, head_dim=64, n_rot=32, ssm_d_state=64, ssm_n_group=4, ssm_dt_rank=8),
    "qwen35moe": dict(n_head_kv=4, head_dim=64, n_rot=32, ssm_d_state=64, ssm_n_group=4, ssm_dt_rank=8),
    "lfm2": dict(n_head_kv=4, n_embd=256, n_head=4, l_cache=9),
    "nemotron_h": dict(n_head_kv=4, n_embd=256, n_head=4, ssm_d_inner=512, ssm_d_state=64, ssm_dt_rank=16),
    "granitehybrid": dict(n_head_kv=4, n_embd=256, n_head=4, ssm_d_state=64, ssm_dt_rank=16),
    "gemma4": dict(),
}
KV_BUF = re.compile(r"llama_kv_cache: +\S+ KV buffer size = +([\d.]+) MiB")
RS_BUF = re.compile(r"llama_memory_recurrent: +\S+ RS buffer size = +([\d.]+) MiB")
KV_SIZE = re.compile(r"llama_kv_cache: size = +[\d.]+ MiB \( *(\d+) cells, +(\d+) layers")


# ------------------------------------------------------------------------------------------ header facts
_HEADERS: dict = {}


def _header(tmp_path, arch, **kw):
    """A header-only file of ``arch`` (no tokenizer, 256 embedding rows), written once per module."""
    key = (arch, tuple(sorted(kw.items())))
    if key not in _HEADERS:
        path = tmp_path / (arch + "".join(f"-{k}{v}" for k, v in sorted(kw.items())) + ".gguf")
        _HEADERS[key] = read_gguf(WRITERS[arch](path, tokenizer_from=False, **kw))
    return _HEADERS[key]


def test_layer_kinds_and_state_sizes_from_the_header(tmp_path):
    """Which layers hold KV and which a recurrent state, and the state's floats, per arch (the rules of each
    arch's load_arch_hparams and create_memory's filters; n_embd_r/n_embd_s of llama-hparams.cpp)."""
    q = _header(tmp_path, "qwen35").layers  # 8 layers, full_attention_interval 4
    assert q.kv_layers == [3, 7] and q.recurrent_layers == [0, 1, 2, 4, 5, 6]
    # gated delta-net: d_conv 4, key heads 2 × 32, value heads 4 × 32 → conv channels 2·64 + 128
    assert (q.r_floats, q.s_floats) == (3 * (128 + 2 * 2 * 32), 32 * 128)
    assert _header(tmp_path, "qwen35", full_attention_interval=2).layers.kv_layers == [1, 3, 5, 7]
    qm = _header(tmp_path, "qwen35moe").layers
    assert qm.kv_layers == [3, 7] and (qm.r_floats, qm.s_floats) == (q.r_floats, q.s_floats)

    lf = _header(tmp_path, "lfm2").layers  # head_count_kv [0, 0, 2, 0, 0, 2]: 0 = short-conv layer
    assert lf.kv_layers == [2, 5] and lf.recurrent_layers == [0, 1, 3, 4]
    assert (lf.r_floats, lf.s_floats) == (128 * (3 - 1), 0)

    nh = _header(tmp_path, "nemotron_h").layers  # M-M*M-M*: MLP layers hold neither
    assert nh.kv_layers == [3, 7] and nh.recurrent_layers == [0, 2, 4, 6]
    assert (nh.r_floats, nh.s_floats) == (3 * (256 + 2 * 2 * 16), 16 * 256)

    gh = _header(tmp_path, "granitehybrid").layers
    assert gh.kv_layers == [3, 7] and gh.recurrent_layers == [0, 1, 2, 4, 5, 6]
    assert (gh.r_floats, gh.s_floats) == (3 * (256 + 2 * 1 * 16), 16 * 256)

    g4 = _header(tmp_path, "gemma4").layers  # SWA ×3 + global, twice; the last 4 layers share KV
    assert g4.kv_layers == [0, 1, 2, 3] and g4.recurrent_layers == []
    assert g4.swa == (True, True, True, False) * 2
    assert g4.head_dim_k[:4] == (32, 32, 32, 64) and g4.n_head_kv[:4] == (4, 4, 4, 1)


def test_hybrid_kv_counts_attention_layers_only_and_state_per_sequence(tmp_path):
    """qwen35 at 4096 × 1, f16 (the issue's numbers): KV = 2 attention layers × 4096 cells × 2 heads × 32 ×
    (K + V) × 2 bytes = 2.00 MiB (it was planned for all 8 layers, 8.00 MiB); the recurrent state does not
    grow with the context and grows with the sequences."""
    spec = _header(tmp_path, "qwen35")
    kv = kv_cache(spec, 4096, flash_attn=True)
    assert kv.attn_bytes == 2 * 4096 * 2 * 32 * 2 * 2 == 2 * MiB
    per_seq = 6 * (spec.layers.r_floats + spec.layers.s_floats) * 4
    assert kv.recurrent_bytes == per_seq
    assert kv_cache(spec, 512, flash_attn=True).recurrent_bytes == per_seq
    assert kv_cache(spec, 4096, n_parallel=4, flash_attn=True).recurrent_bytes == 4 * per_seq
    assert kv_cache(spec, 4096, n_rs_seq=3, flash_attn=True).recurrent_bytes == 4 * per_seq


def test_gemma4_shared_kv_layers_and_swa_heads(tmp_path):
    """Gemma 4: only the first n_layer - shared_kv_layers layers allocate KV; sliding layers use
    key_length_swa and their window-limited cells; without flash attention llama.cpp pads every layer's V
    to the widest (src/llama-kv-cache.cpp, TAG_V_CACHE_VARIABLE)."""
    spec = _header(tmp_path, "gemma4")
    kv = kv_cache(spec, 4096, n_ubatch=64, flash_attn=True)
    base, swa = kv.parts
    assert (base.name, base.cells, base.n_layers) == ("kv_base", 4096, 1)
    assert (swa.name, swa.cells, swa.n_layers) == ("kv_swa", 256, 3)  # GGML_PAD(128 + 64, 256)
    assert base.bytes == 4096 * 1 * 64 * 2 * 2 and swa.bytes == 3 * 256 * 4 * 32 * 2 * 2
    padded = kv_cache(spec, 4096, n_ubatch=64, flash_attn=False)
    assert padded.parts[0].v_bytes == 4096 * 128 * 2  # V of the global layer padded from 64 to 128 wide


def test_fit_json_and_text_carry_the_recurrent_state(tmp_path, capsys):
    """`localrun fit FILE --json` has recurrent_bytes beside kv_cache_bytes; the text has its own line."""
    from localrun.commands.fit import run_fit

    path = WRITERS["qwen35"](tmp_path / "q.gguf", tokenizer_from=False)
    run_fit(str(path), ctx=4096, parallel=2, json_out=True, preset="laptop-16gb")
    d = json.loads(capsys.readouterr().out)
    spec = read_gguf(path)
    kv = kv_cache(spec, 4096, n_parallel=2, flash_attn=False)
    assert d["recurrent_bytes"] == kv.recurrent_bytes > 0
    assert d["kv_cache_bytes"] == kv.attn_bytes
    run_fit(str(path), ctx=4096, parallel=2, preset="laptop-16gb")
    out = capsys.readouterr().out
    assert "recurrent state" in out and "KV cache" in out


# ------------------------------------------------------------------------------------- against llama.cpp
@pytest.mark.model
def test_planned_bytes_equal_llamacpp_allocation(tmp_path_factory):
    """Each layout loaded once by the vendored llama.cpp (localrun's model_params), a context per (n_ctx,
    n_parallel) in (256, 512) × (1, 4) with localrun's context_params (CPU: no flash attention, one KV
    stream per sequence; n_ubatch 64, so Gemma 4's SWA cache is window-limited at 512): the KV and RS
    buffers llama.cpp allocates equal the plan's; the file also decodes."""
    from localrun.backends.llamacpp.lib import LlamaLog, import_llama
    from localrun.backends.llamacpp.params import context_params, load_model, model_params, new_context
    from localrun.offload.search import plan_for_run

    _, C = import_llama()
    checked = []
    for arch, kw in WIDE.items():
        path = cached_layout(tmp_path_factory, arch, **kw)
        spec = read_gguf(path)
        base_plan = plan_for_run(spec, None, n_ctx=256)
        model = load_model(C, path, model_params(C, base_plan, spec))
        assert model, f"llama.cpp could not load the {arch} layout"
        try:
            for n_ctx in (256, 512):
                for n_par in (1, 4):
                    plan = plan_for_run(spec, None, n_ctx=n_ctx, n_parallel=n_par)
                    plan.n_batch = plan.n_ubatch = 64
                    plan.n_threads = plan.n_threads_batch = 1  # a tiny model: 2 threads on a busy 2-core box spin
                    want = kv_cache(spec, n_ctx, n_parallel=n_par, n_ubatch=64, kv_unified=plan.kv_unified,
                                    flash_attn=plan.flash_attn)
                    mark = LlamaLog.mark()
                    ctx = new_context(C, model, context_params(C, plan))
                    assert ctx, f"{arch}: no context at {n_ctx} × {n_par}"
                    try:
                        if (n_ctx, n_par) == (256, 1):
                            _decode_a_few(C, ctx)
                    finally:
                        C.llama_free(ctx)
                    log = LlamaLog.since(mark)
                    got_kv = [float(m.group(1)) for m in map(KV_BUF.search, log) if m]  # one per KV cache
                    got_rs = [float(m.group(1)) for m in map(RS_BUF.search, log) if m]
                    where = f"{arch} at {n_ctx} × {n_par}"
                    attn = [p for p in want.parts if p.name != "recurrent"]
                    assert len(got_kv) == len(attn) and len(got_rs) == (want.recurrent_bytes > 0), where
                    for part, got in zip(attn, got_kv):
                        _close(part.bytes, got, f"{where} {part.name}")
                    for got in got_rs:
                        _close(want.recurrent_bytes, got, where + " recurrent")
                    caches = [(int(c), int(n)) for c, n in (m.groups() for m in map(KV_SIZE.search, log) if m)]
                    assert caches == [(p.cells, p.n_layers) for p in want.parts if p.name != "recurrent"], where
                    # the plan localrun loads with carries the same numbers (its own n_ubatch)
                    full = kv_cache(spec, n_ctx, n_parallel=n_par, kv_unified=plan.kv_unified,
                                    flash_attn=plan.flash_attn)
                    assert (plan.kv_cache_bytes, plan.recurrent_bytes) == (full.attn_bytes, full.recurrent_bytes)
                    checked.append(where)
        finally:
            C.llama_model_free(model)
    assert len(checked) == len(WIDE) * 4


def _close(planned_bytes: int, logged_mib: float, what: str) -> None:
    """Within 1 %, or within the log's own rounding (it prints MiB to 2 decimals) for small buffers."""
    planned = planned_bytes / MiB
    assert abs(planned - logged_mib) <= max(0.01 * logged_mib, 0.005 + 1e-9), (what, planned, logged_mib)


def _decode_a_few(C, ctx) -> None:
    """8 prompt tokens, then 3 single-token steps: every decode succeeds and the logits are finite."""
    import ctypes

    toks = (C.llama_token * 8)(*range(20, 28))
    assert C.llama_decode(ctx, C.llama_batch_get_one(toks, 8)) == 0
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(C.llama_get_model(ctx)))
    for t in (101, 102, 103):
        one = (C.llama_token * 1)(t)
        assert C.llama_decode(ctx, C.llama_batch_get_one(one, 1)) == 0
        logits = C.llama_get_logits_ith(ctx, -1)
        row = ctypes.cast(logits, ctypes.POINTER(ctypes.c_float))
        assert all(math.isfinite(row[i]) for i in range(0, n_vocab, 97))
