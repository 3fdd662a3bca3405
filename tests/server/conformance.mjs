// conformance.mjs — the official OpenAI Node client (npm openai@6.30.1) against `lumen serve` over the
// embedded model models/lumen-tiny-kjv: models, chat (plain, streamed with usage, streamed through the
// client's ChatCompletionStream helper, n = 2), tool calls (plain and streamed), completions, typed errors
// (an unknown model is a NotFoundError), the Responses API (create, create with stream: true, the
// client's ResponseStream helper, a function call and its output sent back with previous_response_id,
// streamed calls, an incomplete answer, an unknown previous response), and a stream the client aborts
// (the server must cancel it and free its sequence).
//
// The tool calls are the model's own output: lumen-tiny-kjv was trained to answer "Look up Romans 8:28."
// with a lookup_verse call (see models/lumen-tiny-kjv/samples.txt), so greedy decoding reproduces it. What
// this test checks is the server side: the chat template declaring the tools, the output parser turning
// Gemma 4 call syntax into OpenAI tool_calls, and the SSE deltas the client reassembles.
//
// usage: OPENAI_DIR=<dir holding node_modules/openai> node conformance.mjs http://127.0.0.1:PORT/v1
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const base = process.argv[2];
const require = createRequire(`${process.env.OPENAI_DIR}/`);
const openaiModule = require('openai');
const OpenAI = openaiModule.default ?? openaiModule.OpenAI ?? openaiModule;
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });

const WHO = 'I am lumen-tiny-kjv, a small language model trained on the King James Bible.';
const tools = [{
  type: 'function',
  function: {
    name: 'lookup_verse',
    description: 'Look up one verse of the King James Bible.',
    parameters: {
      type: 'object',
      properties: {
        book: { type: 'string', description: 'Name of the book, e.g. John' },
        chapter: { type: 'integer', description: 'Chapter number' },
        verse: { type: 'integer', description: 'Verse number' },
      },
      required: ['book', 'chapter', 'verse'],
    },
  },
}];
const flatTools = [{ type: 'function', name: 'lookup_verse', description: tools[0].function.description,
  parameters: tools[0].function.parameters }]; // the Responses API's shape
const MODEL = 'lumen-tiny-kjv';
const ROMANS_8_28 = 'And we know that all things work together for good to them that love God.';
const who = [{ role: 'user', content: 'Who are you?' }];
const romans = [{ role: 'user', content: 'Look up Romans 8:28.' }];
let passed = 0;

async function check(name, fn) {
  await fn();
  passed++;
  console.log(`ok ${passed} - ${name}`);
}

function checkRomans(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'lookup_verse');
  assert.deepEqual(JSON.parse(call.function.arguments), { book: 'Romans', chapter: 8, verse: 28 });
}

async function stats() {
  const r = await fetch(base.replace(/\/v1$/, '/stats'));
  return r.json();
}

await check('models.list', async () => {
  const page = await client.models.list();
  assert.equal(page.data[0].id, 'lumen-tiny-kjv');
  assert.equal(page.data[0].object, 'model');
});

await check('chat.completions.create', async () => {
  const r = await client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: who, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, WHO);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.prompt_tokens, 14);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

await check('chat.completions.create stream + include_usage', async () => {
  const s = await client.chat.completions.create({
    model: 'lumen-tiny-kjv', messages: who, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const c of s) {
    chunks++;
    assert.equal(c.object, 'chat.completion.chunk');
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      text += ch.delta?.content ?? '';
      finish = ch.finish_reason ?? finish;
    }
  }
  assert.ok(chunks > 3);
  assert.equal(text, WHO);
  assert.equal(finish, 'stop');
  assert.equal(usage.prompt_tokens, 14);
});

await check('chat.completions.stream helper', async () => {
  const s = client.chat.completions.stream({ model: 'lumen-tiny-kjv', messages: who, temperature: 0 });
  let deltas = '';
  s.on('content', (d) => { deltas += d; });
  const final = await s.finalChatCompletion();
  assert.equal(final.choices[0].message.content, WHO);
  assert.equal(deltas, WHO);
});

await check('tool call (model output parsed into tool_calls)', async () => {
  const r = await client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: romans, tools, temperature: 0 });
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  checkRomans(r.choices[0].message.tool_calls[0]);
});

await check('tool call streamed (reassembled by the client helper)', async () => {
  const s = client.chat.completions.stream({ model: 'lumen-tiny-kjv', messages: romans, tools, temperature: 0 });
  const final = await s.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  checkRomans(final.choices[0].message.tool_calls[0]);
});

await check('tool result round trip', async () => {
  const first = await client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: romans, tools, temperature: 0 });
  const call = first.choices[0].message.tool_calls[0];
  const r = await client.chat.completions.create({
    model: 'lumen-tiny-kjv', tools, temperature: 0, max_tokens: 60,
    messages: [...romans, first.choices[0].message,
      { role: 'tool', tool_call_id: call.id, content: 'And we know that all things work together for good.' }],
  });
  assert.ok(r.choices[0].message.content.length > 0);
});

await check('completions.create', async () => {
  const r = await client.completions.create({ model: 'lumen-tiny-kjv', prompt: 'In the beginning', max_tokens: 20, temperature: 0 });
  assert.ok(r.choices[0].text.startsWith(' of the reign of Darius the king'));
  assert.equal(r.choices[0].finish_reason, 'length');
});

