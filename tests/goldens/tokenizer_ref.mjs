// tokenizer_ref.mjs — compares `lumen tokenize` / `lumen detokenize` with Hugging Face
// `tokenizers` (npm tokenizers@0.23.2) on generated strings, for one tokenizer.json.
//
// node tokenizer_ref.mjs --node-dir DIR --lumen BIN --name NAME --file TOKENIZER_JSON --out DIR
//                        [--count N] [--seed S] [--cases tokenizer_cases.json] [--big-mb M]
//
// Checks, each exact: encode with and without special tokens; decode of the reference ids with
// and without skip_special, in one call and through the streaming detokenizer; decode of random
// id sequences (byte tokens, special tokens, anything in the vocab); the golden cases file, if
// given (ids without special tokens, and the decoded text); and a long text (also timed).
// Expected ids are HF's, except for lumen's one documented rule: the BOS is never doubled (HF
// prepends a second BOS when the text starts with the BOS token). Exits 1 on any mismatch.
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { makeStrings, bigText, rng } from './textgen.mjs';

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['node-dir', 'lumen', 'name', 'file', 'out'])
  if (!args[k]) { console.error(`tokenizer_ref.mjs: missing --${k}`); process.exit(2); }
const count = Number(args.count || 600), seed = Number(args.seed || 1234), bigMb = Number(args['big-mb'] || 2);
const name = args.name;
const require = createRequire(path.join(path.resolve(args['node-dir']), 'noop.js'));
const { Tokenizer } = require('tokenizers');

let failures = 0;
const show = (s, n = 160) => { const j = JSON.stringify(s); return j.length > n ? j.slice(0, n) + '…' : j; };

function lumen(verb, extra, lines) {
  const r = spawnSync(args.lumen, [verb, args.file, ...extra], { input: lines.join('\n') + '\n', maxBuffer: 1 << 30 });
  if (r.status !== 0) {
    console.error(`${name}: lumen ${verb} ${extra.join(' ')} failed (status ${r.status}): ${r.stderr}`);
    process.exit(1);
  }
  const out = r.stdout.toString('utf8').split('\n');
  out.pop();
  return { out, stderr: r.stderr.toString('utf8') };
}

function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

function reportIds(tok, what, inputs, expected, got) {
  let ok = 0, shown = 0;
  for (let i = 0; i < inputs.length; i++) {
    const e = expected[i], g = got[i];
    if (JSON.stringify(e) === JSON.stringify(g)) { ok++; continue; }
    failures++;
    if (shown++ >= 5) continue;
    const d = firstDiff(e, g || []);
    const ctx = (ids) => (ids || []).slice(Math.max(0, d - 4), d + 6).map((id) => `${id}:${show(tok.idToToken(id), 24)}`).join(' ');
    console.log(`  MISMATCH ${name} ${what} #${i} ${show(inputs[i])}\n    at ${d}: expected ${ctx(e)}\n              lumen ${ctx(g)}`);
  }
  console.log(`${name}: ${what}: ${ok}/${inputs.length} match`);
}

function reportText(what, inputs, expected, got) {
  let ok = 0, shown = 0;
  for (let i = 0; i < inputs.length; i++) {
    if (expected[i] === got[i]) { ok++; continue; }
    failures++;
    if (shown++ >= 5) continue;
    const d = firstDiff([...expected[i]], [...(got[i] ?? '')]);
    console.log(`  MISMATCH ${name} ${what} #${i} ids ${show(inputs[i], 80)}\n    at char ${d}: expected ${show([...expected[i]].slice(d, d + 20).join(''))}\n                  lumen ${show([...(got[i] ?? '')].slice(d, d + 20).join(''))}`);
  }
  console.log(`${name}: ${what}: ${ok}/${inputs.length} match`);
}

const t0 = Date.now();
const tok = Tokenizer.fromFile(args.file);
const hfLoadMs = Date.now() - t0;
const json = JSON.parse(fs.readFileSync(args.file, 'utf8'));
const added = (json.added_tokens || []).map((a) => a.content);
const vocabSize = tok.getVocabSize(true);

// ---- encode -------------------------------------------------------------------------------
const strings = makeStrings(seed, count, added.length ? added : ['<unk>']);
const lines = strings.map((s) => JSON.stringify(s));
const hfSpecial = (await tok.encodeBatch(strings, { addSpecialTokens: true })).map((e) => e.getIds());
const hfPlain = (await tok.encodeBatch(strings, { addSpecialTokens: false })).map((e) => e.getIds());
const empty = (await tok.encode('', null, { addSpecialTokens: true })).getIds();
const bos = empty.length ? empty[0] : -1;
let dedup = 0;
const expSpecial = hfSpecial.map((ids, i) => {
  if (bos >= 0 && ids.length >= 2 && ids[0] === bos && ids[1] === bos && hfPlain[i][0] === bos) { dedup++; return ids.slice(1); }
  return ids;
});
const gotSpecial = lumen('tokenize', ['--jsonl', '--stats'], lines);
const gotPlain = lumen('tokenize', ['--jsonl', '--no-special'], lines);
reportIds(tok, 'encode (special)', strings, expSpecial, gotSpecial.out.map((l) => JSON.parse(l)));
reportIds(tok, 'encode (no special)', strings, hfPlain, gotPlain.out.map((l) => JSON.parse(l)));
console.log(`${name}: ${dedup} strings start with the BOS token (HF doubles it, lumen does not)`);

