// structured.mjs — structured output against `lumen serve` over the embedded model
// models/lumen-tiny-kjv, with the official OpenAI Node client (npm openai@6.30.1) and zod (npm
// zod@4.1.12): chat.completions.parse with zodResponseFormat (plain and streamed), a strict zodFunction
// tool with tool_choice required (the client checks the arguments with zod), json_object, and raw HTTP:
// a GBNF grammar on completions, tool_choice none, the Anthropic endpoint's output_format and tool_choice
// any, and the 400s of an unsupported schema keyword, a bad grammar and a grammar next to a format, in
// both APIs' error shapes.
//
// The model knows nothing of JSON: what is checked is that the grammar carries it (every answer that
// ends parses and validates) and that the server maps the protocols onto the engine's constraints.
//
// usage: NODE_DIR=<dir holding node_modules/{openai,zod}> node structured.mjs http://127.0.0.1:PORT/v1
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';

const base = process.argv[2];
const require = createRequire(`${process.env.NODE_DIR}/`);
const openaiModule = require('openai');
const OpenAI = openaiModule.default ?? openaiModule.OpenAI ?? openaiModule;
const { zodResponseFormat, zodFunction } = require('openai/helpers/zod');
const { z } = require('zod');
const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 120_000 });
const root = base.replace(/\/v1$/, '');
let passed = 0;

async function check(name, fn) {
  await fn();
  passed++;
  console.log(`ok ${passed} - ${name}`);
}

