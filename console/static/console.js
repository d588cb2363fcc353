// tollgate console: the copy buttons. Everything else works without script.
"use strict";
document.addEventListener("click", async (ev) => {
  const btn = ev.target.closest("button[data-copy]");
  if (!btn) return;
  const src = document.getElementById(btn.dataset.copy);
  if (!src) return;
  const text = src.textContent.trim();
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // Older browsers, or a page not served over https: select the text instead.
    const range = document.createRange();
    range.selectNodeContents(src);
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
    document.execCommand && document.execCommand("copy");
  }
  const label = btn.textContent;
  btn.textContent = "Copied";
  setTimeout(() => { btn.textContent = label; }, 1500);
});
for (const btn of document.querySelectorAll("button[data-copy]")) btn.hidden = false;
