// The page's wiring: the conversation list, the composer (images pasted, dropped or picked for a model that
// takes them), the drawer (models, settings, server), export and import, and the start-up.
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

  function openDrawer(which) {
    const d = $("drawer");
    const same = !d.hidden && d.dataset.pane === which;
    closeDrawer();
    if (same) return;
    d.hidden = false;
    d.dataset.pane = which;
    $("pane-" + which).hidden = false;
    $("drawer-title").textContent = { models: "Models", settings: "Settings", server: "Server" }[which];
    document.body.classList.add("drawer-open");
    $({ models: "btn-models", settings: "btn-settings", server: "btn-server" }[which]).setAttribute("aria-pressed", "true");
    if (which === "models") LR.models.refresh();
    if (which === "server") LR.panel.start();
    if (which === "settings") fillSettings();
  }

  function closeDrawer() {
    const d = $("drawer");
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
    $("set-error").textContent = "";
  }

  function bindSettings() {
    for (const k of SAMPLING) {
      $("set-" + k).addEventListener("input", (e) => {
        LR.store.settings[k] = e.target.value;
        LR.store.saveSettings();
      });
    }
    $("set-extra").addEventListener("input", (e) => {
      const v = e.target.value;
      try {
        if (v.trim()) {
          const o = JSON.parse(v);
          if (!o || typeof o !== "object" || Array.isArray(o)) throw new Error("give a JSON object");
        }
        $("set-error").textContent = "";
      } catch (err) {
        $("set-error").textContent = "Not a JSON object yet: " + err.message;
      }
      LR.store.settings.extra = v;
      LR.store.saveSettings();
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
    $("drawer-close").addEventListener("click", closeDrawer);
    document.addEventListener("keydown", (e) => {
      if (e.key === "Escape" && !$("drawer").hidden && !$("key-dialog").open) closeDrawer();
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
    $("attach-file").addEventListener("change", (e) => {
      addImages(e.target.files).finally(() => (e.target.value = ""));
    });
    $("btn-export").addEventListener("click", exportCurrent);
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
    onModels() {
      $("btn-attach").hidden = !visionModel();
    },
    onConversation() {
      renderConversations();
      if (!$("drawer").hidden && $("drawer").dataset.pane === "settings") fillSettings();
    },
    afterAnswer(conv, idx) {
      renderConversations();
      // the model is resident now: its context size completes the numbers under the answer
      LR.models.refresh().then(() => {
        const m = conv.messages[idx];
        const model = LR.models.current();
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
