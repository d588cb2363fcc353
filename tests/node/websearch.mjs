// Web search through tollgate with the official OpenAI Node client.
// Env: OPENAI_BASE_URL, OPENAI_API_KEY, MODEL. Prints one JSON object with
// what the client saw; exits 1 (with the reason on stderr) when a check fails.
import OpenAI from 'openai';

const client = new OpenAI({ maxRetries: 0 });
const model = process.env.MODEL;
const question = 'What is new in Lisbon? [sim cite=all]';
const fail = (why) => { console.error(why); process.exit(1); };

// Annotation indices count Unicode code points, as OpenAI documents
// "characters": in JavaScript, slice the code points, not the UTF-16 string.
function checkAnnotations(content, annotations, where) {
  if (!Array.isArray(annotations) || annotations.length === 0) fail(`${where}: no annotations`);
  const points = Array.from(content);
  return annotations.map((a) => {
    if (a.type !== 'url_citation') fail(`${where}: annotation type ${a.type}`);
    const c = a.url_citation;
    if (!(c.start_index >= 0 && c.end_index > c.start_index && c.end_index <= points.length)) {
      fail(`${where}: indices ${c.start_index}..${c.end_index} outside ${points.length} code points`);
    }
    const cited = points.slice(c.start_index, c.end_index).join('');
    if (!cited.includes(c.url) && !/^\[\d+\]$/.test(cited)) fail(`${where}: cited text ${JSON.stringify(cited)} holds neither ${c.url} nor [n]`);
    return { url: c.url, title: c.title, cited };
  });
}

const r = await client.chat.completions.create({
  model, messages: [{ role: 'user', content: question }],
  web_search_options: { search_context_size: 'low' },
});
const msg = r.choices[0].message;
const nonstream = {
  content: msg.content, finish_reason: r.choices[0].finish_reason, usage: r.usage,
  citations: checkAnnotations(msg.content, msg.annotations, 'non-streamed'),
};

const stream = await client.chat.completions.create({
  model, stream: true, messages: [{ role: 'user', content: question }],
  web_search_options: { search_context_size: 'high' },
});
let content = '', annotations = [], usage = null, finish = null, chunks = 0;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.content) content += c.delta.content;
    if (c.delta?.annotations) annotations = annotations.concat(c.delta.annotations);
    if (c.finish_reason) finish = c.finish_reason;
  }
}
const streamed = { content, finish_reason: finish, usage, chunks, citations: checkAnnotations(content, annotations, 'streamed') };
console.log(JSON.stringify({ nonstream, stream: streamed }));
