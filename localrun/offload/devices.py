"""Several GPUs (and RPC devices): which layers and how much KV each holds, as llama.cpp assigns them.

llama.cpp's rule (src/llama-model.cpp ``load_tensors``): the offloaded layer slots are the last
``act = min(n_gpu_layers, n_layer + 1)`` of ``n_layer + 1`` (slot ``n_layer`` is the output layer,
``i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)``). ``tensor_split`` is summed into cumulative split
points normalised to 1, and slot ``il`` goes to device ``upper_bound(splits, (il - i_gpu_start) / act)``.
So a ``tensor_split`` of integer layer counts ``[c0, c1, …]`` gives device ``d`` exactly ``c_d``
consecutive slots (the float quotients are computed the same way on both sides of the comparison); the
planner passes counts, not fractions, and the last used device holds the output layer. Each layer's KV
cache lives on its layer's device (src/llama-kv-cache.cpp: ``dev = model.dev_layer(il)`` when offloaded).
The token embeddings stay on the CPU (``dev_input``). RPC devices come first in llama.cpp's device list
(src/llama.cpp: "add RPC servers at the front of the list"), then local GPUs. Caveat (open): the planner
numbers GPUs as NVML does (PCI bus order) while CUDA enumerates fastest first unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a mixed box the two orders can differ, and tensor_split with them.

Every used device pays its own CUDA context (``CUDA_CONTEXT_VRAM_BYTES``) and a compute buffer: the
device with the output layer the full one (logits, ``memory.compute_buffer_bytes``), the others one sized
for a layer's intermediate results (``layer_compute_bytes``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DeviceUse:
    """One device's share of a plan. Bytes; ``layers`` are repeating-layer indices."""

    index: int  # position in llama.cpp's device list (= tensor_split position)
    name: str
    backend: str  # cuda | metal | vulkan | rocm | rpc
    layers: list[int] = field(default_factory=list)
    output: bool = False
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    overhead_bytes: int = 0  # CUDA context + cuBLAS workspace
    budget_bytes: int = 0  # usable memory after the margin
    endpoint: str | None = None  # an RPC worker's host:port

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.overhead_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    @property
    def n_slots(self) -> int:
        return len(self.layers) + int(self.output)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"] = [self.layers[0], self.layers[-1] + 1] if self.layers else []  # [first, end)
        d["n_layers"] = len(self.layers)
        d["total_bytes"] = self.total_bytes
        d["fits"] = self.fits
        return d


def layer_compute_bytes(spec, n_kv_cells: int, *, n_ubatch: int = 512, flash_attn: bool = True) -> int:
    """Compute buffer of a device WITHOUT the output layer: the largest intermediate of one layer, the FFN's
    gate and up projections plus two hidden states, ``n_ubatch × (2 n_ff + 2 n_embd) × 4``; without flash
    attention the scores ``KQ`` can be larger (same term as ``memory.compute_buffer_bytes``). 2% margin.
    An estimate: llama.cpp sizes each backend's buffer from the splits of the reserved graph
    (ggml-backend.cpp ``ggml_backend_sched_reserve``)."""
    ffn = n_ubatch * (2 * spec.n_ff + 2 * spec.n_embd) * 4
    if not flash_attn:
        ffn = max(ffn, n_ubatch * 4 * (max(1, n_kv_cells) * (spec.n_head + 1) + 6 * spec.n_embd))
    return int(ffn * 1.02)


def slot_bytes(spec, kv, i_gpu_start: int, *, offload_kqv: bool = True, n_cpu_moe: int = 0) -> list[int]:
    """Bytes each offloaded slot puts on its device: weights of layer ``il`` (experts of the first
    ``n_cpu_moe`` layers excluded) + its KV, for ``il`` in ``i_gpu_start..n_layer-1``, then the output slot
    (``output`` + ``output_norm``; a tied model's duplicated token embeddings, TENSOR_DUPLICATED)."""
    n_layer = spec.n_layer
    per = {il: 0 for il in range(i_gpu_start, n_layer + 1)}
    for g in spec.tensor_groups:
        if g.layer is not None and g.layer >= i_gpu_start:
            if not (g.role in ("exps", "chexps") and g.layer < n_cpu_moe):
                per[g.layer] += g.n_bytes
        elif g.role == "output" or (g.role == "token_embd" and not spec.has_output_weight):
            per[n_layer] += g.n_bytes
    if offload_kqv:
        for il in range(i_gpu_start, n_layer):
            per[il] += kv.layer_bytes(il)
    return [per[il] for il in range(i_gpu_start, n_layer + 1)]