async function post(path, body) {
  const r = await fetch(`${root}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  return { status: r.status, body: await r.json() };
}

const Verse = z.object({
  book: z.enum(['Genesis', 'Exodus', 'Psalms', 'John', 'Romans']),
  chapter: z.number().int().min(1).max(150),
  verse: z.number().int().min(1).max(176),
  words: z.array(z.string().max(12)).max(3),
  note: z.string().max(24).nullable(),
});
const ask = [{ role: 'user', content: 'Name a verse of the Bible.' }];

await check('chat.completions.parse with zodResponseFormat', async () => {
  for (let seed = 1; seed <= 4; seed++) {
    const r = await client.chat.completions.parse({
      model: 'lumen-tiny-kjv', messages: ask, temperature: 1, seed, max_tokens: 400,
      response_format: zodResponseFormat(Verse, 'verse'),
    });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue; // the client refuses a cut answer; lengths are counted by the target test
    assert.equal(c.finish_reason, 'stop');
    assert.ok(c.message.parsed, `no parsed answer: ${c.message.content}`);
    Verse.parse(c.message.parsed); // parse() did already; the shape is what zod says
  }
});

await check('chat.completions.stream with zodResponseFormat', async () => {
  const stream = client.chat.completions.stream({
    model: 'lumen-tiny-kjv', messages: ask, temperature: 0, max_tokens: 400,
    response_format: zodResponseFormat(Verse, 'verse'),
  });
  let deltas = 0;
  stream.on('content.delta', () => deltas++);
  const final = await stream.finalChatCompletion();
  assert.ok(deltas > 1);
  assert.equal(final.choices[0].finish_reason, 'stop');
  Verse.parse(final.choices[0].message.parsed);
});

await check('a strict zodFunction tool with tool_choice required', async () => {
  const GetVerse = z.object({ book: z.string().max(16), chapter: z.number().int().min(1).max(150),
    verse: z.number().int().min(1).max(176) });
  const r = await client.chat.completions.parse({
    model: 'lumen-tiny-kjv', temperature: 1, seed: 5, max_tokens: 200,
    messages: [{ role: 'user', content: 'Look up Romans 8:28.' }],
    tools: [zodFunction({ name: 'get_verse', parameters: GetVerse, description: 'Look up one verse.' })],
    tool_choice: 'required',
  });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  const call = c.message.tool_calls[0];
  assert.equal(call.function.name, 'get_verse'); // the model's own habit is lookup_verse
  GetVerse.parse(call.function.parsed_arguments);
});

await check('response_format json_object', async () => {
  const r = await client.chat.completions.create({
    model: 'lumen-tiny-kjv', messages: ask, temperature: 0, max_tokens: 300,
    response_format: { type: 'json_object' },
  });
  const c = r.choices[0];
  if (c.finish_reason === 'stop') assert.equal(typeof JSON.parse(c.message.content), 'object');
  else assert.equal(c.finish_reason, 'length');
});

await check('a GBNF grammar on completions', async () => {
  const r = await client.completions.create({
    model: 'lumen-tiny-kjv', prompt: 'In the beginning', temperature: 1, seed: 3, max_tokens: 50,
    grammar: 'root ::= " God " ("created" | "said" | "saw") " the " [a-z]{1,10} "."',
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.match(r.choices[0].text, /^ God (created|said|saw) the [a-z]{1,10}\.$/);
});

await check('tool_choice none keeps calls out', async () => {
  const r = await client.chat.completions.create({
    model: 'lumen-tiny-kjv', temperature: 0, max_tokens: 60,
    messages: [{ role: 'user', content: 'Look up Romans 8:28.' }],
    tools: [zodFunction({ name: 'lookup_verse', parameters: z.object({ book: z.string() }) })],
    tool_choice: 'none',
  });
  assert.equal(r.choices[0].message.tool_calls, undefined);
  assert.notEqual(r.choices[0].finish_reason, 'tool_calls');
});

await check('errors: an unsupported keyword, a bad grammar, a grammar with a format', async () => {
  let r = await post('/v1/chat/completions', {
    messages: ask, response_format: { type: 'json_schema', json_schema: { name: 'x', schema:
      { type: 'object', patternProperties: { '^a': { type: 'string' } } } } },
  });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.type, 'invalid_request_error');
  assert.equal(r.body.error.param, 'response_format');
  assert.match(r.body.error.message, /patternProperties/);
  // the client raises it as a BadRequestError
  await assert.rejects(client.chat.completions.create({ model: 'lumen-tiny-kjv', messages: ask,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object',
      patternProperties: {} } } } }), (e) => e.status === 400 && /patternProperties/.test(e.message));
  r = await post('/v1/completions', { prompt: 'x', grammar: 'root ::= nothing-here' });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'grammar');
  r = await post('/v1/chat/completions', { messages: ask, grammar: 'root ::= "a"',
    response_format: { type: 'json_object' } });
  assert.equal(r.status, 400);
  r = await post('/v1/chat/completions', { messages: ask, tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object',
      properties: { a: { type: 'string', pattern: '^x+$' } } } } }] });
  assert.equal(r.status, 400);
  assert.equal(r.body.error.param, 'tools');
  assert.match(r.body.error.message, /pattern/);
  r = await post('/v1/messages', { max_tokens: 50, messages: ask, output_format: { type: 'json_schema',
    schema: { type: 'object', patternProperties: {} } } });
  assert.equal(r.status, 400);
  assert.equal(r.body.type, 'error');
  assert.equal(r.body.error.type, 'invalid_request_error');
  assert.match(r.body.error.message, /patternProperties/);
});

await check('Anthropic: output_format and tool_choice any', async () => {
  const schema = { type: 'object', properties: { book: { type: 'string', enum: ['John', 'Romans'] },
    chapter: { type: 'integer', minimum: 1, maximum: 150 } }, required: ['book', 'chapter'],
    additionalProperties: false };
  let r = await post('/v1/messages', { max_tokens: 200, temperature: 0, messages: ask,
    output_format: { type: 'json_schema', schema } });
  assert.equal(r.status, 200);
  assert.equal(r.body.stop_reason, 'end_turn');
  const v = JSON.parse(r.body.content.find((b) => b.type === 'text').text);
  assert.ok(['John', 'Romans'].includes(v.book) && v.chapter >= 1 && v.chapter <= 150);
  r = await post('/v1/messages', { max_tokens: 200, temperature: 1, messages: ask,
    tools: [{ name: 'get_verse', input_schema: schema }], tool_choice: { type: 'any' } });
  assert.equal(r.status, 200);
  assert.equal(r.body.stop_reason, 'tool_use');
  const use = r.body.content.find((b) => b.type === 'tool_use');
  assert.equal(use.name, 'get_verse');
  assert.ok(['John', 'Romans'].includes(use.input.book));
});

await check('the constraints are counted in /stats', async () => {
  const st = await (await fetch(`${root}/stats`)).json();
  assert.ok(st.batch.constraint.tokens > 0);
  assert.ok(st.batch.constraint.share_of_busy > 0 && st.batch.constraint.share_of_busy < 1);
});

console.log(`structured: ${passed} checks passed`);
