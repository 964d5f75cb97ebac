// A small Markdown subset rendered as DOM nodes, never as an HTML string: every piece of model text reaches
// the page through createTextNode / textContent, so a "<script>" in an answer shows as text and runs nothing.
// Blocks: fenced code (```lang), headings (#..######), lists (-, *, +, 1.), block quotes (>), rules (---),
// paragraphs. Inline: `code`, **bold**, *italic* / _italic_, ~~strike~~, [text](http(s) URL), bare URLs.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});

  const el = LR.el;

  // links only to http(s): a "javascript:" or "data:" URL in model text stays text
  function safeUrl(u) {
    try {
      const url = new URL(u, window.location.href);
      return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
    } catch (e) {
      return null;
    }
  }

  const INLINE = [
    { re: /`([^`\n]+)`/, make: (m) => el("code", null, m[1]) },
    { re: /\*\*([^*\n](?:[^\n]*?[^*\n])?)\*\*/, make: (m) => wrap("strong", m[1]) },
    { re: /__([^_\n](?:[^\n]*?[^_\n])?)__/, make: (m) => wrap("strong", m[1]) },
    { re: /~~([^~\n]+)~~/, make: (m) => wrap("del", m[1]) },
    { re: /\*([^*\s](?:[^*\n]*[^*\s])?)\*/, make: (m) => wrap("em", m[1]) },
    { re: /(^|[^\w])_([^_\s](?:[^_\n]*[^_\s])?)_(?!\w)/, make: (m) => [document.createTextNode(m[1]), wrap("em", m[2])] },
    { re: /\[([^\]\n]+)\]\(([^)\s]+)\)/, make: (m) => link(m[1], m[2]) },
    { re: /\bhttps?:\/\/[^\s<>()]+[^\s<>().,;:!?'"]/, make: (m) => link(m[0], m[0]) },
  ];

  function wrap(tag, text) {
    const e = el(tag);
    inline(e, text);
    return e;
  }

  function link(text, href) {
    const url = safeUrl(href);
    if (!url) return document.createTextNode(text + " (" + href + ")");
    const a = el("a", null, text);
    a.href = url;
    a.rel = "noopener noreferrer nofollow";
    a.target = "_blank";
    return a;
  }

  // appends `text` to `parent`, the earliest inline match first (ties: the order of INLINE)
  function inline(parent, text) {
    while (text) {
      let best = null;
      for (const rule of INLINE) {
        const m = rule.re.exec(text);
        if (m && (best === null || m.index < best.m.index)) best = { m, rule };
      }
      if (!best) {
        parent.appendChild(document.createTextNode(text));
        return;
      }
      if (best.m.index > 0) parent.appendChild(document.createTextNode(text.slice(0, best.m.index)));
      const made = best.rule.make(best.m);
      for (const n of Array.isArray(made) ? made : [made]) parent.appendChild(n);
      text = text.slice(best.m.index + best.m[0].length);
    }
  }

  function codeBlock(lang, lines) {
    const wrapEl = el("div", "code");
    const bar = el("div", "code-bar");
    bar.appendChild(el("span", "code-lang", lang || "text"));
    const copy = el("button", "code-copy", "Copy");
    copy.type = "button";
    const code = el("code", null, lines.join("\n"));
    copy.addEventListener("click", () => {
      if (navigator.clipboard) navigator.clipboard.writeText(code.textContent).then(() => (copy.textContent = "Copied"), () => {});
    });
    bar.appendChild(copy);
    const pre = el("pre");
    pre.appendChild(code);
    wrapEl.appendChild(bar);
    wrapEl.appendChild(pre);
    return wrapEl;
  }

  const RE_FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)\s*$/;
  const RE_HEAD = /^(#{1,6})\s+(.*)$/;
  const RE_UL = /^(\s*)[-*+]\s+(.*)$/;
  const RE_OL = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
  const RE_HR = /^\s*([-*_])(\s*\1){2,}\s*$/;
  const RE_QUOTE = /^\s*>\s?(.*)$/;

  // `text` → a DocumentFragment of the blocks; an unclosed fence (a streaming answer) is a code block so far
  function render(text) {
    const frag = document.createDocumentFragment();
    const lines = String(text || "").replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    let para = [];
    const flush = () => {
      if (!para.length) return;
      const p = el("p");
      para.forEach((ln, k) => {
        if (k) p.appendChild(el("br"));
        inline(p, ln);
      });
      frag.appendChild(p);
      para = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = RE_FENCE.exec(line))) {
        flush();
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(m[1]) && RE_FENCE.test(lines[i]))) body.push(lines[i++]);
        i++;
        frag.appendChild(codeBlock(m[2], body));
        continue;
      }
      if (!line.trim()) {
        flush();
        i++;
        continue;
      }
      if ((m = RE_HEAD.exec(line))) {
        flush();
        frag.appendChild(wrap("h" + Math.min(6, m[1].length + 2), m[2]));
        i++;
        continue;
      }
      if (RE_HR.test(line) && !para.length) {
        frag.appendChild(el("hr"));
        i++;
        continue;
      }
      if (RE_QUOTE.test(line)) {
        flush();
        const body = [];
        while (i < lines.length && (m = RE_QUOTE.exec(lines[i]))) {
          body.push(m[1]);
          i++;
        }
        const q = el("blockquote");
        q.appendChild(render(body.join("\n")));
        frag.appendChild(q);
        continue;
      }
      if (RE_UL.test(line) || RE_OL.test(line)) {
        flush();
        const ordered = !RE_UL.test(line);
        const list = el(ordered ? "ol" : "ul");
        if (ordered) {
          const start = parseInt(RE_OL.exec(line)[2], 10);
          if (start !== 1) list.start = start;
        }
        let item = null;
        while (i < lines.length) {
          const ln = lines[i];
          const mm = ordered ? RE_OL.exec(ln) : RE_UL.exec(ln);
          if (mm && mm[1].length < 2) {
            item = el("li");
            inline(item, ordered ? mm[3] : mm[2]);
            list.appendChild(item);
          } else if (item && ln.trim() && /^\s+/.test(ln)) {
            item.appendChild(el("br"));
            inline(item, ln.trim().replace(/^[-*+]\s+/, "• "));
          } else break;
          i++;
        }
        frag.appendChild(list);
        continue;
      }
      para.push(line);
      i++;
    }
    flush();
    return frag;
  }

  // replaces the children of `node` with `text` rendered
  function renderInto(node, text) {
    node.replaceChildren(render(text));
  }

  LR.md = { render, renderInto, safeUrl };
})();