def layer_counts(slots: list[int], capacities: list[int]) -> list[int]:
    """Consecutive slots per device, in proportion to ``capacities`` (bytes each device can give to layers
    and KV): device ``d``'s boundary is where the running slot bytes pass its share of the total. If that
    overfills a device (uneven layers, the output slot), fill in order up to each capacity instead; the
    last device then takes the rest (it may not fit: the caller checks). Returns one count per device."""
    n_dev = len(capacities)
    total_cap = sum(max(0, c) for c in capacities)
    if n_dev == 0:
        return []
    if total_cap <= 0:
        return [0] * (n_dev - 1) + [len(slots)]
    proportional = _cut(slots, [sum(slots) * sum(max(0, c) for c in capacities[: d + 1]) / total_cap
                                for d in range(n_dev)])
    if all(b <= c for b, c in zip(_bytes_per_device(slots, proportional), capacities)):
        return proportional
    counts, j = [], 0
    for c in capacities[:-1]:
        used, k = 0, 0
        while j + k < len(slots) and used + slots[j + k] <= c:
            used += slots[j + k]
            k += 1
        counts.append(k)
        j += k
    return counts + [len(slots) - j]


def _cut(slots: list[int], bounds: list[float]) -> list[int]:
    """Counts of consecutive slots whose running sum's midpoint falls below each cumulative bound."""
    counts, run, d = [0] * len(bounds), 0.0, 0
    for b in slots:
        mid = run + b / 2
        while d < len(bounds) - 1 and mid > bounds[d]:
            d += 1
        counts[d] += 1
        run += b
    return counts


def _bytes_per_device(slots: list[int], counts: list[int]) -> list[int]:
    out, j = [], 0
    for c in counts:
        out.append(sum(slots[j: j + c]))
        j += c
    return out


def device_of_slot(j: int, tensor_split: list[float], act: int) -> int:
    """llama.cpp's rule for slot ``j`` (0-based among the ``act`` offloaded slots): the first device whose
    cumulative normalised split point is above ``j / act`` (std::upper_bound). For tests and docs."""
    import bisect

    total, run, points = sum(tensor_split), 0.0, []
    for s in tensor_split:
        run += s
        points.append(run / total)
    return bisect.bisect_right(points, j / act)


def place(spec, kv, gpus: list, n_gpu_layers: int, *, compute_full: int, compute_layer: int,
          offload_kqv: bool = True, n_cpu_moe: int = 0, margin: float = 0.05,
          cuda_overhead_bytes: int = 0) -> tuple[list[DeviceUse], list[float]]:
    """(one ``DeviceUse`` per device of ``gpus``, the ``tensor_split`` to pass) for ``n_gpu_layers`` slots
    split in proportion to what each device can hold after its CUDA context (``cuda_overhead_bytes`` on a
    ``cuda`` device) and its compute buffer (``compute_full`` on the device that ends with the output
    layer, ``compute_layer`` elsewhere). Every device in the list pays its context, used or not (llama.cpp
    initialises a backend per device of the model). ``gpus``: GpuInfo-like (name, backend, usable_bytes,
    index; RPC devices carry ``endpoint``)."""
    from localrun.offload.memory import layers_on_gpu

    start, _ = layers_on_gpu(spec.n_layer, n_gpu_layers)
    slots = slot_bytes(spec, kv, start, offload_kqv=offload_kqv, n_cpu_moe=n_cpu_moe)
    uses = []
    for pos, g in enumerate(gpus):
        uses.append(DeviceUse(index=pos, name=g.name, backend=g.backend,
                              overhead_bytes=cuda_overhead_bytes if g.backend == "cuda" else 0,
                              budget_bytes=int(g.usable_bytes * (1 - margin)),
                              endpoint=getattr(g, "endpoint", None)))
    caps = [u.budget_bytes - u.overhead_bytes - compute_layer for u in uses]
    caps[-1] -= compute_full - compute_layer  # the last device ends with the output layer
    counts = layer_counts(slots, caps)
    j = 0
    last_used = max((d for d, c in enumerate(counts) if c), default=None)
    for d, (u, c) in enumerate(zip(uses, counts)):
        ils = list(range(start + j, start + j + c))
        u.output = d == last_used and (start + j + c) == spec.n_layer + 1
        u.layers = [il for il in ils if il < spec.n_layer]
        u.weights_bytes = sum(slots[j: j + c]) - (sum(kv.layer_bytes(il) for il in u.layers) if offload_kqv else 0)
        u.kv_bytes = sum(kv.layer_bytes(il) for il in u.layers) if offload_kqv else 0
        u.compute_bytes = (compute_full if u.output or d == last_used else compute_layer) if c else 0
        j += c
    return uses, [float(c) for c in counts]


