"""Prometheus metrics for one server instance (its own ``CollectorRegistry``: no process globals).

``ServerMetrics`` holds the families; every per-model series carries a ``model`` label (the model's id as the
API reports it). ``ServerMetrics.for_model(model, …)`` gives the ``ModelMetrics`` view a model's scheduler
updates: the same attribute names as the families, bound to that model's label, so the scheduler does not
know which model it drives. Counters are updated from scheduler threads and the request handlers
(prometheus-client is thread-safe). Names follow Prometheus conventions: ``_total`` counters, ``_seconds``
histograms, ``_bytes`` gauges.

Per model: requests, tokens, TTFT / inter-token latency, queue depth, active sequences, KV cells, prefix cache;
KV-cache tiers (``backends/kv_cache.py``, read at scrape time): snapshot hits per tier (``ram``, ``disk``),
misses, bytes held per tier, restore seconds, corrupt files dropped;
speculative decoding (``backends/llamacpp/spec.py``, read at scrape time from the engine's totals since it
loaded): drafted tokens and accepted tokens (counters), verify steps;
residency: loads, unloads (by reason), evictions, load (cold start) seconds, resident bytes per tier
(``vram``, ``ram``: the planner's numbers for the loaded plan);
steps and the KV layout (``backends/llamacpp/ubatch.py``, read at scrape time from the engine's
``step_totals`` since it loaded): decode and prefill steps and their ubatches (passes over the weights;
one per decode step is the goal, docs/architecture.md §1), sequences moved to keep the running ids
consecutive, whether the KV cache is one unified pool or one stream per sequence, and the tokens a
sequence may grow to;
context checkpoints of a model with recurrent layers (``backends/llamacpp/checkpoints.py``, read at scrape
time from ``engine.checkpoints.stats`` since it loaded; a model without recurrent layers has none): saves,
restores and the prompt tokens they kept, whole prefills by reason (no checkpoint at or before the cut, or
llama.cpp refused it), evictions, checkpoints and bytes held now.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    """Every metric family of one server (see the module docstring)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        m = ["model"]
        self.requests = Counter("localrun_requests", "HTTP requests answered (model: the one that answered, or "
                                "empty)", ["endpoint", "status", "model"], registry=r)
        self.generations = Counter("localrun_generations", "Generations finished, by finish reason",
                                   m + ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("localrun_prompt_tokens", "Prompt tokens received", m, registry=r)
        self.cached_prompt_tokens = Counter("localrun_prompt_tokens_cached",
                                            "Prompt tokens whose KV was reused from the prefix cache", m, registry=r)
        self.generated_tokens = Counter("localrun_generated_tokens", "Tokens generated", m, registry=r)
        self.prefix_cache_hits = Counter("localrun_prefix_cache_hits",
                                         "Generations that reused at least one cached prompt token", m, registry=r)
        self.ttft = Histogram("localrun_time_to_first_token_seconds", "Request arrival to first token", m,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("localrun_inter_token_latency_seconds", "Time between consecutive tokens", m,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("localrun_queue_depth", "Requests waiting for a sequence slot", m, registry=r)
        self.active = Gauge("localrun_active_sequences", "Sequences being prefilled or decoded", m, registry=r)
        self.kv_cells_used = Gauge("localrun_kv_cells_used", "KV-cache cells holding tokens (running + cached)", m,
                                   registry=r)
        self.kv_cells_total = Gauge("localrun_kv_cells_total", "KV-cache cells (n_ctx × n_parallel)", m, registry=r)
        self.n_parallel = Gauge("localrun_parallel_sequences", "Sequence slots", m, registry=r)
        self.hit_rate = Gauge("localrun_prefix_cache_hit_rate",
                              "Cached prompt tokens / prompt tokens since load (0..1)", m, registry=r)
        # residency (server/models.py)
        self.loads = Counter("localrun_model_loads", "Models loaded", m, registry=r)
        self.unloads = Counter("localrun_model_unloads", "Models unloaded, by reason (expired, keep_alive, "
                               "evicted, request, shutdown)", m + ["reason"], registry=r)
        self.evictions = Counter("localrun_model_evictions", "Idle models unloaded to make room for another", m,
                                 registry=r)
        self.load_seconds = Histogram("localrun_model_load_seconds", "Cold start: plan + load of a model", m,
                                      buckets=_LOAD_BUCKETS, registry=r)
        self.resident_bytes = Gauge("localrun_model_resident_bytes", "Memory a resident model holds by the "
                                    "planner, per tier (vram, ram)", m + ["tier"], registry=r)
        self.models_loaded = Gauge("localrun_models_loaded", "Resident models", registry=r)
        self.kv_caches: dict[str, object] = {}  # model → backends.kv_cache.KVCache (ModelMetrics.watch_kv_cache)
        r.register(_KVTierCollector(self.kv_caches))
        self.spec_engines: dict[str, object] = {}  # model → engine with ``.speculation`` (watch_speculation)
        r.register(_SpecCollector(self.spec_engines))
        r.register(_StepCollector(self.spec_engines))  # the same engines: their step_totals and KV layout
        r.register(_CheckpointCollector(self.spec_engines))  # … and their context checkpoints (hybrids)

    def for_model(self, model: str, n_parallel: int, kv_cells_total: int) -> "ModelMetrics":
        """The view one model's scheduler updates (its gauges start at 0)."""
        return ModelMetrics(self, model, n_parallel, kv_cells_total)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Bound:
    """A labelled family with the ``model`` label filled in: ``.labels(reason)`` → the child."""

    def __init__(self, family, model: str) -> None:
        self._family = family
        self._model = model

    def labels(self, *values: str):
        return self._family.labels(self._model, *values)


class ModelMetrics:
    """One model's series (``ServerMetrics.for_model``); ``registry`` is the server's."""

    _GAUGES = ("queue_depth", "active", "kv_cells_used", "kv_cells_total", "n_parallel", "hit_rate")

    def __init__(self, parent: ServerMetrics, model: str, n_parallel: int, kv_cells_total: int) -> None:
        self.parent = parent
        self.model = model
        self.registry = parent.registry
        self.generations = _Bound(parent.generations, model)
        for name in ("prompt_tokens", "cached_prompt_tokens", "generated_tokens", "prefix_cache_hits", "ttft",
                     "itl") + self._GAUGES:
            setattr(self, name, getattr(parent, name).labels(model))
        self.kv_cells_total.set(kv_cells_total)
        self.n_parallel.set(n_parallel)
        self.queue_depth.set(0)
        self.active.set(0)
        self._prompt = 0
        self._cached = 0

    def on_admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_prompt_tokens.inc(cached_tokens)
        if cached_tokens:
            self.prefix_cache_hits.inc()
        self._prompt += prompt_tokens
        self._cached += cached_tokens
        self.hit_rate.set(self._cached / self._prompt if self._prompt else 0.0)

    def watch_kv_cache(self, cache) -> None:
        """Report ``cache`` (a ``KVCache``, or None: no tiers) as this model's KV-tier series."""
        if cache is not None:
            self.parent.kv_caches[self.model] = cache

    def watch_speculation(self, engine) -> None:
        """Report ``engine``'s speculative decoding totals (``engine.speculation.totals()``, read at scrape
        time; nothing while ``engine.speculation`` is None or absent) as this model's series, its step
        totals and KV layout (``engine.step_totals``; nothing for an engine without them), and its context
        checkpoints (``engine.checkpoints.stats``; nothing while ``engine.checkpoints`` is None or absent)."""
        self.parent.spec_engines[self.model] = engine

    def drop_gauges(self) -> None:
        """The model was unloaded: its gauges leave /metrics (its counters stay: they are history)."""
        self.parent.kv_caches.pop(self.model, None)
        self.parent.spec_engines.pop(self.model, None)
        for name in self._GAUGES:
            try:
                getattr(self.parent, name).remove(self.model)
            except KeyError:
                pass
        for tier in ("vram", "ram"):
            try:
                self.parent.resident_bytes.remove(self.model, tier)
            except KeyError:
                pass

    def render(self) -> bytes:
        return self.parent.render()


class _KVTierCollector:
    """The KV-tier series, read from each model's ``KVCache.stats`` when /metrics is scraped."""

    def __init__(self, caches: dict) -> None:
        self.caches = caches

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        hits = CounterMetricFamily("localrun_kv_tier_hits", "Prompts that restored a KV snapshot, per tier",
                                   labels=["model", "tier"])
        misses = CounterMetricFamily("localrun_kv_tier_misses", "Prompts no KV snapshot (nor the slot) reused",
                                     labels=["model"])
        restore = CounterMetricFamily("localrun_kv_tier_restore_seconds", "Time spent restoring KV snapshots",
                                      labels=["model"])
        restored = CounterMetricFamily("localrun_kv_tier_restored_tokens", "Prompt tokens restored from snapshots",
                                       labels=["model"])
        corrupt = CounterMetricFamily("localrun_kv_tier_corrupt_files", "Disk snapshots ignored and deleted "
                                      "(corrupt, truncated, another model's)", labels=["model"])
        size = GaugeMetricFamily("localrun_kv_tier_bytes", "Bytes of KV snapshots held, per tier",
                                 labels=["model", "tier"])
        for model, cache in list(self.caches.items()):
            st = cache.stats
            hits.add_metric([model, "ram"], st.hits_ram)
            hits.add_metric([model, "disk"], st.hits_disk)
            misses.add_metric([model], st.misses)
            restore.add_metric([model], st.restore_s)
            restored.add_metric([model], st.restored_tokens)
            corrupt.add_metric([model], st.corrupt_files)
            size.add_metric([model, "ram"], cache.ram_used_bytes)
            size.add_metric([model, "disk"], cache.disk_used_bytes)
        return [hits, misses, restore, restored, corrupt, size]


class _SpecCollector:
    """Speculative decoding's series, read from each model's ``engine.speculation.totals()`` when /metrics
    is scraped (``localrun_spec_draft_tokens_total``, ``localrun_spec_accepted_tokens_total``,
    ``localrun_spec_verify_steps_total``; since the model loaded). A model without speculation has none."""

    def __init__(self, engines: dict) -> None:
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily

        drafted = CounterMetricFamily("localrun_spec_draft_tokens", "Tokens drafted by speculative decoding "
                                      "(prompt lookup or a draft model) and verified by the model", labels=["model"])
        accepted = CounterMetricFamily("localrun_spec_accepted_tokens", "Drafted tokens the model kept",
                                       labels=["model"])
        steps = CounterMetricFamily("localrun_spec_verify_steps", "Decode steps that verified drafted tokens",
                                    labels=["model"])
        for model, engine in list(self.engines.items()):
            spec = getattr(engine, "speculation", None)
            totals = spec.totals() if spec is not None else None
            if not totals:
                continue
            drafted.add_metric([model], totals.get("draft_tokens", 0))
            accepted.add_metric([model], totals.get("accepted_tokens", 0))
            steps.add_metric([model], totals.get("verify_steps", 0))
        return [drafted, accepted, steps]


class _StepCollector:
    """Each model's step series, read from ``engine.step_totals`` (``backends/llamacpp/ubatch.py``
    ``StepTotals``) when /metrics is scraped: ``localrun_decode_steps_total``,
    ``localrun_decode_ubatches_total`` (their ratio is the passes over the weights per decode step),
    ``localrun_prefill_steps_total``, ``localrun_prefill_ubatches_total``, ``localrun_kv_moves_total``,
    ``localrun_kv_moved_bytes_total``; gauges ``localrun_kv_unified`` (1: one KV pool shared by the
    sequences, 0: one KV stream per sequence) and ``localrun_sequence_max_tokens`` (what one sequence may
    grow to, tokens). ``ubatches`` are measured by llama.cpp's eval callback when the engine was loaded
    with ``LOCALRUN_COUNT_UBATCHES=1``, else predicted from the batches (label ``source``)."""

    def __init__(self, engines: dict) -> None:
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fams = {
            "decode_steps": CounterMetricFamily("localrun_decode_steps", "Decode steps (one llama_decode of one "
                                                "token per running sequence, drafts included)", labels=["model"]),
            "decode_ubatches": CounterMetricFamily("localrun_decode_ubatches", "Ubatches (passes over the weights) "
                                                   "of the decode steps", labels=["model", "source"]),
            "prefill_steps": CounterMetricFamily("localrun_prefill_steps", "Prefill steps (one prompt chunk)",
                                                 labels=["model"]),
            "prefill_ubatches": CounterMetricFamily("localrun_prefill_ubatches", "Ubatches of the prefill steps",
                                                    labels=["model", "source"]),
            "moves": CounterMetricFamily("localrun_kv_moves", "Sequences whose KV was copied to another sequence "
                                         "id to keep the running ids consecutive", labels=["model"]),
            "moved_bytes": CounterMetricFamily("localrun_kv_moved_bytes", "Bytes of sequence state copied by those "
                                               "moves", labels=["model"]),
        }
        unified = GaugeMetricFamily("localrun_kv_unified", "1: one KV pool shared by all sequences; 0: one KV "
                                    "stream per sequence", labels=["model"])
        seq_max = GaugeMetricFamily("localrun_sequence_max_tokens", "Tokens one sequence may grow to (prompt + "
                                    "output)", labels=["model"])
        for model, engine in list(self.engines.items()):
            st = getattr(engine, "step_totals", None)
            if st is None:
                continue
            src = "measured" if st.measured else "predicted"
            for key, fam in fams.items():
                fam.add_metric([model, src] if key.endswith("ubatches") else [model], getattr(st, key))
            unified.add_metric([model], 1.0 if getattr(engine, "kv_unified", False) else 0.0)
            seq_max.add_metric([model], float(getattr(engine, "n_ctx", 0)))
        return [*fams.values(), unified, seq_max]


class _CheckpointCollector:
    """Each model's context-checkpoint series, read from ``engine.checkpoints.stats``
    (``backends/llamacpp/checkpoints.py`` ``CheckpointStats``, since the model loaded) when /metrics is scraped:
    counters ``localrun_checkpoint_saves_total``, ``localrun_checkpoint_restores_total`` (cuts served by a
    checkpoint), ``localrun_checkpoint_restored_tokens_total`` (prompt tokens those restores kept),
    ``localrun_checkpoint_full_prefills_total`` (cuts no checkpoint served: the prompt was prefilled whole; label
    ``reason``: ``no_checkpoint``, ``restore_failed``), ``localrun_checkpoint_evictions_total``; gauges
    ``localrun_checkpoints_held`` and ``localrun_checkpoint_bytes`` (host RAM they hold now). A model without
    recurrent layers has none."""

    COUNTERS = (("saves", "Context checkpoints saved (a recurrent sequence's state at a prompt position)"),
                ("restores", "Prompt cuts served by restoring a context checkpoint"),
                ("restored_tokens", "Prompt tokens kept by those restores (not prefilled again)"),
                ("evictions", "Context checkpoints dropped to stay within the per-slot count or the byte budget"))

    def __init__(self, engines: dict) -> None:
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fams = {key: CounterMetricFamily(f"localrun_checkpoint_{key}", doc, labels=["model"])
                for key, doc in self.COUNTERS}
        whole = CounterMetricFamily("localrun_checkpoint_full_prefills", "Prompt cuts no context checkpoint served "
                                    "(the prompt was prefilled whole), by reason: no_checkpoint (none at or before "
                                    "the cut), restore_failed (llama.cpp refused it)", labels=["model", "reason"])
        held = GaugeMetricFamily("localrun_checkpoints_held", "Context checkpoints held now (all slots)",
                                 labels=["model"])
        size = GaugeMetricFamily("localrun_checkpoint_bytes", "Host RAM the context checkpoints hold now, bytes",
                                 labels=["model"])
        for model, engine in list(self.engines.items()):
            cps = getattr(engine, "checkpoints", None)
            if cps is None:
                continue
            st = cps.stats
            for key, fam in fams.items():
                fam.add_metric([model], getattr(st, key))
            for reason, n in st.full_prefill_reasons.items():
                whole.add_metric([model, reason], n)
            held.add_metric([model], st.held)
            size.add_metric([model], st.held_bytes)
        return [*fams.values(), whole, held, size]
