"""A plan (``offload/plan.py``) → llama.cpp's ``llama_model_params`` and ``llama_context_params``.

One place for both, so the engine (``llamacpp.LlamaCppEngine``) and llama.cpp's dry run
(``llamacpp_dryrun.measure_buffers``: ``no_alloc``, what ``fit`` reports per device) pass llama.cpp the same
devices, ``tensor_split``, weight placement, context, KV type and flash attention.

Load mode: llama.cpp replaced ``use_mmap``/``use_mlock`` with one ``load_mode`` (include/llama.h
``llama_load_mode``). ``AUTO`` maps the file unless a device cannot (src/llama-model.cpp ``load_tensors``),
so a plan's ``use_mmap`` without mlock keeps ``AUTO``; the other three cases are explicit.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from localrun.backends.llamacpp_lib import (
    cpu_advertises_amx,
    cpu_moe_overrides,
    physical_cores,
    weight_overrides,
    weight_placement,
)
from localrun.backends.rpc import model_devices, plan_endpoints
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

    Registers the plan's RPC workers (``backends.rpc.model_devices``; RPC devices first, then local GPUs, as
    llama.cpp orders them). Raises BackendError/BackendUnavailableError when a worker cannot be reached or
    this llama-cpp-python lacks RPC."""
    mp = C.llama_model_default_params()
    out = ModelParams(mp)
    mp.n_gpu_layers = int(plan.n_gpu_layers if plan.n_gpu_layers >= 0 else 1_000_000)
    mp.load_mode = load_mode(bool(plan.use_mmap), bool(plan.use_mlock))
    mp.main_gpu = int(plan.main_gpu)
    # the planner's device split (offload/devices.py)
    mp.split_mode = SPLIT_MODES[getattr(plan, "split_mode", "layer") or "layer"]
    if plan_endpoints(plan):  # RPC workers' devices first, then the local GPUs (backends/rpc.py)
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
    threads = plan.n_threads or physical_cores()
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