# Row split (llama.cpp LLAMA_SPLIT_MODE_ROW, CUDA only: ggml-cuda's ``ggml_backend_split_buffer_type``):
# every weight matrix is cut by rows across the GPUs in tensor_split's proportions, so the GPUs read their
# shares AT THE SAME TIME, but each matrix multiplication ends with a copy of the partial results to the
# main GPU and a synchronisation (ggml-cuda.cu ``ggml_cuda_op_mul_mat``). Seven matmuls per layer (Q, K, V,
# output, gate, up, down); ~80 µs per synchronised matmul over PCIe is an estimate that reproduces what users
# report: row split speeds up decode on slow-memory cards (P40-class, ≈ 350 GB/s) with big models, and gains
# nothing on 3090/4090-class cards, where a layer's weights are read in about the time the syncs take.
# Prefill is slower with rows (every matmul of a 512-token ubatch moves its partial results), so localrun
# takes rows only when decode gains at least ``ROW_MIN_GAIN``.
ROW_MATMULS_PER_LAYER = 7
ROW_SYNC_S = 80e-6
ROW_MIN_GAIN = 1.15


def row_split_gpu_s(gpu_bytes_per_token: float, shares: list[float], bandwidths_gbps: list[float],
                    n_layers: int) -> float:
    """Seconds per decoded token on the GPUs under a row split: the slowest GPU's share of the bytes
    (``shares`` from tensor_split, normalised here) at its bandwidth, plus one synchronisation per matmul
    (``n_layers × ROW_MATMULS_PER_LAYER × ROW_SYNC_S``)."""
    total = sum(shares) or 1.0
    read = max((gpu_bytes_per_token * s / total) / (bw * 1e9) for s, bw in zip(shares, bandwidths_gbps))
    return read + n_layers * ROW_MATMULS_PER_LAYER * ROW_SYNC_S


def gpu_list_of(hw, gpu_indices: tuple[int, ...] | None) -> list:
    """The devices a plan uses, in llama.cpp's order: ``gpu_indices`` of ``hw.gpus``, else llama.cpp's default
    list (src/llama.cpp ``llama_model_load_from_file_impl``): RPC devices first, then the discrete GPUs;
    integrated GPUs (``unified`` here: an APU, an iGPU, Apple's, GB10) only when no discrete GPU is there
    ("add integrated GPUs only if no other devices were found"), and then the first of them. So a desktop
    with an iGPU next to its graphics card plans on the card, as llama.cpp loads."""
    if hw is None or not hw.gpus:
        return []
    if gpu_indices is not None:
        return [hw.gpus[i] for i in gpu_indices]
    discrete = [g for g in hw.gpus if g.backend != "rpc" and not g.unified]
    if any(g.unified for g in hw.gpus) and not discrete:
        return [next(g for g in hw.gpus if g.unified)]
    return [g for g in hw.gpus if g.backend == "rpc"] + discrete


