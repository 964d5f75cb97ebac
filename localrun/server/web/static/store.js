// What the page keeps in the browser's localStorage: the conversations (each {id, title, model, system,
// messages: [{role, content, thinking?, thinking_s?, stats?, stopped?, error?}], updated_ms}), the current
// one's id, and the settings (sampling, extra fields, the chosen model). Export writes the shape that
// `localrun chat`'s /save writes: {"format": "localrun-chat/1", "model", "system", "messages"}.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const K_CONVS = "localrun.conversations.v1";
  const K_CURRENT = "localrun.current.v1";
  const K_SETTINGS = "localrun.settings.v1";
  const DEFAULT_SYSTEM = "You are a helpful assistant.";

  function load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v === null ? fallback : v;
    } catch (e) {
      return fallback;
    }
  }

  function save(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      console.warn("localStorage is full or off: the conversation is not kept", e);
    }
  }

  const convs = load(K_CONVS, {});
  const settings = Object.assign({ temperature: "", top_p: "", max_tokens: "", seed: "", extra: "", model: "" },
    load(K_SETTINGS, {}));

  function newId() {
    return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  }

  function create(system) {
    const c = { id: newId(), title: "New chat", model: settings.model || "", system: system === undefined ? DEFAULT_SYSTEM : system,
      messages: [], updated_ms: Date.now() };
    convs[c.id] = c;
    persist(c);
    return c;
  }

  // a conversation's title: its first message's opening words (it follows an edit of that message)
  function title(c) {
    const first = c.messages.find((m) => m.role === "user");
    return (first && first.content.replace(/\s+/g, " ").trim().slice(0, 60)) || "New chat";
  }

  function persist(c) {
    if (c) {
      c.updated_ms = Date.now();
      c.title = title(c);
    }
    save(K_CONVS, convs);
  }

  function remove(id) {
    delete convs[id];
    persist();
  }

  function list() {
    return Object.values(convs).sort((a, b) => b.updated_ms - a.updated_ms);
  }

  function current() {
    const id = localStorage.getItem(K_CURRENT);
    return (id && convs[id]) || list()[0] || create();
  }

  function setCurrent(c) {
    localStorage.setItem(K_CURRENT, c.id);
  }

  function saveSettings() {
    save(K_SETTINGS, settings);
  }

  // the conversation in `chat /save`'s shape (model: the file's path when the server told it, else its name)
  function exported(c, modelPath) {
    return {
      format: "localrun-chat/1",
      model: modelPath || c.model || "",
      system: c.system,
      messages: c.messages.filter((m) => !m.error).map((m) => {
        const d = { role: m.role, content: m.content };
        if (m.thinking) d.thinking = m.thinking;
        return d;
      }),
    };
  }

  // a saved chat (or a plain list of messages) → a new conversation; throws Error for another shape
  function imported(data, name) {
    const raw = Array.isArray(data) ? data : data && data.messages;
    if (!Array.isArray(raw)) throw new Error("no 'messages' list in " + name);
    let system = data && typeof data.system === "string" ? data.system : DEFAULT_SYSTEM;
    const msgs = [];
    for (const m of raw) {
      if (!m || !["system", "user", "assistant"].includes(m.role) || typeof m.content !== "string")
        throw new Error(name + ": each message needs a role (system/user/assistant) and text content");
      if (m.role === "system") system = m.content;
      else {
        const d = { role: m.role, content: m.content };
        const t = typeof m.thinking === "string" ? m.thinking : m.reasoning_content;
        if (typeof t === "string" && t) d.thinking = t;
        msgs.push(d);
      }
    }
    const c = create(system);
    c.messages = msgs;
    c.title = "New chat";
    persist(c);
    return c;
  }

  LR.store = { create, persist, remove, list, current, setCurrent, settings, saveSettings, exported, imported,
    DEFAULT_SYSTEM };
})();
