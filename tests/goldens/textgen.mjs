// textgen.mjs — deterministic generator of tokenizer test strings.
//
// makeStrings(seed, count, extraTokens) returns `count` valid Unicode strings (no lone
// surrogates) built from fragments that stress tokenizers: many scripts, emoji with modifiers
// and ZWJ sequences, combining marks, whitespace runs (tabs, \r, \n, exotic spaces), code, digit
// runs, contractions, special-token text (the tokenizer's own added tokens and other families'),
// and random mixes of all of these. The same seed always gives the same strings.

export function rng(seed) {
  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const pick = (r, a) => a[Math.floor(r() * a.length)];
const int = (r, lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
const cp = (c) => String.fromCodePoint(c);
function range(r, lo, hi, n) {
  let s = '';
  for (let i = 0; i < n; i++) s += cp(int(r, lo, hi));
  return s;
}

const WORDS = ('the quick brown fox jumps over lazy dog Hello world tokenizer model inference engine ' +
  'attention layer prefill decode cache sliding window rotary embedding question answer ' +
  'International Organization Standardization antidisestablishmentarianism supercalifragilistic').split(' ');
const SCRIPTS = [
  [0x00c0, 0x024f], // Latin extended
  [0x0391, 0x03c9], // Greek
  [0x0410, 0x044f], // Cyrillic
  [0x05d0, 0x05ea], // Hebrew
  [0x0621, 0x064a], // Arabic
  [0x0905, 0x0939], // Devanagari
  [0x0985, 0x09b9], // Bengali
  [0x0b85, 0x0bb9], // Tamil
  [0x0e01, 0x0e2e], // Thai
  [0x10d0, 0x10fa], // Georgian
  [0x0531, 0x0556], // Armenian
  [0x1200, 0x1248], // Ethiopic
  [0x3041, 0x3096], // Hiragana
  [0x30a1, 0x30fa], // Katakana
  [0x4e00, 0x9fff], // CJK
  [0xac00, 0xd7a3], // Hangul
  [0x20000, 0x2a6df], // CJK extension B (astral)
  [0x1d400, 0x1d7ff], // math alphanumerics
];
const PHRASES = ['日本語のテキスト', '中文分词测试', '한국어 문장입니다', 'Привет, мир!', 'Γειά σου Κόσμε',
  'مرحبا بالعالم', 'שלום עולם', 'नमस्ते दुनिया', 'สวัสดีชาวโลก', 'Ünïcödé façade naïve café', 'Zürich Straße',
  'ﬁ ﬂ ﬀ ligatures', 'ｆｕｌｌｗｉｄｔｈ １２３', 'Ⅻ ⅻ ½ ¼ ² ³', 'İstanbul ıi', 'ǅ ǈ ǋ titlecase'];
const EMOJI = ['😀', '🦀', '🔥', '👍🏽', '👩🏿‍🚀', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇩🇪', '🇯🇵', '1️⃣', '❤️', '🧑‍💻', '🫠',
  '🐈‍⬛', '👁️‍🗨️', '☺', '✔️', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '\u200d', '\ufe0f'];
const COMBINING = ['\u0301', '\u0300', '\u0308', '\u0327', '\u0303', '\u20dd', '\u0336', '\u0489', '\u05b7', '\u093f', '\u0e31'];
const SPACES = [' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\n\n\n', '\r\n', '\r', ' \n ', '\u00a0', '\u3000', '\u2028',
  '\u0085', '\u180e', '\u200b', '\u2009', '\u202f', '\u205f', '\u000b', '\u000c', ' \t \n', '\n\t\t', '    \n'];
const CODE = [
  'def fibonacci(n):\n    return n if n < 2 else fibonacci(n-1) + fibonacci(n-2)',
  'for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }',
  'const x = await fetch(`/api/v1/items?id=${id}&q=${encodeURIComponent(q)}`);',
  '{"name": "lumen", "version": "0.1.0", "ids": [1, 2, 3], "ok": true, "nil": null}',
  '<table><tr><td>cell</td></tr></table> <div class="x">text</div> <b>bold</b> <h1>T</h1>',
  '#include <stdio.h>\nint main(void) {\n\tprintf("%d\\n", 42);\n\treturn 0;\n}',
  '```python\nimport numpy as np\nx = np.zeros((3, 4), dtype=np.float32)\n```',
  'SELECT id, name FROM users WHERE age >= 18 AND email LIKE \'%@example.com\';',
  '$ ls -la /usr/local/bin | grep -E "^-rwx" && echo "done" >> log.txt 2>&1',
  'x += y; y -= z; z *= 2; w /= 3; a ||= b; c &&= d; e ??= f; g <<= 1; h >>>= 2;',
  '    indented\n        more indented\n\tand a tab',
  'https://example.com/path/to/page.html?query=1&lang=en#section-2',
];
const CONTRACTIONS = ["don't", "I'M", "it's", "we'll", "they've", "she'd", "you're", "O'Neil's", "'s", "'ll", "'D", "'Re",
  "ſ'ſ", "rock'n'roll", "''", "'''", "isn’t"];
const FAMILY_TOKENS = ['<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '[multimodal]', '<start_of_turn>', '<end_of_turn>',
  '<start_of_image>', '<end_of_image>', '<image_soft_token>', '<|turn>', '<turn|>', '<|think|>', '<|channel>', '<channel|>',
  '<|tool_call>', '<tool_call|>', '<|tool>', '<tool|>', '<|tool_response>', '<tool_response|>', '<|"|>', '<|image|>',
  '<|audio|>', '<|image>', '<image|>', '<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|eot_id|>', '<|reserved_special_token_3|>', '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>',
  '<tool_call>', '</tool_call>', '<|fim_prefix|>', '<unused0>', '<unused6241>', '<0x41>', '<0xE6>', '▁', '▁▁', '▁▁▁▁',
  '<|tur', '<start_of_turn', '<|begin_of_text|', '<bo', 's>', '<<bos>>', '<bos><bos>', '</s>', '<s>'];

function number(r) {
  switch (int(r, 0, 6)) {
    case 0: return String(int(r, 0, 9));
    case 1: return String(int(r, 0, 1e9));
    case 2: { let s = ''; const n = int(r, 20, 120); for (let i = 0; i < n; i++) s += int(r, 0, 9); return s; }
    case 3: return (r() * 1e6).toFixed(int(r, 0, 6));
    case 4: return range(r, 0x0660, 0x0669, int(r, 1, 8)); // Arabic-Indic digits
    case 5: return range(r, 0xff10, 0xff19, int(r, 1, 6)); // fullwidth digits
    default: return `${int(r, 1, 31)}/${int(r, 1, 12)}/${int(r, 1900, 2100)} ${int(r, 0, 23)}:${int(r, 10, 59)}`;
  }
}

function word(r) {
  const w = pick(r, WORDS);
  switch (int(r, 0, 4)) {
    case 0: return w.toUpperCase();
    case 1: return w[0].toUpperCase() + w.slice(1);
    default: return w;
  }
}

function fragment(r, tokens) {
  switch (int(r, 0, 13)) {
    case 0: case 1: { let s = ''; const n = int(r, 1, 12); for (let i = 0; i < n; i++) s += (i ? ' ' : '') + word(r); return s + pick(r, ['', '.', ',', '!', '?', ':', ';', '...']); }
    case 2: { const [lo, hi] = pick(r, SCRIPTS); return range(r, lo, hi, int(r, 1, 10)); }
    case 3: return pick(r, PHRASES);
    case 4: { let s = ''; const n = int(r, 1, 5); for (let i = 0; i < n; i++) s += pick(r, EMOJI); return s; }
    case 5: { let s = pick(r, ['e', 'a', 'o', 'n', 'ä', 'ᄀ', 'x']); const n = int(r, 1, 6); for (let i = 0; i < n; i++) s += pick(r, COMBINING); return s; }
    case 6: { let s = ''; const n = int(r, 1, 4); for (let i = 0; i < n; i++) s += pick(r, SPACES); return s; }
    case 7: return pick(r, CODE);
    case 8: return number(r);
    case 9: return pick(r, CONTRACTIONS);
    case 10: return pick(r, tokens);
    case 11: return pick(r, FAMILY_TOKENS);
    case 12: return range(r, 0x21, 0x7e, int(r, 1, 16)); // ASCII punctuation soup
    default: { // any scalar value, astral included, no surrogates
      let c = int(r, 0x20, 0x10ffff);
      if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
      return cp(c);
    }
  }
}

// Fixed edge cases, then random mixes.
const EDGES = ['', ' ', '  ', '\n', '\t', '\r\n', 'a', 'Hello, world!', '  leading and trailing spaces  ', '\ufeffBOM',
  '\ufffd', '\u{10ffff}', '\u{e000}\u{f8ff}', '\u0301 starts with a mark', 'x\u200d\u200dy', '<bos>Hello', '<bos><bos>Hi',
  '<|begin_of_text|>Hi', '<|im_start|>user\nHi<|im_end|>\n', '<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n',
  '<bos><|turn>system\nYou are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>',
  '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,n:5,flag:true}<tool_call|>', '1234567890'.repeat(20),
  ' '.repeat(100), '\n'.repeat(40), '\t'.repeat(35), '▁'.repeat(40), 'a'.repeat(300), '🦀'.repeat(50), 'ab'.repeat(200),
  "I'M SURE IT'S FINE, ISN'T IT? We'LL see.", 'ſtraße KELVIN \u212a', '\r\r\n\n\r', 'tab\there\tand\tthere',
  '\u0000', 'a\u0000b \u0000', '\u007f\u0080\u009f', '\u2581\u2581 x', '<0x41><0xE6>'];

export function makeStrings(seed, count, tokens) {
  const r = rng(seed);
  const out = EDGES.slice();
  while (out.length < count) {
    let s = '';
    const n = int(r, 1, 8);
    for (let i = 0; i < n; i++) s += fragment(r, tokens) + (r() < 0.5 ? pick(r, SPACES) : '');
    out.push(s);
  }
  return out.slice(0, count);
}

// A long text for throughput: the strings without added-token text, joined, repeated.
export function bigText(strings, bytes) {
  const base = strings.join('\n');
  let s = '';
  while (Buffer.byteLength(s) < bytes) s += base + '\n';
  return s;
}
