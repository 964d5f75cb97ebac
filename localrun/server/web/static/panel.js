// The server panel: live numbers read from the endpoints programs use, every 2 s while the panel is open:
// /api/ps (the resident models: slots, queue, KV cells, memory) and /metrics (Prometheus text: requests,
// tokens, prefix-cache reuse, KV-tier hits, TTFT). "requests" counts the requests that asked a model for
// something: localrun_requests_total less the endpoints that only read the server's state (READ_ONLY: this
// panel's own polling, the model list, the page and its files, probes), counted apart as "status reads".
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const $ = (id) => document.getElementById(id);
  let timer = 0;
  // endpoints (localrun_requests_total's "endpoint" label) that read state and ask no model for anything;
  // "other" is every path the server does not name, the page's own files included
  const READ_ONLY = new Set(["/metrics", "/api/ps", "/v1/models", "/api/tags", "/api/show", "/api/version", "/health", "/",
    "/ui", "/ui/", "/ui/api/plan", "other"]);

  const el = LR.el;

  const size = LR.size;

  function sum(metrics, name, pred) {
    return (metrics[name] || []).filter((s) => !pred || pred(s.labels)).reduce((a, s) => a + s.value, 0);
  }

  function stat(label, value, title) {
    const d = el("div", "stat");
    if (title) d.title = title;
    d.appendChild(el("span", "stat-value", value));
    d.appendChild(el("span", "stat-label", label));
    return d;
  }

  function summary(mx, ps) {
    const models = ps.models || [];
    const running = models.reduce((a, m) => a + ((m.localrun || {}).active_sequences || 0), 0);
    const slots = models.reduce((a, m) => a + ((m.localrun || {}).n_parallel || 0), 0);
    const queued = models.reduce((a, m) => a + ((m.localrun || {}).queued || 0), 0);
    const prompt = sum(mx, "localrun_prompt_tokens_total");
    const cached = sum(mx, "localrun_prompt_tokens_cached_total");
    const ttftN = sum(mx, "localrun_time_to_first_token_seconds_count");
    const ttftS = sum(mx, "localrun_time_to_first_token_seconds_sum");
    const hits = {};
    for (const s of mx.localrun_kv_tier_hits_total || []) hits[s.labels.tier || "?"] = (hits[s.labels.tier || "?"] || 0) + s.value;
    const tierText = Object.keys(hits).length ? Object.entries(hits).map(([t, n]) => t + " " + n).join(", ") : "none";
    const box = $("server-summary");
    box.replaceChildren(
      stat("sequences running / slots", running + " / " + slots),
      stat("waiting", String(queued)),
      stat("requests", String(sum(mx, "localrun_requests_total", (l) => !READ_ONLY.has(l.endpoint))),
        "requests that asked a model for something (chat, completions, embeddings, loads, pulls, …)"),
      stat("status reads", String(sum(mx, "localrun_requests_total", (l) => READ_ONLY.has(l.endpoint))),
        "requests that only read the server's state: this panel's polling of /api/ps and /metrics, model lists, "
        + "the page's own files"),
      stat("tokens generated", String(sum(mx, "localrun_generated_tokens_total"))),
      stat("prompt tokens reused", prompt ? Math.round((100 * cached) / prompt) + "%" : "–", cached + " of " + prompt),
      stat("mean TTFT", ttftN ? (ttftS / ttftN).toFixed(2) + " s" : "–"),
      stat("KV snapshot hits", tierText, "prompts that restored a KV snapshot, per tier"),
    );
    box.dataset.running = String(running);
  }

  function modelCards(ps) {
    const out = $("server-models");
    out.replaceChildren();
    for (const m of ps.models || []) {
      const lr = m.localrun || {};
      const mem = lr.memory || {};
      const card = el("div", "card");
      card.appendChild(el("strong", null, m.name));
      const used = mem.kv_cells_used || 0;
      const total = mem.kv_cells_total || 1;
      const bar = el("progress");
      bar.max = total;
      bar.value = used;
      bar.title = "KV cache cells in use";
      const lines = [
        (lr.serving || lr.backend || "") + " · " + (lr.n_ctx || m.context_length) + "-token context each",
        "running " + (lr.active_sequences || 0) + ", waiting " + (lr.queued || 0) + " · keep-alive " + (lr.keep_alive || ""),
        "VRAM " + size(m.size_vram) + " · RAM " + size(mem.ram_bytes) + " · weights " + size(mem.weights_bytes) +
          " · KV " + size(mem.kv_cache_bytes),
        "KV cells " + used + " / " + total,
      ];
      for (const l of lines) card.appendChild(el("div", "muted", l));
      card.appendChild(bar);
      out.appendChild(card);
    }
    if (!(ps.models || []).length) out.appendChild(el("p", "muted", "No model in memory: the first question loads one."));
  }

  async function tick() {
    try {
      const [ps, text] = await Promise.all([LR.api.json("/api/ps"), LR.api.request("/metrics").then((r) => r.text())]);
      const mx = LR.api.prometheus(text);
      summary(mx, ps);
      modelCards(ps);
      $("server-status").textContent = "Updated " + new Date().toLocaleTimeString();
    } catch (e) {
      $("server-status").textContent = "Could not read the server: " + e.message;
    }
  }

  function start() {
    stop();
    tick();
    timer = setInterval(tick, 2000);
  }

  function stop() {
    if (timer) clearInterval(timer);
    timer = 0;
  }

  LR.panel = { start, stop, tick };
})();
