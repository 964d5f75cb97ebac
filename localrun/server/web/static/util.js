// Helpers every script of the page shares (loaded first): DOM elements with text set as text, byte sizes.
"use strict";
(function () {
  const LR = (window.LR = window.LR || {});

  // <tag class=cls>text</tag>; text goes in through textContent, never as HTML
  LR.el = function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // bytes → "93.8 MiB" (binary units; whole bytes below 1 KiB)
  LR.size = function size(bytes) {
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    bytes = bytes || 0;
    while (bytes >= 1024 && i < u.length - 1) {
      bytes /= 1024;
      i++;
    }
    return (i ? bytes.toFixed(1) : bytes) + " " + u[i];
  };
})();
