// The page's wiring: the conversation list, the composer (images pasted, dropped or picked for a model that
// takes them), the drawer (models, settings, server: opening it moves the focus into it, Escape or ✕ closes
// it and gives the focus back), the settings' checks, export and import, the keys (Escape also stops an
// answer), and the start-up.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const $ = (id) => document.getElementById(id);
  const SAMPLING = ["temperature", "top_p", "max_tokens", "seed"];

  const el = LR.el;

  function renderConversations() {
    const ul = $("conv-list");
    ul.replaceChildren();
    const cur = LR.chat.state.conv;
    for (const c of LR.store.list()) {
      const li = el("li", "conv" + (cur && c.id === cur.id ? " current" : ""));
      const open = el("button", "conv-open", c.title || "New chat");
      open.type = "button";
      open.title = c.title;
      open.addEventListener("click", () => {
        if (LR.chat.state.busyIdx >= 0) return;
        LR.chat.open(c);
        if (window.matchMedia("(max-width: 760px)").matches) document.body.classList.remove("side-open");
      });
      const del = el("button", "conv-del", "✕");
      del.type = "button";
      del.title = "Delete this conversation";
      del.setAttribute("aria-label", "Delete " + c.title);
      del.addEventListener("click", () => {
        if (LR.chat.state.busyIdx >= 0) return;
        LR.store.remove(c.id);
        if (cur && c.id === cur.id) LR.chat.open(LR.store.current());
        else renderConversations();
      });
      li.appendChild(open);
      li.appendChild(del);
      ul.appendChild(li);
    }
  }

  const OPENERS = { models: "btn-models", settings: "btn-settings", server: "btn-server" };

  // the element of the open pane that takes the focus: the picked (else the first) model, the system prompt,
  // or the close button
  function paneFocus(which) {
    if (which === "models")
      return $("model-list").querySelector(".model-item.picked") || $("model-list").querySelector(".model-item")
        || $("pull-name");
    return which === "settings" ? $("set-system") : $("drawer-close");
  }

  function openDrawer(which) {
    const d = $("drawer");
    const same = !d.hidden && d.dataset.pane === which;
    closeDrawer(same);
    if (same) return;
    d.hidden = false;
    d.dataset.pane = which;
    $("pane-" + which).hidden = false;
    $("drawer-title").textContent = { models: "Models", settings: "Settings", server: "Server" }[which];
    document.body.classList.add("drawer-open");
    $(OPENERS[which]).setAttribute("aria-pressed", "true");
    if (which === "server") LR.panel.start();
    if (which === "settings") fillSettings();
    paneFocus(which).focus();
    if (which === "models") {
      LR.models.refresh().then(() => {
        // the list came after the pull box took the focus (no model was listed yet): the first model takes it
        if (d.dataset.pane === "models" && document.activeElement === $("pull-name") && !$("pull-name").value)
          paneFocus("models").focus();
      });
    }
  }

  // closes the drawer; the focus goes back to the button that opened it (unless `keepFocus`, or the focus
  // is elsewhere already)
  function closeDrawer(keepFocus) {
    const d = $("drawer");
    const was = d.dataset.pane;
    const inside = d.contains(document.activeElement) || document.activeElement === document.body;
    if (was && !keepFocus && inside) $(OPENERS[was]).focus();
    d.hidden = true;
    delete d.dataset.pane;
    for (const p of d.querySelectorAll(".pane")) p.hidden = true;
    document.body.classList.remove("drawer-open");
    for (const b of document.querySelectorAll(".top [aria-pressed]")) b.removeAttribute("aria-pressed");
    LR.panel.stop();
  }

  function fillSettings() {
    const s = LR.store.settings;
    for (const k of SAMPLING) $("set-" + k).value = s[k] === undefined ? "" : s[k];
    $("set-extra").value = s.extra || "";
    $("set-system").value = LR.chat.state.conv ? LR.chat.state.conv.system || "" : "";
    showSettingsProblems();
  }

  const LABELS = { temperature: "Temperature", top_p: "Top p", max_tokens: "Max tokens", seed: "Seed" };

  // what is wrong with the sampling setting `k` (its field's min and max; max tokens and seed whole
  // numbers), "" when it is fine or empty
  function samplingProblem(k) {
    const v = LR.store.settings[k];
    if (v === "" || v === null || v === undefined) return "";
    const n = Number(v);
    const input = $("set-" + k);
    const lo = input.min === "" ? -Infinity : Number(input.min);
    const hi = input.max === "" ? Infinity : Number(input.max);
    if (!Number.isFinite(n)) return LABELS[k] + " must be a number.";
    if ((k === "max_tokens" || k === "seed") && !Number.isInteger(n)) return LABELS[k] + " must be a whole number.";
    if (n < lo || n > hi) {
      const range = hi === Infinity ? "at least " + lo : "between " + lo + " and " + hi;
      return LABELS[k] + " must be " + range + " (" + v + " is not).";
    }
    return "";
  }

  function extraProblem() {
    const v = LR.store.settings.extra || "";
    if (!v.trim()) return "";
    try {
      const o = JSON.parse(v);
      if (!o || typeof o !== "object" || Array.isArray(o)) throw new Error("give a JSON object");
      return "";
    } catch (err) {
      return "The extra request fields are not a JSON object: " + err.message;
    }
  }

  // the first setting a request must not carry, in words ("" when all are fine)
  function settingsProblem() {
    for (const k of SAMPLING) {
      const why = samplingProblem(k);
      if (why) return why;
    }
    return extraProblem();
  }

  function showSettingsProblems() {
    for (const k of SAMPLING) $("set-" + k).setAttribute("aria-invalid", samplingProblem(k) ? "true" : "false");
    $("set-error").textContent = settingsProblem();
  }

  function bindSettings() {
    for (const k of SAMPLING) {
      $("set-" + k).addEventListener("input", (e) => {
        LR.store.settings[k] = e.target.value;
        LR.store.saveSettings();
        showSettingsProblems();
      });
    }
    $("set-extra").addEventListener("input", (e) => {
      LR.store.settings.extra = e.target.value;
      LR.store.saveSettings();
      showSettingsProblems();
    });
    $("set-system").addEventListener("input", (e) => {
      const c = LR.chat.state.conv;
      c.system = e.target.value;
      LR.store.persist(c);
    });
    $("btn-forget-key").addEventListener("click", () => sessionStorage.removeItem("localrun.apiKey"));
  }

  // images waiting to go with the next message (data: URLs), for a model that takes images (meta.vision)
  const pending = [];

  function visionModel() {
    const m = LR.models.current();
    return !!(m && m.meta && m.meta.vision);
  }

  function notice(text) {
    $("notice").textContent = text;
    $("notice").hidden = !text;
  }

  function renderPending() {
    const box = $("attachments");
    box.replaceChildren();
    box.hidden = !pending.length;
    pending.forEach((url, i) => {
      const wrap = el("span", "pending");
      const img = el("img", "thumb");
      img.src = url;
      img.alt = "image to send";
      const x = el("button", "mini", "✕");
      x.type = "button";
      x.title = "Remove this image";
      x.addEventListener("click", () => {
        pending.splice(i, 1);
        renderPending();
      });
      wrap.appendChild(img);
      wrap.appendChild(x);
      box.appendChild(wrap);
    });
  }

  function readDataUrl(file) {
    return new Promise((resolve, reject) => {
      const r = new FileReader();
      r.onload = () => resolve(r.result);
      r.onerror = () => reject(r.error);
      r.readAsDataURL(file);
    });
  }

  // → whether `files` held images (taken, or refused with a notice)
  async function addImages(files) {
    const images = Array.from(files || []).filter((f) => f.type.startsWith("image/"));
    if (!images.length) return false;
    if (!visionModel()) {
      notice("This model does not take images: pick one that has its vision projector (mmproj).");
      return true;
    }
    notice("");
    for (const f of images) {
      const url = await readDataUrl(f);
      if (LR.chat.isImage(url)) pending.push(url);
    }
    renderPending();
    return true;
  }

  function sendFromComposer() {
    const input = $("input");
    if (LR.chat.send(input.value, pending)) {
      input.value = "";
      pending.length = 0;
      renderPending();
      notice("");
      autosize();
    }
  }

  function autosize() {
    const t = $("input");
    t.style.height = "auto";
    t.style.height = Math.min(t.scrollHeight, 220) + "px";
  }

  function download(name, data) {
    const blob = new Blob([JSON.stringify(data, null, 2)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const a = el("a");
    a.href = url;
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function exportCurrent() {
    const c = LR.chat.state.conv;
    const m = LR.models.find(c.model || LR.store.settings.model) || LR.models.current();
    const path = m && m.meta ? m.meta.path : "";
    const stem = (c.title || "chat").replace(/[^\w.-]+/g, "-").slice(0, 40) || "chat";
    download(stem + ".json", LR.store.exported(c, path));
  }

  async function importFile(e) {
    const f = e.target.files && e.target.files[0];
    e.target.value = "";
    if (!f) return;
    try {
      LR.chat.open(LR.store.imported(JSON.parse(await f.text()), f.name));
    } catch (err) {
      alert("Could not open " + f.name + ": " + err.message);
    }
  }

  function init() {
    $("btn-sidebar").addEventListener("click", () => document.body.classList.toggle("side-open"));
    $("btn-new").addEventListener("click", () => {
      if (LR.chat.state.busyIdx >= 0) return;
      LR.chat.open(LR.store.create());
      $("input").focus();
    });
    $("btn-models").addEventListener("click", () => openDrawer("models"));
    $("btn-settings").addEventListener("click", () => openDrawer("settings"));
    $("btn-server").addEventListener("click", () => openDrawer("server"));
    $("drawer-close").addEventListener("click", () => closeDrawer());
    // Escape: closes the drawer, else stops the answer being written (the key dialog handles its own)
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape" || e.isComposing || $("key-dialog").open) return;
      if (!$("drawer").hidden) {
        e.preventDefault();
        closeDrawer();
      } else if (LR.chat.state.busyIdx >= 0) {
        e.preventDefault();
        LR.chat.stop();
      }
    });
    $("btn-send").addEventListener("click", sendFromComposer);
    $("btn-stop").addEventListener("click", LR.chat.stop);
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        sendFromComposer();
      }
    });
    $("input").addEventListener("input", autosize);
    $("input").addEventListener("paste", (e) => {
      const files = e.clipboardData && e.clipboardData.files;
      if (files && files.length && Array.from(files).some((f) => f.type.startsWith("image/"))) {
        e.preventDefault();
        addImages(files);
      }
    });
    const chat = document.querySelector(".chat");
    chat.addEventListener("dragover", (e) => e.preventDefault());
    chat.addEventListener("drop", (e) => {
      e.preventDefault();
      addImages(e.dataTransfer && e.dataTransfer.files);
    });
    $("btn-attach").addEventListener("click", () => $("attach-file").click());
    $("attach-file").addEventListener("change", (e) => {
      addImages(e.target.files).finally(() => (e.target.value = ""));
    });
    $("btn-export").addEventListener("click", exportCurrent);
    $("btn-import").addEventListener("click", () => $("import-file").click());
    $("import-file").addEventListener("change", importFile);
    bindSettings();
    LR.models.init();
    LR.chat.open(LR.store.current());
    LR.models.refresh();
    document.body.dataset.ready = "1";
  }

  LR.app = {
    closeDrawer,
    openDrawer,
    notice,
    settingsProblem,
    onModels() {
      $("btn-attach").hidden = !visionModel();
    },
    onConversation() {
      renderConversations();
      if (!$("drawer").hidden && $("drawer").dataset.pane === "settings") fillSettings();
    },
    afterAnswer(conv, idx) {
      renderConversations();
      // the model that answered is resident now: its context size completes the numbers under the answer
      LR.models.refresh().then(() => {
        const m = conv.messages[idx];
        const model = m && m.model ? LR.models.find(m.model) : null;
        if (m && m.stats && model && model.meta && model.meta.n_ctx && LR.chat.state.conv === conv) {
          m.stats.n_ctx = model.meta.n_ctx;
          LR.store.persist(conv);
          LR.chat.renderMessage(idx);
        }
      });
    },
  };

  document.addEventListener("DOMContentLoaded", init);
})();
