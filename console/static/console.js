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

// The playground: a streamed chat completion through the public API, read
// with fetch and a ReadableStream (server-sent events), then its usage and cost.
const pg = document.getElementById("playground");
if (pg) {
  let secret = null;
  const answer = document.getElementById("pg-answer");
  const usage = document.getElementById("pg-usage");
  const send = document.getElementById("pg-send");
  const getKey = async () => {
    if (secret) return secret;
    const r = await fetch("/console/playground/key", { method: "POST", headers: { "X-CSRF-Token": pg.dataset.csrf } });
    if (!r.ok) throw new Error("could not get a playground key (" + r.status + "); sign in again");
    secret = (await r.json()).secret;
    return secret;
  };
  pg.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    send.disabled = true;
    answer.textContent = "";
    usage.textContent = "";
    try {
      const key = await getKey();
      const resp = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Authorization": "Bearer " + key, "Content-Type": "application/json" },
        body: JSON.stringify({
          model: document.getElementById("pg-model").value,
          messages: [{ role: "user", content: document.getElementById("pg-message").value }],
          stream: true, stream_options: { include_usage: true },
        }),
      });
      if (!resp.ok) {
        const body = await resp.json().catch(() => ({}));
        const e = body.error || {};
        throw new Error((e.message || resp.statusText) + (e.code ? " (" + e.code + ")" : ""));
      }
      const backend = resp.headers.get("X-Tollgate-Backend") || "";
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message + " (" + chunk.error.code + ")");
          for (const c of chunk.choices || []) {
            if (c.delta && c.delta.content) answer.textContent += c.delta.content;
          }
          if (chunk.usage) {
            const u = chunk.usage;
            usage.textContent = u.prompt_tokens + " prompt + " + u.completion_tokens + " completion tokens" +
              (u.cost ? " · cost " + u.cost + " USD" : "") + (backend ? " · served by the " + backend + " backend" : "");
            usage.dataset.cost = u.cost || "";
          }
        }
      }
    } catch (err) {
      usage.textContent = "Error: " + err.message;
    } finally {
      send.disabled = false;
    }
  });
}
