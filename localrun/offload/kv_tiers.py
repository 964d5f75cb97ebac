"""The KV-cache tiers a plan gets (docs/architecture.md §4): the RAM and disk budgets of sequence snapshots, and
how long a snapshot takes to restore from each tier. Pure: no I/O, no backend imports (`localrun fit` shows it;
``backends/kv_cache.py`` keeps the tiers at run time).

A snapshot is one sequence's KV as ``llama_state_seq_get_data`` copies it (src/llama-kv-cache.cpp
state_write: the K and V rows of the sequence's cells, per layer; a model with recurrent layers adds the
sequence's R/S state rows, src/llama-memory-recurrent.cpp state_write, through src/llama-memory-hybrid.cpp).
The typical one ``fit`` prices is a full context: ≈ (the plan's attention KV bytes + its recurrent-state bytes)
÷ n_parallel (an upper bound for sliding-window layers, whose cache holds ``n_swa + n_ubatch`` cells, of which
a snapshot copies the sequence's window).

Context checkpoints (``backends/llamacpp/checkpoints.py``, a model with recurrent layers only) are host RAM
outside the tiers: one is one sequence's recurrent state (``llama_state_seq_get_data_ext`` with
``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``; a hybrid-iSWA model's sliding-window cells too, not counted here), and
the engine keeps at most ``CHECKPOINTS_PER_SLOT`` per sequence slot and ``checkpoint_max_bytes`` in all: enough
for every slot's ``CHECKPOINTS_PER_SLOT`` of this model's size, at most ``CHECKPOINTS_RAM_SHARE`` of the RAM the
plan leaves (never below ``CHECKPOINTS_MIN_BYTES``). A snapshot in a tier also carries its slot's checkpoints (up
to ``CHECKPOINTS_PER_SLOT``), which are not in ``snapshot_bytes``.

Restore time (bytes ÷ rate, GB/s = 10^9 B/s):
  from RAM  = bytes ÷ ``RESTORE_COPY_GBPS`` (``llama_state_seq_set_data`` parses the payload layer by layer
              and copies each row into the cache: ``ggml_backend_tensor_set``);
  from disk = bytes ÷ disk read rate + bytes ÷ ``HASH_GBPS`` (the file's SHA-256 is checked before
              llama.cpp sees it) + the RAM restore.
The disk read rate is the disk kind's sequential read (``speed.DISK_TABLE``, vendor peak) × ``READ_EFFICIENCY``,
unless ``disk_read_gbps`` gives a measured one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from localrun.offload.speed import DISK_TABLE

GIB = 1 << 30
DEFAULT_DISK_BYTES = 8 * GIB  # serve --cache-disk's default
RAM_CAP_BYTES = 8 * GIB  # llama-server's --cache-ram default (8192 MiB, tools/server/README.md)
RAM_SHARE = 0.25  # of the RAM the plan leaves free
# measured here by benches/kv_tiers.py: a 4,057-token SmolLM2 snapshot (93 MB) restores from RAM in
# 0.05 s (CPU, under load); hashlib.sha256 reads 0.5 GB/s on this machine's CPU (SHA-NI, under load)
RESTORE_COPY_GBPS = 2.0
HASH_GBPS = 0.5
READ_EFFICIENCY = 0.8  # one large sequential read reaches most of the peak (mmap page faults: speed.py's 0.5)
# the engine's bounds on context checkpoints (backends/llamacpp/checkpoints.py imports these and
# checkpoint_max_bytes: one formula for fit and the engine). llama-server keeps up to 32 per slot
# (common/common.h n_ctx_checkpoints) at least 8192 tokens apart (checkpoint_min_step) with no byte bound on a
# live slot's; localrun saves one every INTERVAL = 1024 tokens and at each turn's marks, and evicts the one
# nearest its predecessor, so 16 keep a 32k-token sequence covered every 2k tokens.
CHECKPOINTS_PER_SLOT = 16
CHECKPOINTS_MIN_BYTES = 1 * GIB  # the budget never goes below this (the former fixed cap)
CHECKPOINTS_RAM_SHARE = 0.25  # of the RAM the plan leaves, as the RAM tier's default (RAM_SHARE)


@dataclass
class KvTierPlan:
    """What `fit` says about the KV tiers. Bytes, seconds, GB/s."""

    snapshot_tokens: int  # the typical snapshot: a full context, tokens
    snapshot_bytes: int  # its payload (attention KV + recurrent state), bytes
    ram_bytes: int  # the RAM tier's budget (serve --cache-ram; 0 = off)
    ram_source: str  # "default (…)" or "--cache-ram"
    disk_dir: str | None  # serve --cache-dir; None = no disk tier
    disk_bytes: int  # the disk tier's budget (serve --cache-disk), 0 without --cache-dir
    disk_kind: str  # nvme | ssd | hdd | unknown
    disk_read_gbps: float  # sequential read the restore time assumes
    disk_read_source: str  # "table (nvme)" or "measured"
    restore_ram_s: float  # the typical snapshot from the RAM tier
    restore_disk_s: float  # … from the disk tier
    prefill_s: float  # … against prefilling its tokens (the plan's prefill speed); 0 when unknown
    # context checkpoints (recurrent layers; all 0 without them) and the RAM serve may hold in all
    checkpoint_bytes: int = 0  # one checkpoint: one sequence's recurrent state (in each snapshot too)
    checkpoints_max: int = 0  # checkpoints the engine may hold at most (all slots)
    checkpoints_ram_bytes: int = 0  # their host RAM at most
    ram_total_bytes: int = 0  # the plan's RAM + checkpoints_ram_bytes + ram_bytes (the RAM tier)

    @property
    def snapshots_in_ram(self) -> int:
        return self.ram_bytes // self.snapshot_bytes if self.snapshot_bytes else 0

    @property
    def snapshots_on_disk(self) -> int:
        return self.disk_bytes // self.snapshot_bytes if self.snapshot_bytes else 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["snapshots_in_ram"] = self.snapshots_in_ram
        d["snapshots_on_disk"] = self.snapshots_on_disk
        return d


def default_cache_ram_bytes(ram_available_bytes: int, plan_ram_bytes: int = 0) -> int:
    """serve's ``--cache-ram`` default: ``RAM_SHARE`` of the RAM left once the model is in
    (``ram_available_bytes - plan_ram_bytes``; pass 0 for ``plan_ram_bytes`` when the available figure is
    taken after the load), at most ``RAM_CAP_BYTES``, in whole MiB. Bytes; 0 when nothing is left."""
    left = max(0, int(ram_available_bytes) - int(plan_ram_bytes))
    return min(RAM_CAP_BYTES, int(left * RAM_SHARE)) >> 20 << 20


def snapshot_bytes(kv_cache_bytes: int, n_parallel: int = 1, recurrent_bytes: int = 0) -> int:
    """One sequence's full-context state: (the plan's attention KV-cache bytes + its recurrent-state bytes)
    ÷ ``n_parallel`` (each sequence its own KV stream, src/llama-kv-cache.cpp n_stream, and its own R/S rows,
    src/llama-memory-recurrent.cpp). Bytes."""
    return (int(kv_cache_bytes) + int(recurrent_bytes)) // max(1, int(n_parallel))


def checkpoint_max_bytes(one_bytes: int, n_parallel: int, ram_left_bytes: int) -> int:
    """The host RAM all slots' context checkpoints may hold, bytes: every one of ``n_parallel`` slots its
    ``CHECKPOINTS_PER_SLOT`` checkpoints of ``one_bytes`` (one sequence's recurrent state), at most
    ``CHECKPOINTS_RAM_SHARE`` of ``ram_left_bytes`` (the RAM free once the model is in) but never below
    ``CHECKPOINTS_MIN_BYTES``:
    ``min(CHECKPOINTS_PER_SLOT × n_parallel × one_bytes, max(CHECKPOINTS_MIN_BYTES, share × ram_left_bytes))``.
    ``fit`` (``checkpoint_budget``) and the engine (backends/llamacpp/checkpoints.py, with llama.cpp's size
    of a checkpoint and psutil's available RAM after the load) both use it. E.g. a Qwen3.6-27B at 32k × 4
    sequences: 149.6 MiB a checkpoint, 9.35 GiB for 16 per slot, held in full with ≥ 37.4 GiB left."""
    want = CHECKPOINTS_PER_SLOT * max(1, int(n_parallel)) * max(0, int(one_bytes))
    return min(want, max(CHECKPOINTS_MIN_BYTES, int(max(0, int(ram_left_bytes)) * CHECKPOINTS_RAM_SHARE)))


def checkpoint_budget(recurrent_bytes: int, n_parallel: int = 1, ram_left_bytes: int = 0) -> tuple[int, int, int]:
    """The context checkpoints a plan's engine may hold in RAM → (bytes of one, how many at most, their bytes
    at most): one is one sequence's recurrent state (``recurrent_bytes`` ÷ ``n_parallel``, the plan's R/S
    bytes of all sequences), at most ``CHECKPOINTS_PER_SLOT`` per slot and ``checkpoint_max_bytes`` in all
    (``ram_left_bytes``: the RAM the plan leaves; backends/llamacpp/checkpoints.py ``_keep_budget``; a
    checkpoint bigger than that is not saved). (0, 0, 0) without recurrent layers."""
    one = int(recurrent_bytes) // max(1, int(n_parallel))
    cap = checkpoint_max_bytes(one, n_parallel, ram_left_bytes)
    if one <= 0 or one > cap:
        return max(0, one), 0, 0
    n = min(CHECKPOINTS_PER_SLOT * max(1, int(n_parallel)), cap // one)
    return one, n, n * one


def restore_seconds(nbytes: int, *, disk_read_gbps: float | None = None) -> float:
    """Seconds to restore ``nbytes`` of snapshot: from RAM when ``disk_read_gbps`` is None, else from a disk
    reading that many GB/s (see the module docstring for the formula)."""
    ram = nbytes / (RESTORE_COPY_GBPS * 1e9)
    if disk_read_gbps is None:
        return ram
    return nbytes / (max(1e-3, disk_read_gbps) * 1e9) + nbytes / (HASH_GBPS * 1e9) + ram


def disk_read_gbps(kind: str | None) -> float:
    """The sequential read rate a snapshot file is read at on a disk of ``kind`` (nvme, ssd, hdd), GB/s."""
    return DISK_TABLE.get(kind or "unknown", DISK_TABLE["unknown"]) * READ_EFFICIENCY


def plan_kv_tiers(plan, ram_available_bytes: int, *, disk_kind: str | None = None, cache_ram_bytes: int | None = None,
                  cache_dir: str | None = None, cache_disk_bytes: int = DEFAULT_DISK_BYTES,
                  measured_disk_read_gbps: float | None = None) -> KvTierPlan:
    """The tiers ``plan`` (an ``offload.plan.Plan``) gets on a machine with ``ram_available_bytes`` free.

    ``cache_ram_bytes`` None: the default (``default_cache_ram_bytes`` of the RAM the plan leaves);
    ``cache_dir`` None: no disk tier (its budget 0); ``disk_kind``: the kind of the disk holding
    ``cache_dir`` (or the model disk's); ``measured_disk_read_gbps`` replaces the table's rate. The context
    checkpoints (``checkpoint_budget`` of the RAM the plan leaves) count in ``ram_total_bytes``, not in the RAM
    tier's default (serve sizes that once the model is loaded, before any checkpoint exists). Raises nothing."""
    recurrent = int(getattr(plan, "recurrent_bytes", 0) or 0)
    snap = snapshot_bytes(plan.kv_cache_bytes, plan.n_parallel, recurrent)
    one_cp, n_cp, cp_bytes = checkpoint_budget(recurrent, plan.n_parallel,
                                               int(ram_available_bytes) - int(plan.ram_bytes))
    if cache_ram_bytes is None:
        ram = default_cache_ram_bytes(ram_available_bytes, plan.ram_bytes)
        ram_source = f"default ({RAM_SHARE:g} of the RAM the plan leaves, at most {RAM_CAP_BYTES >> 30} GiB)"
    else:
        ram, ram_source = max(0, int(cache_ram_bytes)), "--cache-ram"
    kind = disk_kind or "unknown"
    if measured_disk_read_gbps:
        rate, rate_source = float(measured_disk_read_gbps), "measured"
    else:
        rate, rate_source = disk_read_gbps(kind), f"table ({kind}: {DISK_TABLE.get(kind, DISK_TABLE['unknown']):g} " \
                                                  f"GB/s peak × {READ_EFFICIENCY:g})"
    prefill_tok_s = float(getattr(plan, "prefill_tok_s", 0.0) or 0.0)
    return KvTierPlan(
        snapshot_tokens=int(plan.n_ctx), snapshot_bytes=snap, ram_bytes=ram, ram_source=ram_source,
        disk_dir=str(cache_dir) if cache_dir is not None else None,
        disk_bytes=max(0, int(cache_disk_bytes)) if cache_dir is not None else 0,
        disk_kind=kind, disk_read_gbps=round(rate, 3), disk_read_source=rate_source,
        restore_ram_s=restore_seconds(snap), restore_disk_s=restore_seconds(snap, disk_read_gbps=rate),
        prefill_s=plan.n_ctx / prefill_tok_s if prefill_tok_s > 0 else 0.0,
        checkpoint_bytes=one_cp, checkpoints_max=n_cp, checkpoints_ram_bytes=cp_bytes,
        ram_total_bytes=int(plan.ram_bytes) + cp_bytes + ram)
