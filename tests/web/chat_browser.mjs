// chat_browser.mjs — the chat page of `lumen serve` (GET /) in a real headless browser: Debian's
// chromium driven by npm puppeteer-core, against a server on the embedded model
// models/lumen-tiny-kjv. It loads the page (the model's name and the server's stats appear), sends
// a message and watches the answer grow while it streams, stops it (the text stops growing, the
// page is idle again, the server's /stats shows the request ended), regenerates it, shows the
// model's own tool call and sends it a result by hand (the answer's reasoning arrives folded),
// shows a server error, deletes a conversation, and after a reload finds the conversations kept
// in localStorage. Screenshots (desktop and phone width) go to OUT_DIR.
//
// The outputs are the model's greedy continuations (models/lumen-tiny-kjv/samples.txt): "Continue:
// Blessed are the meek" loops without an end, so with a high max_tokens it is still streaming when
// Stop is clicked; "Look up Romans 8:28." with the lookup_verse tool is a call; after the tool's
// result with thinking on, the model writes reasoning.
//
// With API_KEY (a server started with --api-key), only the key's path: the page loads without
// the key, says it needs one, and works once the key is given in Settings.
//
// usage: PUPPETEER_DIR=<dir holding node_modules/puppeteer-core> node chat_browser.mjs BASE_URL
//        OUT_DIR WORK_DIR [API_KEY]   (CHROMIUM: the browser, /usr/bin/chromium by default)
import { createRequire } from 'node:module';
import assert from 'node:assert/strict';
import path from 'node:path';

const [base, outDir, workDir, apiKey] = process.argv.slice(2);
assert.ok(base && outDir && workDir, 'usage: node chat_browser.mjs BASE_URL OUT_DIR WORK_DIR');
const require = createRequire(`${path.resolve(process.env.PUPPETEER_DIR || ".")}/`);
const puppeteer = require('puppeteer-core');

const TOOLS = JSON.stringify([{
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
}], null, 2);

