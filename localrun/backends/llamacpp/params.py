"""A plan (``offload/plan.py``) → llama.cpp's ``llama_model_params`` and ``llama_context_params``, and the
only calls in localrun that load a model or create a context (``load_model``, ``new_context``).

One place for all of it, so the engine, the speculative draft model, the embedding context and llama.cpp's
dry run (``no_alloc``, what ``fit`` reports per device) pass llama.cpp the same devices, ``tensor_split``,
weight placement (the AMX buffer type kept off, see ``weight_placement``), load mode, threads, context, KV
type and flash attention. ``tests/test_import_graph.py`` checks that no other module calls llama.cpp's
loaders or its default-params constructors.

Load mode: llama.cpp replaced ``use_mmap``/``use_mlock`` with one ``load_mode`` (include/llama.h
``llama_load_mode``). ``AUTO`` maps the file unless a device cannot (src/llama-model.cpp ``load_tensors``),
so a plan's ``use_mmap`` without mlock keeps ``AUTO``; the other three cases are explicit.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from localrun.backends.llamacpp.lib import (
    cpu_advertises_amx,
    cpu_moe_overrides,
    default_threads,
    weight_overrides,
    weight_placement,
)
from localrun.backends.llamacpp.rpc import model_devices, plan_endpoints
from localrun.errors import LocalrunError

KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
# include/llama.h enum llama_load_mode
LOAD_AUTO, LOAD_NONE, LOAD_MMAP, LOAD_MLOCK, LOAD_MMAP_MLOCK = -1, 0, 1, 2, 3
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}  # llama_split_mode: NONE (main_gpu alone), LAYER, ROW


def load_mode(use_mmap: bool, use_mlock: bool) -> int:
    """``llama_load_mode`` for a plan's ``use_mmap``/``use_mlock`` (see the module doc)."""
    if use_mlock:
        return LOAD_MMAP_MLOCK if use_mmap else LOAD_MLOCK
    return LOAD_AUTO if use_mmap else LOAD_NONE


@dataclass
class ModelParams:
    """``params``: the ``llama_model_params`` struct. ``keep``: the ctypes arrays it points into (alive as
    long as the struct is used). ``repacked``: CPU weights go to llama.cpp's repacked buffers.
    ``batch_invariant``: several sequences, so no repacking (see ``model_params``)."""

    params: object
    keep: list = field(default_factory=list)
    repacked: bool = False
    batch_invariant: bool = False
    rpc_devices: object = None


def model_params(C, plan, spec) -> ModelParams:
    """``llama_model_params`` for ``plan`` on the model ``spec`` (``model.spec.ModelSpec``).

    Registers the plan's RPC workers (``backends.llamacpp.rpc.model_devices``; RPC devices first, then local GPUs, as
    llama.cpp orders them). Raises BackendError/BackendUnavailableError when a worker cannot be reached or
    this llama-cpp-python lacks RPC."""
    mp = C.llama_model_default_params()
    out = ModelParams(mp)
    mp.n_gpu_layers = int(plan.n_gpu_layers if plan.n_gpu_layers >= 0 else 1_000_000)
    mp.load_mode = load_mode(bool(plan.use_mmap), bool(plan.use_mlock))
    mp.main_gpu = int(plan.main_gpu)
    # the planner's device split (offload/devices.py)
    mp.split_mode = SPLIT_MODES[getattr(plan, "split_mode", "layer") or "layer"]
    if plan_endpoints(plan):  # RPC workers' devices first, then the local GPUs (backends/llamacpp/rpc.py)
        out.rpc_devices, _ = model_devices(plan_endpoints(plan))
        mp.devices = ctypes.cast(out.rpc_devices, ctypes.c_void_p)
        out.keep.append(out.rpc_devices)
    if plan.tensor_split:
        arr_t = ctypes.c_float * max(len(plan.tensor_split), C.llama_max_devices())
        arr = arr_t(*plan.tensor_split)
        mp.tensor_split = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
        out.keep.append(arr)
    # which buffer type each weight goes to: MoE experts kept on the CPU, AMX off, CPU_REPACK by name
    overrides, use_extra_bufts, out.repacked = weight_placement(spec, plan, cpu_advertises_amx())
    out.batch_invariant = int(plan.n_parallel) > 1 and not os.environ.get("LOCALRUN_REPACK_PARALLEL")
    if out.batch_invariant:
        # several sequences: no repacked CPU weights. Their GEMM takes rows four at a time and the rest
        # with a GEMV (ggml-cpu/repack.cpp forward_mul_mat_one_chunk), which round differently: Gemma-3's
        # logits moved by up to 0.6 with the batch size, and greedy text with them. Without it decode
        # batches of equal-length sequences give bit-identical logits for every batch size (Gemma-3 still
        # differs when lengths differ: open, tests/test_batch_equivalence.py)
        overrides = weight_overrides(cpu_moe_overrides(int(getattr(plan, "n_cpu_moe", 0) or 0)))
        use_extra_bufts, out.repacked = False, False
    mp.use_extra_bufts = use_extra_bufts
    if overrides is not None:
        mp.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p)
        out.keep.append(overrides)
    return out