// ---- decode -------------------------------------------------------------------------------
const r = rng(seed + 1);
const randomIds = [];
for (let i = 0; i < 300; i++) {
  const n = 1 + Math.floor(r() * 20), ids = [];
  for (let k = 0; k < n; k++) {
    const u = r();
    if (u < 0.25 && json.model.byte_fallback) ids.push(tok.tokenToId(`<0x${Math.floor(r() * 256).toString(16).toUpperCase().padStart(2, '0')}>`));
    else if (u < 0.35 && added.length) ids.push(tok.tokenToId(added[Math.floor(r() * added.length)]));
    else ids.push(Math.floor(r() * vocabSize));
  }
  randomIds.push(ids.filter((x) => x !== null && x !== undefined));
}
const decInputs = [...expSpecial, ...randomIds];
const decLines = decInputs.map((ids) => JSON.stringify(ids));
const hfDec = await tok.decodeBatch(decInputs, false);
const hfDecSkip = await tok.decodeBatch(decInputs, true);
const dec = lumen('detokenize', ['--jsonl'], decLines).out.map((l) => JSON.parse(l));
const decSkip = lumen('detokenize', ['--jsonl', '--skip-special'], decLines).out.map((l) => JSON.parse(l));
const decStream = lumen('detokenize', ['--jsonl', '--stream'], decLines).out.map((l) => JSON.parse(l));
reportText('decode', decInputs, hfDec, dec);
reportText('decode (skip special)', decInputs, hfDecSkip, decSkip);
// The stream equals the batch decode whenever that has no U+FFFD (see tokenizer.h).
const clean = decInputs.map((_, i) => i).filter((i) => !hfDec[i].includes('\ufffd'));
reportText('decode (stream, valid text)', clean.map((i) => decInputs[i]), clean.map((i) => hfDec[i]), clean.map((i) => decStream[i]));
let roundTrip = 0;
strings.forEach((s, i) => { roundTrip += hfDecSkip[i] === s; });
console.log(`${name}: ${roundTrip}/${strings.length} strings come back unchanged from encode + decode (skip special), in both HF and lumen`);

// ---- golden cases ---------------------------------------------------------------------------
if (args.cases) {
  const cases = JSON.parse(fs.readFileSync(args.cases, 'utf8')).cases;
  const cl = cases.map((c) => JSON.stringify(c.text));
  const ids = lumen('tokenize', ['--jsonl', '--no-special'], cl).out.map((l) => JSON.parse(l));
  reportIds(tok, 'golden cases (ids)', cases.map((c) => c.text), cases.map((c) => c.ids), ids);
  const texts = lumen('detokenize', ['--jsonl'], cases.map((c) => JSON.stringify(c.ids))).out.map((l) => JSON.parse(l));
  reportText('golden cases (decoded)', cases.map((c) => c.ids), cases.map((c) => c.decoded), texts);
}

// ---- long text: ids and throughput ------------------------------------------------------------
const big = bigText(strings.filter((s) => !added.some((a) => a.length > 1 && s.includes(a))), bigMb * 1e6);
const bigPath = path.join(args.out, `big_${name}.txt`);
fs.writeFileSync(bigPath, big);
const h0 = Date.now();
const hfBig = (await tok.encode(big, null, { addSpecialTokens: false })).getIds();
const hfBigMs = Date.now() - h0;
const rb = spawnSync(args.lumen, ['tokenize', args.file, '--no-special', '--stats'], { input: fs.readFileSync(bigPath), maxBuffer: 1 << 30 });
if (rb.status !== 0) { console.error(`${name}: lumen tokenize (long text) failed: ${rb.stderr}`); process.exit(1); }
reportIds(tok, `long text (${(Buffer.byteLength(big) / 1e6).toFixed(1)} MB)`, [big.slice(0, 60)], [hfBig], [JSON.parse(rb.stdout.toString())]);
const stats = rb.stderr.toString().trim();
console.log(`${name}: lumen ${stats.replace(/^lumen tokenize: /, '')}`);
console.log(`${name}: HF tokenizers: load ${hfLoadMs} ms; encode ${(Buffer.byteLength(big) / 1e6).toFixed(1)} MB in ${hfBigMs} ms (${(Buffer.byteLength(big) / 1e3 / Math.max(hfBigMs, 1)).toFixed(2)} MB/s)`);

console.log(failures ? `${name}: FAILED (${failures} mismatches)` : `${name}: all checks passed`);
process.exit(failures ? 1 : 0);