await check('typed errors', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: who, max_tokens: 0 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.type, 'invalid_request_error');
    assert.equal(e.param, 'max_tokens');
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: [{ role: 'oracle', content: 'x' }] }),
    (e) => e.status === 400 && e.param === 'messages[0].role');
  await assert.rejects(client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: [] }), (e) => e.status === 400);
  await assert.rejects(client.get('/nowhere'), (e) => e instanceof OpenAI.NotFoundError);
});

await check('an unknown model is a NotFoundError (model_not_found)', async () => {
  await assert.rejects(client.chat.completions.create({ model: 'gpt-4o', messages: who }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, String(e));
    assert.equal(e.status, 404);
    assert.equal(e.code, 'model_not_found');
    assert.equal(e.param, 'model');
    return true;
  });
  await assert.rejects(client.responses.create({ model: 'gpt-5', input: 'Hi' }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
});

await check('chat.completions.create n = 2', async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: who, temperature: 0, n: 2 });
  assert.equal(r.choices.length, 2);
  r.choices.forEach((c, i) => {
    assert.equal(c.index, i);
    assert.equal(c.message.content, WHO);
  });
  assert.equal(r.usage.prompt_tokens, 14);
});

await check('responses.create', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Who are you?', temperature: 0 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.equal(r.status, 'completed');
  assert.equal(r.output_text, WHO); // the client's own join of the output_text parts
  assert.equal(r.usage.input_tokens, 14);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
});

await check('responses.create stream: true (the event grammar)', async () => {
  const s = await client.responses.create({ model: MODEL, input: 'Who are you?', temperature: 0, stream: true });
  const types = [];
  let text = '', seq = 0, final = null;
  for await (const ev of s) {
    assert.equal(ev.sequence_number, seq++);
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') final = ev.response;
  }
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.completed']);
  assert.equal(text, WHO);
  assert.equal(final.output[0].content[0].text, WHO);
});

await check('responses.stream helper', async () => {
  const s = client.responses.stream({ model: MODEL, input: 'Who are you?', temperature: 0 });
  let deltas = '';
  s.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const final = await s.finalResponse();
  assert.equal(final.status, 'completed');
  assert.equal(final.output[0].type, 'message');
  assert.equal(final.output[0].content[0].text, WHO);
  assert.equal(deltas, WHO);
});

await check('responses: a function call, then its output with previous_response_id', async () => {
  const first = await client.responses.create({ model: MODEL, input: 'Look up Romans 8:28.', tools: flatTools,
    temperature: 0 });
  const fc = first.output.find((i) => i.type === 'function_call');
  assert.ok(fc, JSON.stringify(first.output));
  assert.equal(fc.name, 'lookup_verse');
  assert.match(fc.call_id, /^call_/);
  assert.deepEqual(JSON.parse(fc.arguments), { book: 'Romans', chapter: 8, verse: 28 });
  const second = await client.responses.create({
    model: MODEL, previous_response_id: first.id, tools: flatTools, temperature: 0, max_output_tokens: 60,
    input: [{ type: 'function_call_output', call_id: fc.call_id, output: ROMANS_8_28 }],
  });
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.output_text.length > 0);
  assert.ok(!second.output.some((i) => i.type === 'function_call'));
});

await check('responses: a streamed function call (arguments reassembled by the helper)', async () => {
  const s = client.responses.stream({ model: MODEL, input: 'Look up Romans 8:28.', tools: flatTools, temperature: 0 });
  let done = null;
  s.on('response.function_call_arguments.done', (e) => { done = e.arguments; });
  const final = await s.finalResponse();
  const fc = final.output.find((i) => i.type === 'function_call');
  assert.deepEqual(JSON.parse(fc.arguments), { book: 'Romans', chapter: 8, verse: 28 });
  assert.equal(done, fc.arguments);
});

await check('responses: incomplete at max_output_tokens; unknown previous response', async () => {
  const r = await client.responses.create({ model: MODEL, input: 'Who are you?', temperature: 0, max_output_tokens: 4 });
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  await assert.rejects(client.responses.create({ model: MODEL, input: 'Hi', previous_response_id: 'resp_none' }),
    (e) => e instanceof OpenAI.NotFoundError && e.param === 'previous_response_id');
});

await check('aborted stream is cancelled on the server', async () => {
  const ac = new AbortController();
  const s = await client.chat.completions.create({
    model: 'lumen-tiny-kjv', messages: [{ role: 'user', content: 'Recite Psalm 23.' }], max_tokens: 500, ignore_eos: true,
    stream: true,
  }, { signal: ac.signal });
  const before = (await stats()).jobs.cancelled;
  let n = 0;
  try { /* the client either ends the iteration or throws an abort error */
    for await (const c of s) { if (++n === 3) ac.abort(); }
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
  }
  /* chunks already in the client's buffer may still arrive after the abort */
  assert.ok(n >= 3 && n < 500, `chunks seen: ${n}`);
  let st;
  for (let i = 0; i < 100; i++) {
    st = await stats();
    if (st.sequences.active === 0 && st.jobs.cancelled === before + 1) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(st.sequences.active, 0);
  assert.equal(st.jobs.cancelled, before + 1);
  assert.equal(st.kv.reserved_bytes, st.prompt_cache.bytes);
});

console.log(`${passed} passed, 0 failed`);