def load_model(C, path, mparams: ModelParams):
    """``llama_model_load_from_file(path, mparams.params)`` → the model pointer, or None when llama.cpp
    cannot load it (its log says why: ``llamacpp.lib.LlamaLog``). ``mparams`` must come from ``model_params``
    and stay alive while the model is used (its ctypes arrays)."""
    if not isinstance(mparams, ModelParams):
        raise TypeError("load_model takes llamacpp.params.model_params(...), not a raw llama_model_params")
    return C.llama_model_load_from_file(str(path).encode(), mparams.params) or None


def new_context(C, model, cparams):
    """``llama_init_from_model(model, cparams)`` → the context pointer, or None when llama.cpp cannot create
    it. ``cparams`` comes from ``context_params`` or ``embedding_context_params``."""
    return C.llama_init_from_model(model, cparams) or None


def embedding_context_params(C, plan, n_ctx: int):
    """``context_params`` for a second context on the same weights that returns mean-pooled sentence
    embeddings (llama.cpp examples/embedding/embedding.cpp): one sequence of at most ``n_ctx`` tokens
    decoded in one ubatch (pooling needs the whole sequence there), unified KV, the plan's threads, flash
    attention, KV type and offload."""
    cp = context_params(C, plan)
    cp.n_ctx = cp.n_batch = cp.n_ubatch = int(n_ctx)
    cp.n_seq_max = 1
    cp.embeddings = True
    cp.pooling_type = C.LLAMA_POOLING_TYPE_MEAN
    cp.kv_unified = True
    return cp


def context_params(C, plan):
    """``llama_context_params`` for ``plan``: ``n_ctx`` tokens per sequence × ``n_parallel`` sequences,
    its batch sizes, threads, flash attention, KV type, KQV offload and sliding-window mode. Raises
    LocalrunError on an unknown KV type."""
    n_par = max(1, int(plan.n_parallel))
    cp = C.llama_context_default_params()
    cp.n_ctx = int(plan.n_ctx) * n_par
    cp.n_batch = int(plan.n_batch)
    cp.n_ubatch = int(min(plan.n_ubatch, plan.n_batch))
    cp.n_seq_max = n_par
    threads = plan.n_threads or default_threads()
    cp.n_threads = int(threads)
    cp.n_threads_batch = int(plan.n_threads_batch or threads)
    cp.flash_attn_type = {None: -1, True: 1, False: 0}[plan.flash_attn]
    try:
        cp.type_k = cp.type_v = KV_TYPES[plan.kv_type.lower()]
    except KeyError:
        raise LocalrunError(f"unknown KV-cache type {plan.kv_type!r}",
                            hint=f"use one of {', '.join(KV_TYPES)}") from None
    cp.offload_kqv = bool(plan.offload_kqv)
    cp.swa_full = bool(plan.swa_full)
    # unified: one KV buffer for all sequences (llama.cpp splits mixed batches freely); else one stream each
    cp.kv_unified = bool(getattr(plan, "kv_unified", False))
    cp.no_perf = True
    return cp


def new_mtmd_context(M, path, model, plan):
    """``mtmd_init_from_file(path, model, params)`` → llama.cpp's multimodal context for the projector GGUF
    at ``path`` (tools/mtmd/mtmd.h), or None when it cannot load it (its log says why). ``M`` is
    ``llama_cpp.mtmd_cpp``. The projector runs where the plan put it (``offload.plan.add_projector``), or,
    unplanned, on the GPU when the plan offloads layers (llama-server's ``--mmproj-offload`` default) unless
    ``no_mmproj_offload``; with the plan's threads and flash-attention choice; warm-up on."""
    p = M.mtmd_context_params_default()
    if getattr(plan, "mmproj_bytes", 0):  # planned (offload.plan.add_projector): where the planner put it
        p.use_gpu = bool(plan.mmproj_on_gpu)
    else:
        p.use_gpu = int(plan.n_gpu_layers) != 0 and not getattr(plan, "no_mmproj_offload", False)
    p.n_threads = int(plan.n_threads or default_threads())
    p.print_timings = False
    p.warmup = True
    p.flash_attn_type = {None: -1, True: 1, False: 0}[plan.flash_attn]
    return M.mtmd_init_from_file(str(path).encode(), model, p) or None
