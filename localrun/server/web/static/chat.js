// The conversation: messages as DOM nodes (assistant text through LR.md, user text as plain text), streaming
// from /v1/chat/completions (SSE, stream_options.include_usage for the token counts), thinking folded as
// "Thought for N s", Stop (aborts the fetch: the server cancels the sequence when the client goes away),
// edit-and-resend, regenerate, images (OpenAI image_url parts, for a model that takes them), and the numbers
// under each answer (the model that answered, TTFT, tok/s, tokens, context, cache). Each request names its
// model (the header's: LR.models.current()); an answer that failed is kept on screen but left out of the
// next requests with the question it answered, so the model never sees two user turns in a row.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const $ = (id) => document.getElementById(id);
  const state = { conv: null, controller: null, busyIdx: -1 };
  const FOLD_CHARS = 3000; // a user message longer than this is shown folded

  const el = LR.el;

  function button(label, title, onClick) {
    const b = el("button", "mini", label);
    b.type = "button";
    b.title = title;
    b.addEventListener("click", onClick);
    return b;
  }

  function fmt(n, digits) {
    return Number(n).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 1 : digits });
  }

  // the line of numbers under an answer
  function statsText(s) {
    if (!s) return "";
    const parts = [];
    if (s.ttft_s !== undefined) parts.push("TTFT " + fmt(s.ttft_s, 2) + " s");
    if (s.tok_s) parts.push(fmt(s.tok_s) + " tok/s");
    if (s.completion_tokens !== undefined) parts.push(s.prompt_tokens + " + " + s.completion_tokens + " tokens");
    if (s.n_ctx && typeof s.prompt_tokens === "number" && typeof s.completion_tokens === "number")
      parts.push("context " + fmt(s.prompt_tokens + s.completion_tokens, 0) + " / " + fmt(s.n_ctx, 0));
    if (s.prompt_tokens) parts.push("cache " + (s.cached_tokens || 0) + "/" + s.prompt_tokens + " reused");
    if (s.finish === "length") parts.push("cut at max tokens");
    return parts.join(" · ");
  }

  function thinkingLabel(m, live) {
    if (live && !m.thinking_s) return "Thinking…";
    return "Thought for " + fmt(m.thinking_s || 0, m.thinking_s < 10 ? 1 : 0) + " s";
  }

  // (re)builds the node of message `idx`
  function renderMessage(idx) {
    const m = state.conv.messages[idx];
    const live = idx === state.busyIdx;
    const node = el("div", "msg " + m.role);
    node.dataset.idx = idx;
    node.dataset.state = live ? "streaming" : m.error ? "error" : m.stopped ? "stopped" : "done";
    const bubble = el("div", "bubble");
    if (m.role === "assistant" && m.thinking) {
      const d = el("details", "thinking");
      const prev = document.querySelector('.msg[data-idx="' + idx + '"] details.thinking');
      d.open = prev ? prev.open : false;
      d.appendChild(el("summary", null, thinkingLabel(m, live)));
      d.appendChild(el("div", "thinking-body", m.thinking));
      bubble.appendChild(d);
    }
    const content = el("div", "content");
    if (m.role === "assistant") LR.md.renderInto(content, m.content);
    else if (m.content.length > FOLD_CHARS && !m.unfolded) {
      // a long paste is shown folded (it is sent whole): its start, its size and a button to show all
      content.textContent = m.content.slice(0, FOLD_CHARS) + "…";
      content.appendChild(el("br"));
      content.appendChild(button("Show all " + m.content.length.toLocaleString() + " characters",
        "Show the whole message", () => {
          m.unfolded = true;
          renderMessage(idx);
        }));
    } else content.textContent = m.content;
    if (m.images && m.images.length) {
      const row = el("div", "thumbs");
      for (const url of m.images.filter(isImage)) {
        const img = el("img", "thumb");
        img.src = url;
        img.alt = "attached image";
        row.appendChild(img);
      }
      bubble.appendChild(row);
    }
    bubble.appendChild(content);
    if (live && !m.content && !m.thinking) bubble.appendChild(el("span", "cursor", "…"));
    if (m.error) {
      bubble.appendChild(el("p", "error", m.error));
      if (m.role === "assistant" && !live)
        bubble.appendChild(el("p", "muted", "This answer and its question are left out of what the next question sends."));
    }
    if (m.stopped) bubble.appendChild(el("p", "muted", "Stopped."));
    node.appendChild(bubble);
    const meta = el("div", "meta");
    if (m.role === "assistant" && m.model) {
      const tag = el("span", "model-tag", m.model);
      tag.title = "the model that answered";
      meta.appendChild(tag);
    }
    if (m.role === "assistant" && m.stats) meta.appendChild(el("span", "stats", statsText(m.stats)));
    if (!live && state.busyIdx < 0) {
      const last = idx === state.conv.messages.length - 1;
      if (m.role === "user") meta.appendChild(button("Edit", "Edit and send again", () => edit(idx)));
      if (m.role === "assistant" && last) meta.appendChild(button("Regenerate", "Answer again", regenerate));
      meta.appendChild(button("Copy", "Copy the text", () => navigator.clipboard && navigator.clipboard.writeText(m.content)));
    }
    node.appendChild(meta);
    const old = $("messages").querySelector('.msg[data-idx="' + idx + '"]');
    if (old) old.replaceWith(node);
    else $("messages").appendChild(node);
    return node;
  }

  function renderAll() {
    const box = $("messages");
    box.querySelectorAll(".msg").forEach((n) => n.remove());
    $("empty").hidden = state.conv.messages.length > 0;
    state.conv.messages.forEach((_, i) => renderMessage(i));
    box.scrollTop = box.scrollHeight;
  }

  function open(conv) {
    // an answer the page was streaming when it was closed or reloaded: keep what arrived, marked stopped
    for (const m of conv.messages) {
      if (m.pending && state.busyIdx < 0) {
        delete m.pending;
        m.stopped = true;
      }
    }
    state.conv = conv;
    LR.store.setCurrent(conv);
    renderAll();
    LR.app && LR.app.onConversation(conv);
  }

  function setBusy(idx) {
    state.busyIdx = idx;
    $("btn-send").hidden = idx >= 0;
    $("btn-stop").hidden = idx < 0;
    document.body.classList.toggle("busy", idx >= 0);
  }

  // message i failed, or is the question of an answer that failed: not sent again
  function failed(msgs, i) {
    const next = msgs[i + 1];
    return !!(msgs[i].error || (msgs[i].role === "user" && next && next.role === "assistant" && next.error));
  }

  // the request body: the conversation up to (not with) message `upto` (less the failed exchanges), the
  // model, the settings, the extra fields
  function body(upto) {
    const s = LR.store.settings;
    const msgs = [];
    if (state.conv.system) msgs.push({ role: "system", content: state.conv.system });
    const upTo = state.conv.messages.slice(0, upto);
    for (const [i, m] of upTo.entries()) {
      if (failed(upTo, i)) continue;
      const images = (m.images || []).filter(isImage);
      msgs.push({ role: m.role, content: images.length ? [{ type: "text", text: m.content }]
        .concat(images.map((url) => ({ type: "image_url", image_url: { url } }))) : m.content });
    }
    const b = { messages: msgs, stream: true, stream_options: { include_usage: true } };
    const model = LR.models.current();
    if (model) b.model = model.id;
    for (const k of ["temperature", "top_p", "max_tokens", "seed"]) {
      if (s[k] !== "" && s[k] !== null && s[k] !== undefined && !isNaN(Number(s[k]))) b[k] = Number(s[k]);
    }
    if (s.extra && s.extra.trim()) Object.assign(b, JSON.parse(s.extra));
    return b;
  }

  // streams an answer into message `idx` (an empty assistant message)
  async function generate(idx) {
    const m = state.conv.messages[idx];
    const box = $("messages");
    let req;
    try {
      req = body(idx);
    } catch (e) {
      m.error = "The extra request fields are not valid JSON: " + e.message;
      renderMessage(idx);
      return;
    }
    state.controller = new AbortController();
    setBusy(idx);
    renderMessage(idx);
    const t0 = performance.now();
    let tFirst = 0, tThink = 0, tLast = 0, usage = null, finish = null, frame = 0, ended = false;
    const redraw = () => {
      if (frame) return;
      frame = requestAnimationFrame(() => {
        frame = 0;
        const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
        renderMessage(idx);
        if (stick) box.scrollTop = box.scrollHeight;
      });
    };
    try {
      const resp = await LR.api.request("/v1/chat/completions", { method: "POST", body: JSON.stringify(req),
        headers: { "Content-Type": "application/json" }, signal: state.controller.signal });
      ended = await LR.api.sse(resp, (ev) => {
        if (ev.error) throw new Error(ev.error.message || String(ev.error));
        if (ev.model && !m.model) m.model = ev.model;
        if (ev.usage) usage = ev.usage;
        const ch = ev.choices && ev.choices[0];
        if (!ch) return;
        if (ch.finish_reason) finish = ch.finish_reason;
        const d = ch.delta || {};
        const think = d.reasoning_content || "";
        const text = d.content || "";
        if (!think && !text) return;
        const now = performance.now();
        if (!tFirst) tFirst = now;
        tLast = now;
        if (think) {
          if (!tThink) tThink = now;
          m.thinking = (m.thinking || "") + think;
        }
        if (text) {
          if (tThink && !m.thinking_s) m.thinking_s = (now - tThink) / 1000;
          m.content += text;
        }
        redraw();
      });
      if (!ended) throw new LR.api.Dropped(); // the body ended without [DONE]
    } catch (e) {
      if (e.name === "AbortError") m.stopped = true;
      else m.error = e.message || String(e);
      if (e instanceof LR.api.Unreachable || e instanceof LR.api.Dropped) LR.models.refresh();
    } finally {
      if (frame) cancelAnimationFrame(frame);
      state.controller = null;
      if (tThink && !m.thinking_s) m.thinking_s = ((tLast || performance.now()) - tThink) / 1000;
      if (tFirst) {
        m.stats = { ttft_s: (tFirst - t0) / 1000, finish: finish || undefined };
        if (usage) {
          Object.assign(m.stats, { prompt_tokens: usage.prompt_tokens, completion_tokens: usage.completion_tokens,
            cached_tokens: (usage.prompt_tokens_details || {}).cached_tokens || 0 });
          if (usage.completion_tokens > 1 && tLast > tFirst)
            m.stats.tok_s = (usage.completion_tokens - 1) / ((tLast - tFirst) / 1000);
        }
      }
      delete m.pending;
      setBusy(-1);
      LR.store.persist(state.conv);
      renderAll();
      LR.app && LR.app.afterAnswer(state.conv, idx);
    }
  }

  // only images the page read itself (data: URLs of an image type) are shown or sent
  function isImage(url) {
    return typeof url === "string" && /^data:image\/(png|jpeg|gif|webp|bmp);base64,/.test(url);
  }

  // a setting the server would refuse (LR.app.settingsProblem): said in the notice, nothing is sent
  function refused() {
    const why = LR.app && LR.app.settingsProblem();
    if (why) LR.app.notice(why + " Change it in Settings.");
    return !!why;
  }

  function send(text, images) {
    if (state.busyIdx >= 0 || !text.trim() || refused()) return false;
    const c = state.conv;
    const model = LR.models.current();
    c.model = model ? model.id : c.model;
    const m = { role: "user", content: text };
    if (images && images.length) m.images = images.slice();
    c.messages.push(m);
    c.messages.push({ role: "assistant", content: "", pending: true });
    LR.store.persist(c);
    renderAll();
    LR.app && LR.app.onConversation(c);
    generate(c.messages.length - 1);
    return true;
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function regenerate() {
    const c = state.conv;
    if (state.busyIdx >= 0 || !c.messages.length || refused()) return;
    if (c.messages[c.messages.length - 1].role === "assistant") c.messages.pop();
    c.messages.push({ role: "assistant", content: "", pending: true });
    renderAll();
    generate(c.messages.length - 1);
  }

  // turns user message `idx` into an editor; sending drops what followed it and asks again
  function edit(idx) {
    const node = $("messages").querySelector('.msg[data-idx="' + idx + '"]');
    const m = state.conv.messages[idx];
    const box = el("div", "editor");
    const ta = el("textarea");
    ta.value = m.content;
    ta.rows = Math.min(10, m.content.split("\n").length + 1);
    const row = el("div", "row end");
    row.appendChild(button("Cancel", "Keep the message as it was", () => renderMessage(idx)));
    const go = button("Send", "Send the edited message", () => {
      if (refused()) return;
      const c = state.conv;
      c.messages = c.messages.slice(0, idx);
      c.messages.push(Object.assign({}, m, { content: ta.value }));
      c.messages.push({ role: "assistant", content: "", pending: true });
      LR.store.persist(c); // an edit of the first message retitles the conversation
      renderAll();
      LR.app && LR.app.onConversation(c);
      generate(c.messages.length - 1);
    });
    go.classList.add("primary");
    row.appendChild(go);
    box.appendChild(ta);
    box.appendChild(row);
    node.querySelector(".bubble").replaceWith(box);
    ta.focus();
  }

  LR.chat = { open, send, stop, regenerate, edit, renderAll, renderMessage, statsText, state, isImage };
})();
