// Requests to the page's own server (same origin only; the CSP's connect-src 'self' enforces it), with the
// API key when the server has one: asked once (a 401 opens the key dialog), kept in sessionStorage, sent
// as "Authorization: Bearer <key>". Streams: Server-Sent Events (OpenAI) and NDJSON (Ollama's pull).
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});
  const KEY = "localrun.apiKey";
  let asking = null; // the open key dialog's promise: requests that meet a 401 meanwhile wait for it

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const key = sessionStorage.getItem(KEY);
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function askKey(message) {
    if (asking) return asking;
    const dlg = document.getElementById("key-dialog");
    const input = document.getElementById("key-input");
    const msg = document.getElementById("key-message");
    msg.textContent = message || "This server needs an API key.";
    input.value = "";
    asking = new Promise((resolve) => {
      const okBtn = document.getElementById("key-save");
      const noBtn = document.getElementById("key-cancel");
      const finish = (saved) => {
        okBtn.onclick = noBtn.onclick = input.onkeydown = dlg.oncancel = null;
        if (dlg.open) dlg.close();
        asking = null;
        resolve(saved);
      };
      okBtn.onclick = () => {
        const v = input.value.trim();
        if (v) sessionStorage.setItem(KEY, v);
        finish(!!v);
      };
      noBtn.onclick = () => finish(false);
      dlg.oncancel = () => finish(false);
      input.onkeydown = (e) => {
        if (e.key === "Enter") okBtn.onclick();
      };
      dlg.showModal();
      input.focus();
    });
    return asking;
  }

  // fetch(path) with the key; a 401 asks for the key and tries once more. Throws Unreachable when no answer
  // came, ApiError for other errors (the server's message) unless opts.raw.
  async function request(path, opts) {
    opts = Object.assign({}, opts || {});
    const raw = opts.raw;
    delete opts.raw;
    for (let attempt = 0; ; attempt++) {
      const init = Object.assign({}, opts, { headers: headers(opts.headers) });
      let resp;
      try {
        resp = await fetch(path, init);
      } catch (e) {
        if (e.name === "AbortError") throw e;
        throw new Unreachable();
      }
      if (resp.status === 401 && attempt < 2) {
        const had = !!sessionStorage.getItem(KEY);
        sessionStorage.removeItem(KEY);
        if (await askKey(had ? "That key was refused. Enter the server's API key." : null)) continue;
      }
      if (!resp.ok && !raw) throw await ApiError.from(resp);
      return resp;
    }
  }

  // the browser got no answer at all (fetch's "Failed to fetch"): the server is down or the network is
  class Unreachable extends Error {
    constructor() {
      super("The server at " + location.host + " is not answering: is `localrun serve` still running?");
      this.name = "Unreachable";
    }
  }

  // the connection broke while the answer's body was coming
  class Dropped extends Error {
    constructor() {
      super("The connection to the server dropped before the answer finished.");
      this.name = "Dropped";
    }
  }

  class ApiError extends Error {
    static async from(resp) {
      let msg = resp.status + " " + resp.statusText;
      try {
        const body = await resp.json();
        const e = body.error;
        msg = typeof e === "string" ? e : (e && e.message) || msg;
      } catch (err) {
        /* not JSON */
      }
      const out = new ApiError(msg);
      out.status = resp.status;
      return out;
    }
  }

  async function json(path, body, opts) {
    const init = Object.assign({}, opts || {});
    if (body !== undefined) {
      init.method = init.method || "POST";
      init.body = JSON.stringify(body);
      init.headers = Object.assign({ "Content-Type": "application/json" }, init.headers || {});
    }
    const resp = await request(path, init);
    return resp.json();
  }

  // reads `resp`'s body as lines, calling onLine(line) for each complete one; throws Dropped when the
  // connection breaks mid-body
  async function lines(resp, onLine) {
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (e.name === "AbortError") throw e;
        throw new Dropped();
      }
      const { value, done } = chunk;
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        onLine(line);
      }
    }
    if (buf) onLine(buf);
  }

  // Server-Sent Events: onData(object) for each "data:" event but [DONE]; → whether [DONE] came (false: the
  // stream ended early, e.g. the connection dropped)
  async function sse(resp, onData) {
    let done = false;
    await lines(resp, (line) => {
      if (!line.startsWith("data:")) return;
      const data = line.slice(5).trim();
      if (data === "[DONE]") done = true;
      else if (data) onData(JSON.parse(data));
    });
    return done;
  }

  function ndjson(resp, onObj) {
    return lines(resp, (line) => {
      if (line.trim()) onObj(JSON.parse(line));
    });
  }

  // Prometheus text → {name: [{labels, value}]}
  function prometheus(text) {
    const out = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      (m[3] || "").replace(/(\w+)="((?:[^"\\]|\\.)*)"/g, (_, k, v) => (labels[k] = v));
      (out[m[1]] = out[m[1]] || []).push({ labels, value: parseFloat(m[4]) });
    }
    return out;
  }

  LR.api = { request, json, sse, ndjson, prometheus, askKey, ApiError, Unreachable, Dropped };
})();
