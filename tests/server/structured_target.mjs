// structured_target.mjs — the structured-output target on the embedded model (a 11.5M-parameter
// model that knows nothing of JSON, so the grammar must carry it):
//   - N_SCHEMA requests with random bounded schemas from a seeded generator (nested objects, enums,
//     arrays with maxItems, integers, strings with maxLength or a pattern), temperature 1,
//     max_tokens 600: every answer that finishes (finish_reason stop) parses and validates (ajv), and
//     at least 95% finish within the 600 tokens;
//   - N_TOOLS requests offering 1-3 random tools (tool_choice required, named or auto): every tool
//     call names an offered tool (the named one when named) and its arguments validate against that
//     tool's parameters.
// Requests run CONCURRENCY at a time (the server runs them in one batch). Prints the numbers; exits 1
// when a target is missed.
//
// usage: NODE_DIR=<dir holding node_modules/ajv> node structured_target.mjs http://127.0.0.1:PORT [SEED]
import { createRequire } from 'node:module';

const root = process.argv[2];
const SEED = Number(process.argv[3] ?? 20260418);
const N_SCHEMA = Number(process.env.N_SCHEMA ?? 200);
const N_TOOLS = Number(process.env.N_TOOLS ?? 60);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 8);
const require = createRequire(`${process.env.NODE_DIR}/`);
const Ajv = require('ajv').default ?? require('ajv');
const ajv = new Ajv({ strict: false, allErrors: true });

// ---- a seeded generator of bounded schemas -----------------------------------------------------------
function mulberry32(a) {
  return () => {
    a |= 0; a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rnd = mulberry32(SEED);
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
const pick = (a) => a[int(0, a.length - 1)];
const WORDS = ['book', 'name', 'count', 'tags', 'verse', 'title', 'score', 'kind', 'city', 'age', 'items',
  'label', 'color', 'level', 'owner', 'notes', 'size', 'rank', 'when', 'place'];
const VALUES = ['red', 'green', 'blue', 'alpha', 'beta', 'Genesis', 'John', 'yes', 'no', 'north', 'south',
  'small', 'large', 'lamb', 'lion'];
const PATTERNS = ['^[A-Z][a-z]{1,8}$', '^[0-9]{3}-[0-9]{4}$', '^(yes|no|maybe)$', '^[a-z]{2,6}( [a-z]{2,6})?$',
  '^[A-Z]{2}[0-9]{2}$', '^v[0-9]\\.[0-9]$'];

function leaf(patterns) {
  switch (int(0, patterns ? 6 : 5)) {
    case 0: return { type: 'string', maxLength: int(1, 24) };
    case 1: return { type: 'string', minLength: 1, maxLength: int(2, 16) };
    case 2: {
      const n = int(2, 4), vs = new Set();
      while (vs.size < n) vs.add(pick(VALUES));
      return { type: 'string', enum: [...vs] };
    }
    case 3: {
      const lo = pick([0, 1, -50, 100]);
      return { type: 'integer', minimum: lo, maximum: lo + pick([9, 100, 1000, 100000]) };
    }
    case 4: return { type: 'boolean' };
    case 5: return { type: 'integer', minimum: 0, maximum: pick([1, 12, 31, 365]) };
    default: return { type: 'string', pattern: pick(PATTERNS) };
  }
}

function value(depth, patterns) {
  const r = rnd();
  if (depth > 0 && r < 0.2) return object(depth - 1, patterns);
  if (r < 0.4) {
    const items = depth > 0 && rnd() < 0.25 ? object(depth - 1, patterns) : leaf(patterns);
    return { type: 'array', items, maxItems: int(1, 4), ...(rnd() < 0.3 ? { minItems: 1 } : {}) };
  }
  return leaf(patterns);
}

function object(depth, patterns) {
  const n = int(1, 4), props = {};
  while (Object.keys(props).length < n) props[pick(WORDS)] = value(depth, patterns);
  const keys = Object.keys(props);
  const required = keys.filter(() => rnd() < 0.7);
  return { type: 'object', properties: props, required, additionalProperties: false };
}

// ---- requests --------------------------------------------------------------------------------------
const PROMPTS = ['Describe a verse.', 'Who was Moses?', 'Tell me of the lamb.', 'What is the law?',
  'Name a city of the Bible.', 'Who are you?'];

async function post(path, body) {
  const r = await fetch(`${root}${path}`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
  });
  const text = await r.text();
  try { return { status: r.status, body: JSON.parse(text) }; } catch { return { status: r.status, body: text }; }
}

async function pool(jobs, n) {
  const out = new Array(jobs.length);
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < jobs.length) {
      const i = next++;
      out[i] = await jobs[i]();
    }
  }));
  return out;
}

const t0 = Date.now();
const failures = [];

