"""The links between the devices of a split: PCIe inside one box, the network to an RPC worker.

Pure functions. A model split by layers (llama.cpp ``LLAMA_SPLIT_MODE_LAYER``, or RPC devices) runs its
devices one after another for every token; at each boundary between two devices the hidden state moves
across: one activation vector per token, ``n_embd`` F32 values (the residual stream ``inpL`` is F32,
src/llama-graph.cpp; ggml's scheduler copies a split's inputs to the next backend,
ggml/src/ggml-backend.cpp ``ggml_backend_sched_compute_splits``). So per decoded token a hop costs
``round_trips × latency + n_embd × 4 / bandwidth``, and a prefill ubatch of ``n_ubatch`` tokens moves
``n_ubatch × n_embd × 4`` bytes per hop.

An RPC hop costs more round trips than a PCIe copy: the main host sends the input tensor
(``RPC_CMD_SET_TENSOR``), runs the graph (``RPC_CMD_GRAPH_COMPUTE``) and reads the output back
(``RPC_CMD_GET_TENSOR``), ggml/src/ggml-rpc/ggml-rpc.cpp; ``RPC_ROUND_TRIPS`` = 2 is an estimate (the set
is pipelined with the compute) until a probe measures it. Link numbers are a ``Link``: a table value today,
a measurement from ``fit --rpc`` (a timed transfer to each worker) when the RPC build is there, or
``--rpc-link LAT_MS,GBPS`` given by the user. Latency is the round-trip time in seconds, bandwidth GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from localrun.errors import ConfigError

ACTIVATION_BYTES_PER_VALUE = 4  # F32 hidden state between layers
RPC_ROUND_TRIPS = 2  # per remote split per ubatch: set input + compute/get output (estimate; see module doc)


@dataclass(frozen=True)
class Link:
    """A link a hop crosses: round-trip ``latency_s`` (seconds), ``bandwidth_gbps`` (10^9 B/s), how many
    round trips one hop costs, and where the numbers come from ("table", "--rpc-link", "measured …")."""

    name: str
    latency_s: float
    bandwidth_gbps: float
    round_trips: int = 1
    source: str = "table"


# GPU→GPU copy inside one box: through the host over PCIe 4.0 x16 (≈ 25 of 32 GB/s reached by cudaMemcpy
# between pinned buffers; ~10 µs per copy including the stream synchronisation ggml does at a split).
PCIE = Link("PCIe 4.0 x16", 10e-6, 25.0)
# a typical home network when nothing is measured: gigabit Ethernet, ≈ 0.3 ms round trip, 0.117 GB/s payload
ETHERNET_1G = Link("1 Gb/s Ethernet", 0.3e-3, 0.117, RPC_ROUND_TRIPS)


def parse_link(text: str) -> Link:
    """``"LAT_MS,GBPS"`` (``--rpc-link``: round-trip milliseconds, GB/s) → a ``Link`` for RPC hops.

    Raises ConfigError for anything else (negative or missing numbers)."""
    parts = [p.strip() for p in (text or "").split(",")]
    try:
        lat_ms, gbps = float(parts[0]), float(parts[1])
        if len(parts) != 2 or lat_ms < 0 or gbps <= 0:
            raise ValueError
    except (ValueError, IndexError):
        raise ConfigError(f"--rpc-link {text!r} is not LAT_MS,GBPS",
                          hint="give the round-trip latency in milliseconds and the bandwidth in GB/s, "
                          "e.g. --rpc-link 0.3,0.117 for gigabit Ethernet") from None
    return Link(f"link {lat_ms:g} ms, {gbps:g} GB/s", lat_ms / 1000, gbps, RPC_ROUND_TRIPS, "--rpc-link")


def activation_bytes(n_embd: int, n_tokens: int = 1) -> int:
    """Bytes of the hidden state crossing one device boundary: ``n_tokens × n_embd × 4`` (F32)."""
    return n_tokens * n_embd * ACTIVATION_BYTES_PER_VALUE


def hop_s(link: Link, n_bytes: int) -> float:
    """Seconds for one hop: ``round_trips × latency + bytes / bandwidth``."""
    return link.round_trips * link.latency_s + n_bytes / (link.bandwidth_gbps * 1e9)


def decode_hops_s(hops: list[Link], n_embd: int) -> float:
    """Seconds per decoded token spent on the hops of a split (one activation vector each)."""
    return sum(hop_s(h, activation_bytes(n_embd)) for h in hops)


def prefill_hops_s_per_token(hops: list[Link], n_embd: int, n_ubatch: int = 512) -> float:
    """Seconds per prompt token spent on hops: each ubatch of ``n_ubatch`` tokens crosses every hop once."""
    return sum(hop_s(h, activation_bytes(n_embd, n_ubatch)) for h in hops) / max(1, n_ubatch)


def with_hops(tok_s: float, extra_s_per_token: float) -> float:
    """A throughput (tokens/s) slowed by ``extra_s_per_token`` seconds per token."""
    if tok_s <= 0:
        return 0.0
    return 1.0 / (1.0 / tok_s + extra_s_per_token)


def split_decode_tok_s(device_s: list[float], hops: list[Link], n_embd: int) -> float:
    """Decode tokens/s of a layer split: the devices run one after another (``device_s``: each device's
    seconds per token, its bytes read / its bandwidth), plus every hop. 0.0 when nothing runs."""
    t = sum(device_s) + decode_hops_s(hops, n_embd)
    return 1.0 / t if t > 0 else 0.0


def slower_than_one_machine(split_decode_tok_s: float, alternatives: list[tuple[str, float]]) -> str | None:
    """The reason to say when a split loses: ``alternatives`` are (description, decode tok/s) of plans on
    one machine (a smaller quantization, fewer devices). None when the split is the fastest."""
    best = max(alternatives, key=lambda a: a[1], default=None)
    if best is None or best[1] <= split_decode_tok_s:
        return None
    return (f"the split decodes ≈ {split_decode_tok_s:.1f} tok/s, slower than {best[0]} on one machine "
            f"(≈ {best[1]:.1f} tok/s): the hops cost more than the bigger model's memory gains")
