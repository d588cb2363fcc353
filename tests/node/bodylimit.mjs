// A 9 MiB request body through Node's own fetch, with a declared length
// and chunked, then a small request: prints what each got, as JSON
// (cmd/tollgate's TestBodyLimitNodeFetch checks it).
const url = process.env.OPENAI_BASE_URL + "/chat/completions";
const headers = { Authorization: "Bearer " + process.env.OPENAI_API_KEY, "Content-Type": "application/json" };
const head = '{"model":"flav-vllm","messages":[{"role":"user","content":"hi"}],"x_pad":"';
const body = Buffer.from(head + "a".repeat(9 * 1024 * 1024 - head.length - 2) + '"}');

function chunked() {
  let i = 0;
  return new ReadableStream({
    pull(c) {
      if (i >= body.length) return c.close();
      c.enqueue(body.subarray(i, i + 65536));
      i += 65536;
    },
  });
}

async function post(b, extra) {
  try {
    const r = await fetch(url, { method: "POST", headers, body: b, ...extra });
    return { status: r.status, body: await r.json() };
  } catch (e) {
    return { error: String(e) + (e.cause ? ": " + e.cause : "") };
  }
}

const out = {};
out.declared = await post(body);
out.chunked = await post(chunked(), { duplex: "half" });
const after = await post(JSON.stringify({ model: "flav-vllm", messages: [{ role: "user", content: "hi" }] }));
out.after = { status: after.status };
process.stdout.write(JSON.stringify(out));