def place_model(spec, kv, gpu_list, ngl, compute, fa, n_ubatch, offload_kqv, n_cpu_moe, *, margin: float):
    """``place`` for a plan: the per-layer compute buffer from the full one, CUDA's context per device."""
    from localrun.offload import memory as M

    layer_compute = layer_compute_bytes(spec, kv.n_ctx_seq, n_ubatch=n_ubatch, flash_attn=fa)
    return place(spec, kv, gpu_list, ngl, compute_full=compute, compute_layer=min(layer_compute, compute),
                   offload_kqv=offload_kqv, n_cpu_moe=n_cpu_moe, margin=margin,
                   cuda_overhead_bytes=M.CUDA_CONTEXT_VRAM_BYTES)


def split_speed_inputs(spec, devices, gpu_list, n_cpu_moe, kv_read_gpu, kv_gpu, bytes_tier, params_tier, tiers):
    """Replace the one "gpu" tier by one tier per device: each reads its own layers' weights and KV at its
    own bandwidth (``speed.weights_read_per_token`` on that device's layers)."""
    from localrun.offload import speed as S

    for table in (bytes_tier, params_tier, tiers):
        table.pop("gpu", None)
    for d in devices:
        if not d.n_slots:
            continue
        key = f"gpu{d.index}"
        rd = S.weights_read_per_token(spec, d.layers, d.output, n_cpu_moe)
        tiers[key] = S.gpu_tier(gpu_list[d.index])
        bytes_tier[key] = rd["gpu"] + (kv_read_gpu * d.kv_bytes / kv_gpu if kv_gpu else 0.0)
        params_tier[key] = S.prefill_params(rd, "gpu")


def row_split_decode(devices, gpu_list, bytes_tier, tiers, decode_layer: float, tsplit) -> tuple[float, str] | None:
    """(decode tok/s, reason) when a row split pays (``devices.ROW_MIN_GAIN`` faster decode, all local CUDA
    GPUs), else None. The KV cache and the memory per device are those of the layer split (in this
    llama.cpp a layer's KV and norms still go to its layer's device; only matrices are cut by rows)."""

    used = [d for d in devices if d.n_slots]
    if len(used) < 2 or decode_layer <= 0 or any(gpu_list[d.index].backend != "cuda" for d in used):
        return None
    keys = [f"gpu{d.index}" for d in used]
    gpu_bytes = sum(bytes_tier.get(k, 0.0) for k in keys)
    layer_gpu_s = sum(bytes_tier.get(k, 0.0) / (tiers[k].bandwidth_gbps * 1e9) for k in keys)
    row_gpu_s = row_split_gpu_s(gpu_bytes, [tsplit[d.index] for d in used], [tiers[k].bandwidth_gbps for k in keys],
                                  sum(len(d.layers) for d in used))
    other_s = 1.0 / decode_layer - layer_gpu_s  # CPU layers and the hops stay
    row = 1.0 / (other_s + row_gpu_s)
    if row < decode_layer * ROW_MIN_GAIN:
        return None
    return row, (f"split_mode row: the GPUs read their shares of every matrix at once, ≈ {row:.1f} tok/s decode "
                 f"vs {decode_layer:.1f} by layer, worth the per-matmul synchronisation on cards this slow "
                 "(prefill gains nothing from it)")


def hops_along(path: list) -> list:
    """The links a token crosses along ``path`` (None = this host's CPU, where llama.cpp keeps the token
    embeddings, then the used devices in order): an RPC device's link when either side is remote, PCIe
    between two local GPUs. The CPU → local GPU copy is left out, as in the one-GPU speed model."""
    from localrun.offload import links as L

    out = []
    for a, b in zip(path, path[1:]):
        remote = next((g for g in (a, b) if g is not None and g.backend == "rpc"), None)
        if remote is not None:
            out.append(rpc_link(remote))
        elif a is not None:
            out.append(L.PCIE)
    return out


def rpc_link(remote):
    """An RPC device's link: ``GpuInfo.link`` (measured or ``--rpc-link``), else ``links.ETHERNET_1G``."""
    from localrun.offload import links as L

    lk = getattr(remote, "link", None)
    if not lk:
        return L.ETHERNET_1G
    return L.Link(remote.endpoint or remote.name, float(lk["latency_s"]), float(lk["bandwidth_gbps"]),
                  L.RPC_ROUND_TRIPS, lk.get("source", "measured"))