// structured answers
const schemaJobs = [];
for (let i = 0; i < N_SCHEMA; i++) {
  const schema = object(2, true);
  const body = {
    model: 'lumen-tiny-kjv', temperature: 1, seed: SEED + i, max_tokens: 600,
    messages: [{ role: 'user', content: pick(PROMPTS) }],
    response_format: { type: 'json_schema', json_schema: { name: `s${i}`, schema, strict: true } },
  };
  schemaJobs.push(async () => ({ schema, r: await post('/v1/chat/completions', body) }));
}
const answers = await pool(schemaJobs, CONCURRENCY);
let stop = 0, length = 0, valid = 0, tokens = 0;
for (const [i, { schema, r }] of answers.entries()) {
  if (r.status !== 200) {
    failures.push(`schema ${i}: HTTP ${r.status} ${JSON.stringify(r.body).slice(0, 300)}`);
    continue;
  }
  const c = r.body.choices[0];
  tokens += r.body.usage.completion_tokens;
  if (c.finish_reason === 'length') { length++; continue; }
  stop++;
  let v;
  try { v = JSON.parse(c.message.content); } catch (e) {
    failures.push(`schema ${i}: not JSON: ${c.message.content.slice(0, 200)}`);
    continue;
  }
  if (ajv.validate(schema, v)) valid++;
  else failures.push(`schema ${i}: invalid (${ajv.errorsText()}): ${c.message.content.slice(0, 200)}`);
}
const t1 = Date.now();

// tool calls (the call grammar has no patterns)
const toolJobs = [];
for (let i = 0; i < N_TOOLS; i++) {
  const n = int(1, 3), tools = [];
  const names = new Set();
  while (names.size < n) names.add(pick(['get_verse', 'find_city', 'count_words', 'lookup', 'set_color']));
  for (const name of names)
    tools.push({ type: 'function', function: { name, description: `The ${name} tool.`,
      parameters: object(1, false) } });
  const mode = pick(['required', 'named', 'auto']);
  const named = mode === 'named' ? pick(tools).function.name : null;
  const body = {
    model: 'lumen-tiny-kjv', temperature: 1, seed: SEED + 1000 + i, max_tokens: 600,
    messages: [{ role: 'user', content: pick(['Look up Romans 8:28.', 'Which city is it?', 'Count the words.']) }],
    tools, tool_choice: named ? { type: 'function', function: { name: named } } : mode,
  };
  toolJobs.push(async () => ({ tools, named, mode, r: await post('/v1/chat/completions', body) }));
}
const calls = await pool(toolJobs, CONCURRENCY);
let nCalls = 0, goodCalls = 0, forcedWithout = 0;
for (const [i, { tools, named, mode, r }] of calls.entries()) {
  if (r.status !== 200) {
    failures.push(`tools ${i}: HTTP ${r.status} ${JSON.stringify(r.body).slice(0, 300)}`);
    continue;
  }
  const c = r.body.choices[0];
  const made = c.message.tool_calls ?? [];
  if (mode !== 'auto' && !made.length && c.finish_reason !== 'length') forcedWithout++;
  for (const call of made) {
    nCalls++;
    const tool = tools.find((t) => t.function.name === call.function.name);
    if (!tool || (named && call.function.name !== named)) {
      failures.push(`tools ${i}: called '${call.function.name}', offered ${tools.map((t) => t.function.name)}`);
      continue;
    }
    let args;
    try { args = JSON.parse(call.function.arguments); } catch {
      failures.push(`tools ${i}: arguments are not JSON: ${call.function.arguments}`);
      continue;
    }
    if (ajv.validate(tool.function.parameters, args)) goodCalls++;
    else failures.push(`tools ${i}: ${call.function.name} arguments invalid (${ajv.errorsText()}): ${call.function.arguments}`);
  }
}
const t2 = Date.now();

const finished = N_SCHEMA ? stop / N_SCHEMA : 1;
console.log(`structured target (seed ${SEED}, ${CONCURRENCY} concurrent):`);
console.log(`  schemas: ${N_SCHEMA} requests, ${stop} stop, ${length} length; ${valid}/${stop} of the finished ` +
  `parse and validate; ${(100 * finished).toFixed(1)}% finished within 600 tokens; ` +
  `${(tokens / Math.max(1, N_SCHEMA)).toFixed(1)} tokens per answer; ${((t1 - t0) / 1000).toFixed(1)} s`);
console.log(`  tools: ${N_TOOLS} requests, ${nCalls} calls, ${goodCalls}/${nCalls} name an offered tool and ` +
  `validate; ${forcedWithout} required/named answers without a call; ${((t2 - t1) / 1000).toFixed(1)} s`);
for (const f of failures.slice(0, 20)) console.log(`  FAIL ${f}`);
const ok = valid === stop && finished >= 0.95 && goodCalls === nCalls && forcedWithout === 0 && !failures.length;
console.log(ok ? 'structured target: met' : 'structured target: MISSED');
process.exit(ok ? 0 : 1);
