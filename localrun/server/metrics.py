"""Prometheus metrics for one server instance (its own ``CollectorRegistry``: no process globals).

Counters are updated from the scheduler thread and the request handlers (prometheus-client is
thread-safe). Names follow Prometheus conventions: ``_total`` counters, ``_seconds`` histograms.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """requests, tokens, TTFT / inter-token latency, queue depth, active sequences, KV cells, prefix cache."""

    def __init__(self, n_parallel: int, kv_cells_total: int) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("localrun_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.generations = Counter("localrun_generations", "Generations finished, by finish reason",
                                   ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("localrun_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_prompt_tokens = Counter("localrun_prompt_tokens_cached",
                                            "Prompt tokens whose KV was reused from the prefix cache", registry=r)
        self.generated_tokens = Counter("localrun_generated_tokens", "Tokens generated", registry=r)
        self.prefix_cache_hits = Counter("localrun_prefix_cache_hits",
                                         "Generations that reused at least one cached prompt token", registry=r)
        self.ttft = Histogram("localrun_time_to_first_token_seconds", "Request arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("localrun_inter_token_latency_seconds", "Time between consecutive tokens",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("localrun_queue_depth", "Requests waiting for a sequence slot", registry=r)
        self.active = Gauge("localrun_active_sequences", "Sequences being prefilled or decoded", registry=r)
        self.kv_cells_used = Gauge("localrun_kv_cells_used", "KV-cache cells holding tokens (running + cached)",
                                   registry=r)
        self.kv_cells_total = Gauge("localrun_kv_cells_total", "KV-cache cells (n_ctx × n_parallel)", registry=r)
        self.n_parallel = Gauge("localrun_parallel_sequences", "Sequence slots", registry=r)
        self.hit_rate = Gauge("localrun_prefix_cache_hit_rate",
                              "Cached prompt tokens / prompt tokens since start (0..1)", registry=r)
        self.kv_cells_total.set(kv_cells_total)
        self.n_parallel.set(n_parallel)
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