const t0 = Date.now();
const say = (s) => process.stderr.write(`chat_browser: ${((Date.now() - t0) / 1000).toFixed(1)}s ${s}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, fn, timeoutMs = 15000, everyMs = 40) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(everyMs);
  }
}

async function serverStats() {
  const r = await fetch(`${base}/stats`, apiKey ? { headers: { Authorization: `Bearer ${apiKey}` } } : {});
  assert.equal(r.status, 200);
  return r.json();
}

const browser = await puppeteer.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  userDataDir: path.join(workDir, apiKey ? 'profile-key' : 'profile'),
  // CI runs as root, where chromium's sandbox cannot start; the page is our own
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--no-default-browser-check', '--disable-background-networking', '--disable-component-update',
    '--disable-extensions', '--disable-sync', '--lang=en-US'],
  defaultViewport: { width: 1280, height: 860 },
  protocolTimeout: 60000,
});
const problems = []; // script errors and policy violations: the page must have none

// The key's path: the page itself needs no key; the API does, and the page says so.
async function keyed(page, { text, settings, send, idle, lastAnswer }) {
  const resp = await page.goto(`${base}/`, { waitUntil: 'load' });
  assert.equal(resp.status(), 200, 'the page needs no key');
  await until('the page to ask for the key', async () =>
    (await page.$eval('#model', (e) => e.textContent)) === '(API key needed)' &&
    /API key/.test(await page.$eval('#notice', (e) => (e.hidden ? '' : e.textContent))));
  await settings({ key: apiKey, temperature: '0', max_tokens: '40' });
  await until('the model name with the key', async () => (await page.$eval('#model', (e) => e.textContent)) === 'lumen-tiny-kjv');
  await until('the server stats with the key', async () => (await text('#stats dd')).includes('cpu'));
  assert.ok(await page.$eval('#notice', (e) => e.hidden), 'the notice is gone');
  await send('Who are you?');
  await idle('the answer');
  assert.equal(await lastAnswer(), 'I am lumen-tiny-kjv, a small language model trained on the King James Bible.');
  say('API key: the page asked for it, then worked with it');
}

async function main() {
  const page = await browser.newPage();
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // a refused request (the 400 this test provokes) is logged as "Failed to load resource"
    if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) {
      problems.push(`console: ${m.text()}`);
    }
  });

  const text = (sel) => page.$$eval(sel, (els) => els.map((e) => e.textContent));
  const lastAnswer = async () => (await text('.msg.assistant .content')).at(-1) ?? '';
  const lastMeta = async () => (await text('.msg.assistant .meta')).at(-1) ?? '';
  const busy = () => page.evaluate(() => document.body.dataset.busy === '1');
  const idle = async (what, ms = 30000) => until(what, async () => !(await busy()), ms);
  const settings = async (values) => {
    await page.click('#open-settings');
    await until('the settings dialog', () => page.$eval('#settings', (d) => d.open));
    for (const [k, v] of Object.entries(values)) {
      await page.$eval(`#s-${k}`, (e, x) => { e.value = x; }, v);
    }
    await page.click('#s-save');
    await until('the settings dialog to close', async () => !(await page.$eval('#settings', (d) => d.open)));
  };
  const send = async (message, how = 'click') => {
    await page.click('#input');
    await page.type('#input', message);
    if (how === 'enter') await page.keyboard.press('Enter');
    else await page.click('#send');
    // the message is in the conversation at once (busy may already be over for a refusal)
    await until('the sent message', async () => (await text('.msg.user .content')).at(-1) === message);
  };

  if (apiKey) {
    await keyed(page, { text, settings, send, idle, lastAnswer });
    assert.deepEqual(problems, [], 'no script errors or CSP violations');
    say('ok');
    return;
  }

  // ---- load: the model's name and the server's stats ----------------------------------------
  const resp = await page.goto(`${base}/`, { waitUntil: 'load' });
  assert.equal(resp.status(), 200);
  await until('the model name', async () => (await page.$eval('#model', (e) => e.textContent)) === 'lumen-tiny-kjv');
  await until('the server stats', async () => (await text('#stats dd')).includes('cpu'));
  say('loaded: model name and stats shown');

  // ---- send, stream, stop -------------------------------------------------------------------
  await settings({ temperature: '0', max_tokens: '1800' });
  await send('Continue: Blessed are the meek', 'enter');
  const seen = [];
  for (let k = 0; k < 3; k++) {
    const prev = seen.length ? seen.at(-1) : 0;
    seen.push(await until(`the answer to grow past ${prev} characters`, async () => {
      const n = (await lastAnswer()).length;
      return n > prev ? n : 0;
    }));
  }
  assert.ok(await busy(), 'still streaming after three observations');
  const during = await serverStats();
  assert.equal(during.sequences.active, 1, 'the server is generating the answer');
  say(`streaming: the answer grew ${seen.join(' -> ')} characters`);
  await page.click('#stop');
  await idle('the page to be idle after Stop', 5000);
  const stopped = (await lastAnswer()).length;
  await sleep(800);
  assert.equal((await lastAnswer()).length, stopped, 'the text stops growing after Stop');
  assert.ok(stopped >= seen.at(-1));
  assert.ok(stopped < 1800 * 4, 'stopped before max_tokens');
  assert.match(await lastMeta(), /stopped/);
  assert.ok(!(await page.$eval('#send', (b) => b.hidden)) && (await page.$eval('#stop', (b) => b.hidden)),
    'Send is back and Stop is gone');
  const after = await until('the server to end the request', async () => {
    const s = await serverStats();
    return s.sequences.active === 0 && s.jobs.cancelled >= 1 ? s : null;
  }, 5000, 100);
  say(`stopped at ${stopped} characters; server: ${after.jobs.cancelled} cancelled, 0 active`);

  // ---- regenerate -----------------------------------------------------------------------------
  await settings({ max_tokens: '24' });
  await page.click('#regen');
  // 24 tokens may be done before a first look: wait for the new answer's line, not for busy
  await until('the regenerated answer', async () => /max_tokens reached/.test(await lastMeta()) && !(await busy()));
  assert.equal((await text('.msg.assistant')).length, 1, 'regenerate replaces the answer');
  assert.equal((await text('.msg.user')).length, 1);
  const regen = await lastAnswer();
  assert.ok(regen.startsWith('of the LORD, which brought thee out of the land of Egypt'), regen);
  assert.match(await lastMeta(), /^24 tokens · [0-9.]+ tok\/s · first token .* · max_tokens reached$/);
  await settings({ max_tokens: '40' });
  await send('Who are you?');
  await idle('the second answer');
  assert.ok((await lastAnswer()).length > 0);
  const kept = await text('.msg .content');
  say('regenerated, and a second turn answered');

  // ---- a tool call, answered by hand; the reasoning folded ----------------------------------
  await page.click('#new-chat');
  assert.equal((await text('.msg')).length, 0, 'a new chat is empty');
  await settings({ tools: TOOLS, max_tokens: '60' });
  await send('Look up Romans 8:28.');
  await idle('the tool call');
  const call = (await text('.msg.assistant .call')).join(' ');
  assert.match(call, /lookup_verse/);
  assert.match(call, /"book": "Romans"/);
  assert.match(call, /"chapter": 8/);
  await settings({ thinking: 'on' });
  await page.type('.call form input', 'And we know that all things work together for good to them that love God.');
  await page.click('.call form button');
  await idle('the answer after the tool result');
  assert.equal((await text('.msg.tool')).length, 1, 'the tool result is shown');
  const folded = await page.$$eval('.msg.assistant details.reasoning', (ds) => ds.map((d) => ({
    open: d.open, text: d.querySelector('.text').textContent })));
  assert.equal(folded.length, 1, 'the reasoning is shown');
  assert.equal(folded[0].open, false, 'the reasoning is folded');
  assert.ok(folded[0].text.length > 0);
  say(`tool call shown, result sent, reasoning folded (${folded[0].text.length} characters)`);
  await page.$$eval('.msg.assistant details.reasoning', (ds) => { ds.at(-1).open = true; });
  await page.screenshot({ path: path.join(outDir, 'web_chat_tools.png') });
  await settings({ tools: '', thinking: '', max_tokens: '100000' });

  // ---- a server error is shown; deleting a conversation ---------------------------------------
  await page.click('#new-chat');
  await send('Who are you?');
  await idle('the refused request');
  const err = (await text('.msg.assistant .err')).at(-1);
  assert.match(err, /the limit is 2048.*HTTP 400/);
  assert.equal((await text('#convs li')).length, 3);
  await page.click('#convs li.current .del');
  await page.click('#convs li.current .del'); // the second click deletes
  await until('the deleted conversation to go', async () => (await text('#convs li')).length === 2);
  await settings({ max_tokens: '40' });
  say('a server error shown; a conversation deleted');

  // ---- reload: the conversations are kept -----------------------------------------------------
  await page.reload({ waitUntil: 'load' });
  await until('the model name after the reload', async () => (await page.$eval('#model', (e) => e.textContent)) === 'lumen-tiny-kjv');
  const titles = await text('#convs li .open');
  assert.deepEqual(titles.slice().sort(), ['Continue: Blessed are the meek', 'Look up Romans 8:28.']);
  await page.$$eval('#convs li .open', (bs) => bs.find((b) => b.textContent.startsWith('Continue')).click());
  await until('the first conversation', async () => (await text('.msg')).length === 4);
  assert.deepEqual(await text('.msg .content'), kept, 'the conversation is the same after a reload');
  assert.equal(await page.$eval('#s-max_tokens', (e) => e.value), '', 'the dialog is filled only when opened');
  await page.click('#open-settings');
  assert.equal(await page.$eval('#s-max_tokens', (e) => e.value), '40', 'the settings are kept');
  assert.equal(await page.$eval('#s-temperature', (e) => e.value), '0');
  await page.click('#s-cancel');
  await until('the stats after the reload', async () => (await text('#stats dd')).some((t) => /[1-9]\d* stopped/.test(t)));
  const shot = path.join(outDir, 'web_chat.png');
  await page.screenshot({ path: shot });
  say(`reloaded: conversations and settings kept; screenshot ${shot}`);

  // ---- phone width ------------------------------------------------------------------------------
  await page.setViewport({ width: 390, height: 844 });
  await until('the menu button', () => page.$eval('#menu', (b) => getComputedStyle(b).display !== 'none'));
  await until('the drawer to hide', () => page.$eval('#side', (s) => s.getBoundingClientRect().right <= 0));
  const width = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(width <= 390, `no sideways scrolling at phone width (${width}px)`);
  await page.screenshot({ path: path.join(outDir, 'web_chat_phone.png') });
  await page.click('#menu');
  await until('the drawer', () => page.$eval('#side', (s) => s.classList.contains('open')));
  await page.click('#scrim');
  say('phone width: no sideways scrolling, the drawer opens');

  assert.deepEqual(problems, [], 'no script errors or CSP violations');
  say('ok');
}

try {
  await main();
} finally {
  await browser.close();
}
