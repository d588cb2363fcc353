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
// with fetch and a ReadableStream (server-sent events), then its usage and
// cost. A model that takes images can be sent one (read here into a data:
// URL); a model that takes tools can be offered get_time, which this page
// answers itself and sends back, once, for the model's reply in words.
const pg = document.getElementById("playground");
if (pg) {
  let secret = null;
  let image = null; // the attached image's data: URL
  const $ = (id) => document.getElementById(id);
  const answer = $("pg-answer"), usage = $("pg-usage"), steps = $("pg-steps"), send = $("pg-send");
  const model = $("pg-model"), imageInput = $("pg-image"), preview = $("pg-image-preview"), toolsBox = $("pg-tools");
  const maxImage = 4 << 20;
  const showFields = () => {
    const opt = model.selectedOptions[0];
    $("pg-image-field").hidden = !(opt && "images" in opt.dataset);
    $("pg-tools-field").hidden = !(opt && "tools" in opt.dataset);
  };
  model.addEventListener("change", showFields);
  showFields();
  imageInput.addEventListener("change", () => {
    image = null;
    preview.hidden = true;
    const f = imageInput.files[0];
    if (!f) return;
    if (f.size > maxImage) {
      usage.textContent = "Error: the image is larger than 4 MiB";
      imageInput.value = "";
      return;
    }
    const rd = new FileReader();
    rd.onload = () => { image = rd.result; preview.src = image; preview.hidden = false; };
    rd.readAsDataURL(f);
  });
  // usd writes an amount (a decimal string) by the console's one rule for
  // money: 6 decimals, rounded half away from zero, and the exact amount to
  // the picodollar beside it when the rounding lost digits. BigInt, never a
  // float.
  const usd = (s) => {
    const m = /^(-?)(\d+)(?:\.(\d{1,12}))?$/.exec(String(s));
    if (!m) return s + " USD";
    const frac = (m[3] || "").padEnd(12, "0");
    const pico = BigInt(m[2] + frac);
    const q = (pico + 500000n) / 1000000n;
    const shown = (m[1] && q !== 0n ? "-" : "") + (q / 1000000n).toString() + "." + (q % 1000000n).toString().padStart(6, "0");
    return pico % 1000000n === 0n ? shown + " USD" : shown + " USD (exactly " + m[1] + m[2] + "." + frac + ")";
  };
  const getTimeTool = {
    type: "function",
    function: {
      name: "get_time",
      description: "The current date and time, in UTC and in the user's time zone.",
      parameters: { type: "object", properties: { timezone: { type: "string", description: "An IANA time zone such as Europe/Lisbon; omit for the user's own." } } },
    },
  };
  const getTime = (args) => {
    const now = new Date();
    const own = Intl.DateTimeFormat().resolvedOptions().timeZone;
    const local = (tz) => now.toLocaleString("en-GB", { timeZone: tz, dateStyle: "full", timeStyle: "long" });
    const out = { utc: now.toISOString(), timezone: own };
    const asked = args && typeof args.timezone === "string" ? args.timezone : "";
    if (asked) {
      try {
        out.local = local(asked);
        out.timezone = asked;
        return out;
      } catch {
        out.note = "unknown time zone " + JSON.stringify(asked) + "; the user's own is given";
      }
    }
    out.local = local(own);
    return out;
  };
  const step = (text, code) => {
    const li = document.createElement("li");
    li.textContent = text + " ";
    if (code) {
      const c = document.createElement("code");
      c.textContent = code;
      li.append(c);
    }
    steps.append(li);
  };
  const getKey = async () => {
    if (secret) return secret;
    const r = await fetch("/console/playground/key", { method: "POST", headers: { "X-CSRF-Token": pg.dataset.csrf } });
    if (!r.ok) throw new Error("could not get a playground key (" + r.status + "); sign in again");
    secret = (await r.json()).secret;
    return secret;
  };
  // complete streams one request's answer into the page and returns the
  // assistant's message (content and tool calls) and its usage line.
  const complete = async (body) => {
    const key = $("pg-key").value.trim() || await getKey();
    const resp = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Authorization": "Bearer " + key, "Content-Type": "application/json" },
      body: JSON.stringify(Object.assign(body, { stream: true, stream_options: { include_usage: true } })),
    });
    if (!resp.ok) {
      const b = await resp.json().catch(() => ({}));
      const e = b.error || {};
      throw new Error((e.message || resp.statusText) + (e.code ? " (" + e.code + ")" : ""));
    }
    const backend = resp.headers.get("X-Tollgate-Backend") || "";
    const msg = { role: "assistant", content: "", tool_calls: [] };
    let line = "";
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const l = buf.slice(0, nl).trim();
        buf = buf.slice(nl + 1);
        if (!l.startsWith("data:")) continue;
        const data = l.slice(5).trim();
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message + " (" + chunk.error.code + ")");
        for (const c of chunk.choices || []) {
          const d = c.delta || {};
          if (d.content) { answer.textContent += d.content; msg.content += d.content; }
          for (const tc of d.tool_calls || []) {
            const i = tc.index || 0;
            const t = msg.tool_calls[i] || (msg.tool_calls[i] = { id: "", type: "function", function: { name: "", arguments: "" } });
            if (tc.id) t.id = tc.id;
            if (tc.function && tc.function.name) t.function.name += tc.function.name;
            if (tc.function && tc.function.arguments) t.function.arguments += tc.function.arguments;
          }
        }
        if (chunk.usage) {
          const u = chunk.usage;
          line = u.prompt_tokens + " prompt + " + u.completion_tokens + " completion tokens" +
            (u.cost ? " · cost " + usd(u.cost) : "") + (backend ? " · served by the " + backend + " backend" : "");
        }
      }
    }
    msg.tool_calls = msg.tool_calls.filter(Boolean);
    return { msg, line };
  };
  pg.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    send.disabled = true;
    answer.textContent = "";
    usage.textContent = "";
    steps.textContent = "";
    const opt = model.selectedOptions[0];
    const text = $("pg-message").value;
    const withImage = image && opt && "images" in opt.dataset;
    const withTools = toolsBox.checked && opt && "tools" in opt.dataset;
    const user = withImage
      ? { role: "user", content: [{ type: "text", text: text }, { type: "image_url", image_url: { url: image } }] }
      : { role: "user", content: text };
    const messages = [user];
    const lines = [];
    try {
      const body = { model: model.value, messages: messages };
      if (withTools) body.tools = [getTimeTool];
      const first = await complete(body);
      lines.push(first.line);
      if (first.msg.tool_calls.length) {
        if (!first.msg.content) first.msg.content = null;
        messages.push(first.msg);
        for (const tc of first.msg.tool_calls) {
          let args = {};
          try { args = JSON.parse(tc.function.arguments || "{}"); } catch { /* answered as no arguments */ }
          const result = tc.function.name === "get_time" ? getTime(args) : { error: "no tool " + tc.function.name };
          step("The model called " + tc.function.name + " with", tc.function.arguments || "{}");
          step("This page answered", JSON.stringify(result));
          messages.push({ role: "tool", tool_call_id: tc.id, content: JSON.stringify(result) });
        }
        // One round of tools: the reply is asked for in words.
        const second = await complete({ model: model.value, messages: messages, tools: [getTimeTool], tool_choice: "none" });
        lines.push(second.line);
      }
      usage.textContent = lines.length > 1
        ? lines.map((l, i) => "Request " + (i + 1) + ": " + l).join(" — ")
        : lines[0];
    } catch (err) {
      usage.textContent = "Error: " + err.message;
    } finally {
      send.disabled = false;
    }
  });
}
