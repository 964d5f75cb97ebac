// The model picker: the list /v1/models gives (resident ones first, meta.loaded; meta.default: the one the
// server answers a request without a model with), the plan of the chosen one in words before it loads
// (/ui/api/plan; a model without a chat template is said to be one that cannot chat), load now / unload
// (Ollama's /api/generate with an empty prompt; keep_alive 0 unloads), and pull by name with a progress bar
// (/api/pull, NDJSON; done only on its "success" line). The header names the model chat requests name:
// the one chosen here, else the server's default; a chosen name the server no longer lists is dropped with
// a notice. While the server does not answer, the list (and the plan shown) is emptied and says so, and the
// list is asked for again every RETRY_MS.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const $ = (id) => document.getElementById(id);
  const state = { models: [], picked: null, unreachable: false };
  const RETRY_MS = 5000; // while the server does not answer, the list is asked for again this often
  let retry = 0;

  const el = LR.el;

  const size = (bytes) => (bytes ? LR.size(bytes) : "");

  function find(name) {
    return state.models.find((m) => m.id === name);
  }

  // the model chat requests name: the one chosen in the picker (settings.model), else the server's default
  // (meta.default), else its first resident; null while the list is unknown (then the server picks)
  function current() {
    const s = LR.store.settings.model;
    return (s && find(s)) || state.models.find((m) => m.meta && m.meta.default)
      || state.models.find((m) => m.meta && m.meta.loaded) || null;
  }

  async function refresh() {
    try {
      const body = await LR.api.json("/v1/models");
      state.models = body.data || [];
      state.unreachable = false;
    } catch (e) {
      if (!(e instanceof LR.api.Unreachable)) {
        $("model-name").textContent = "could not list the models";
        return;
      }
      state.models = []; // nothing listed is known to be there any more, nor its plan
      state.unreachable = true;
      state.picked = null;
      $("plan").hidden = true;
      if (!retry) retry = setTimeout(() => {
        retry = 0;
        refresh();
      }, RETRY_MS);
    }
    const chosen = LR.store.settings.model;
    if (chosen && !state.unreachable && !find(chosen)) {
      LR.store.settings.model = "";
      LR.store.saveSettings();
      const m = current();
      if (LR.app) LR.app.notice("This server does not have " + chosen + (m ? ": chatting with " + m.id + "." : "."));
    }
    renderList();
    renderButton();
  }

  function renderButton() {
    const m = current();
    const name = state.unreachable ? "server unreachable" : m ? m.id : "default model";
    $("model-name").textContent = name;
    $("model-dot").className = "dot" + (m && m.meta && m.meta.loaded ? " on" : "");
    $("model-dot").title = m && m.meta && m.meta.loaded ? "in memory" : "loads on the first question";
    if (LR.app && LR.app.onModels) LR.app.onModels();
  }

  function renderList() {
    const ul = $("model-list");
    const focused = ul.contains(document.activeElement) ? document.activeElement.dataset.model : null;
    ul.replaceChildren();
    for (const m of state.models) {
      const meta = m.meta || {};
      const li = el("li");
      const b = el("button", "model-item" + (state.picked === m.id ? " picked" : ""));
      b.type = "button";
      b.dataset.model = m.id;
      const head = el("span", "model-head");
      head.appendChild(el("span", "model-id", m.id));
      if (meta.loaded) head.appendChild(el("span", "badge on", "in memory"));
      if (meta.default) head.appendChild(el("span", "badge", "server default"));
      if (current() === m) head.appendChild(el("span", "badge", "chatting"));
      b.appendChild(head);
      const facts = [size(meta.size), meta.arch, meta.n_params ? (meta.n_params / 1e9).toFixed(2) + "B params" : ""];
      for (const cap of ["thinking", "tool_calls", "vision"]) if (meta[cap]) facts.push(cap.replace("_", " "));
      b.appendChild(el("span", "model-facts muted", facts.filter(Boolean).join(" · ")));
      if (meta.chat_template === false) b.appendChild(el("span", "model-facts warn", "no chat template: cannot chat"));
      b.addEventListener("click", () => pick(m.id));
      li.appendChild(b);
      ul.appendChild(li);
      if (focused === m.id) b.focus();
    }
    if (state.unreachable) ul.appendChild(el("li", "error", "The server is not answering: no models to list."));
    else if (!state.models.length) ul.appendChild(el("li", "muted", "No models found. Pull one below."));
  }

  async function pick(name) {
    state.picked = name;
    renderList();
    const box = $("plan");
    box.hidden = false;
    box.dataset.model = name;
    box.dataset.state = "loading";
    $("plan-title").textContent = name;
    $("plan-machine").textContent = "Planning…";
    $("plan-words").replaceChildren();
    $("plan-reasons").replaceChildren();
    $("plan-status").textContent = "";
    delete box.dataset.chat;
    $("btn-use").disabled = false;
    $("btn-use").title = "";
    const m = find(name);
    $("btn-unload").hidden = !(m && m.meta && m.meta.loaded);
    $("btn-load").hidden = !!(m && m.meta && m.meta.loaded);
    try {
      const p = await LR.api.json("/ui/api/plan?model=" + encodeURIComponent(name));
      if (state.picked !== name) return;
      $("plan-machine").textContent = (p.resident ? "Loaded now on " : "On ") + (p.machine || "this machine") + ":";
      for (const w of p.words || []) $("plan-words").appendChild(el("li", null, w));
      for (const w of p.warnings || []) $("plan-words").appendChild(el("li", "warn", w));
      for (const r of p.reasons || []) $("plan-reasons").appendChild(el("li", null, r));
      $("plan-more").hidden = !(p.reasons || []).length;
      box.dataset.fits = p.fits ? "yes" : "no";
      box.dataset.chat = p.chat_template === false ? "no" : "yes";
      $("btn-use").disabled = p.chat_template === false;
      $("btn-use").title = p.chat_template === false ? "It has no chat template: it cannot chat" : "";
      box.dataset.state = "ready";
    } catch (e) {
      if (state.picked !== name) return;
      $("plan-machine").textContent = "";
      $("plan-words").appendChild(el("li", "error", "No plan: " + e.message));
      box.dataset.state = "error";
    }
  }

  function use() {
    if (!state.picked) return;
    LR.store.settings.model = state.picked;
    LR.store.saveSettings();
    renderList();
    renderButton();
    LR.app.closeDrawer();
  }

  async function loadOrUnload(unload) {
    const name = state.picked;
    if (!name) return;
    const status = $("plan-status");
    status.textContent = unload ? "Unloading…" : "Loading…";
    $("plan").dataset.state = unload ? "unloading" : "loading-model";
    const t0 = performance.now();
    try {
      const body = { model: name, prompt: "", stream: false };
      if (unload) body.keep_alive = 0;
      await LR.api.json("/api/generate", body);
      status.textContent = unload ? "Unloaded." : "Loaded in " + ((performance.now() - t0) / 1000).toFixed(1) + " s.";
      await refresh();
      await pick(name);
      $("plan-status").textContent = unload ? "Unloaded." : "Loaded in " + ((performance.now() - t0) / 1000).toFixed(1) + " s.";
      $("plan").dataset.state = unload ? "unloaded" : "loaded";
    } catch (e) {
      status.textContent = (unload ? "Could not unload: " : "Could not load: ") + e.message;
      $("plan").dataset.state = "error";
    }
  }

  // pulls the name typed in "Get a model": the bar follows /api/pull's byte counts, stays full when done,
  // and the picker then shows the new model's plan. Done means the stream's {"status": "success"} line came:
  // a stream that ends without it (the connection dropped, the server stopped) is an error that says how
  // far it got, the bar left where it was. #pull's data-state: pulling, done or error.
  async function pull() {
    const name = $("pull-name").value.trim();
    if (!name || $("btn-pull").disabled) return;
    const box = $("pull");
    const bar = $("pull-progress");
    const status = $("pull-status");
    box.dataset.state = "pulling";
    bar.hidden = false;
    bar.removeAttribute("value"); // indeterminate until the first byte count
    status.textContent = "Asking for " + name + "…";
    $("btn-pull").disabled = true;
    let pulled = name;
    try {
      const resp = await LR.api.request("/api/pull", { method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model: name, stream: true }) });
      let failed = null, success = false, got = 0, total = 0;
      await LR.api.ndjson(resp, (ev) => {
        if (ev.error) failed = ev.error;
        else {
          if (ev.status === "success") success = true;
          if (ev.total) [got, total] = [ev.completed || 0, ev.total];
          status.textContent = ev.status || "";
          if (ev.total) {
            bar.max = ev.total;
            bar.value = ev.completed || 0;
            status.textContent = (ev.status || "pulling") + ": " + size(ev.completed || 0) + " of " + size(ev.total);
          }
          if (ev.localrun && ev.localrun.name) pulled = ev.localrun.name;
        }
      });
      if (failed) throw new Error(failed);
      if (!success) {
        status.textContent = "The pull of " + name + " stopped before it finished" + (total ? " (" + size(got)
          + " of " + size(total) + ")" : "") + ": the server's stream ended early. Pull again to resume.";
        box.dataset.state = "error";
        return;
      }
      bar.value = bar.max;
      await refresh();
      status.textContent = "Done: " + pulled + " is ready.";
      box.dataset.state = "done";
      if (find(pulled)) await pick(pulled);
    } catch (e) {
      status.textContent = "Could not pull " + name + ": " + e.message;
      bar.hidden = true;
      box.dataset.state = "error";
    } finally {
      $("btn-pull").disabled = false;
    }
  }

  function init() {
    $("btn-use").addEventListener("click", use);
    $("btn-load").addEventListener("click", () => loadOrUnload(false));
    $("btn-unload").addEventListener("click", () => loadOrUnload(true));
    $("btn-pull").addEventListener("click", pull);
    $("pull-name").addEventListener("keydown", (e) => {
      if (e.key === "Enter") pull();
    });
  }

  LR.models = { init, refresh, current, find, pick, state, renderButton };
})();
