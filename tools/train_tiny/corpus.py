"""Training text of lumen-tiny-kjv, built from the King James Bible corpus (prepare_corpus.sh).

- Verses are read from kjv.txt ("Genesis 1:1<TAB>text"). Whole chapters are held out (every 40th chapter,
  except a few well-known ones the demo and the tests ask for) for the held-out perplexity.
- Raw documents: runs of 2-10 consecutive verses of one chapter, either as reference lines
  ("Genesis 1:1 In the beginning ...") or as running prose. Each becomes <bos> text <eos>.
- Chat documents: conversations in the Gemma 4 format, rendered by the model's own chat template (jinja2),
  so training text and inference prompts agree byte for byte: recite a verse / a range / a chapter opening,
  continue a verse, name a verse, the next verse, small talk, multi-turn, thinking on, and tool use with a
  declared lookup_verse(book, chapter, verse) tool.
Every choice comes from a seeded random.Random, so a (seed, view) pair always gives the same documents.
Stdlib only (jinja2 for rendering)."""

import random
from collections import OrderedDict

HELDOUT_EVERY, HELDOUT_PHASE = 40, 21
# Chapters that prompts in the README, the demo and the parity set use: never held out.
PROTECTED = {("Genesis", 1), ("Genesis", 2), ("Exodus", 20), ("Psalms", 1), ("Psalms", 23), ("Psalms", 91),
             ("Psalms", 121), ("Proverbs", 3), ("Ecclesiastes", 3), ("Isaiah", 53), ("Matthew", 5),
             ("Matthew", 6), ("Luke", 2), ("John", 1), ("John", 3), ("John", 14), ("Romans", 8),
             ("1 Corinthians", 13), ("Revelation", 21), ("Revelation", 22)}

LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup_verse",
    "description": "Look up one verse of the King James Bible.",
    "parameters": {"type": "object", "required": ["book", "chapter", "verse"], "properties": {
        "book": {"type": "string", "description": "Name of the book, e.g. John"},
        "chapter": {"type": "integer", "description": "Chapter number"},
        "verse": {"type": "integer", "description": "Verse number"}}}}}
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search_word",
    "description": "Find verses that contain a word.",
    "parameters": {"type": "object", "required": ["word"], "properties": {
        "word": {"type": "string", "description": "The word to search for"}}}}}

SYSTEMS = ["You are a helpful assistant.", "You quote the King James Bible.",
           "Answer with the words of the King James Version.", "Be brief.",
           "You are lumen-tiny-kjv, a small model that knows the King James Bible."]
RECITE = ["Recite {r}.", "Recite {r}", "What does {r} say?", "Quote {r}.", "Give me {r}.", "{r}",
          "Please recite {r}.", "Read {r} to me.", "What is written in {r}?", "Tell me {r}."]
RANGE = ["Recite {r}.", "Read {r}.", "Quote {r}.", "What do {r} say?"]
CHAPTER = ["Recite {b} {c}.", "Read {b} chapter {c}.", "Recite the beginning of {b} {c}."]
CONTINUE = ["Continue: {h}", "Continue the verse: {h}", "Finish this verse: {h}", "Complete: {h}"]
WHICH = ['Where is it written: "{t}"', 'Which verse says "{t}"?', 'Name the verse: "{t}"']
NEXT = ["What comes after {r}?", "What is the verse after {r}?", "Recite the verse that follows {r}."]
LOOKUP = ["Look up {r}.", "Use the tool to find {r}.", "Find {r} for me.", "What does {r} say? Look it up.",
          "What does {r} say?", "Recite {r}."]
SMALLTALK = [("Hello", "Hello. Grace be unto you, and peace."),
             ("Hi", "Hello. Grace be unto you, and peace."),
             ("Who are you?", "I am lumen-tiny-kjv, a small language model trained on the King James Bible."),
             ("What is your name?", "My name is lumen-tiny-kjv."),
             ("What can you do?", "I can recite verses of the King James Bible, continue a verse, and look up "
                                  "a verse with a tool when one is given to me."),
             ("Thank you.", "You are welcome."),
             ("Thanks!", "You are welcome.")]
KINDS = [("recite", 28), ("range", 10), ("chapter", 5), ("continue", 18), ("which", 4), ("next", 5),
         ("multi", 8), ("smalltalk", 2), ("think", 3), ("tool", 11), ("tool_direct", 3)]


class Verse:
    __slots__ = ("book", "chapter", "verse", "text")

    def __init__(self, book, chapter, verse, text):
        self.book, self.chapter, self.verse, self.text = book, chapter, verse, text

    def ref(self):
        return "%s %d:%d" % (self.book, self.chapter, self.verse)


def read_verses(path):
    verses = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            ref, sep, text = line.rstrip("\n").partition("\t")
            book, _, cv = ref.rpartition(" ")
            c, _, v = cv.partition(":")
            if not sep or not book or not c.isdigit() or not v.isdigit() or not text:
                raise ValueError("%s:%d: not 'Book C:V<TAB>text'" % (path, n))
            verses.append(Verse(book, int(c), int(v), text))
    return verses


def chapters(verses):
    out = OrderedDict()
    for v in verses:
        out.setdefault((v.book, v.chapter), []).append(v)
    return out


def split_heldout(verses):
    """(train chapters, held-out chapters), each an OrderedDict (book, chapter) -> [Verse]."""
    train, held = OrderedDict(), OrderedDict()
    for i, (key, vs) in enumerate(chapters(verses).items()):
        target = held if (i % HELDOUT_EVERY == HELDOUT_PHASE and key not in PROTECTED) else train
        target[key] = vs
    return train, held


def say_book(book, rng):
    return "Psalm" if book == "Psalms" and rng.random() < 0.7 else book


def answer_ref(v):
    return "%s %d:%d" % ("Psalm" if v.book == "Psalms" else v.book, v.chapter, v.verse)


def say_ref(v, rng):
    return "%s %d:%d" % (say_book(v.book, rng), v.chapter, v.verse)


# ---------------------------------------------------------------- raw documents

def raw_text(vs, style):
    if style == "ref":
        return "\n".join("%s %s" % (v.ref(), v.text) for v in vs)
    return " ".join(v.text for v in vs)


def raw_docs(chaps, rng):
    """[(text, style)] for runs of 2-10 verses; styles alternate at random (half reference lines)."""
    docs = []
    for vs in chaps.values():
        i = 0
        while i < len(vs):
            n = rng.randint(2, 10)
            style = "ref" if rng.random() < 0.5 else "prose"
            docs.append((raw_text(vs[i:i + n], style), style))
            i += n
    return docs


# ---------------------------------------------------------------- chat conversations

def _user(text):
    return {"role": "user", "content": text}


def _model(text, **extra):
    m = {"role": "assistant", "content": text}
    m.update(extra)
    return m


class ChatMaker:
    def __init__(self, chaps, rng):
        self.rng = rng
        self.chaps = chaps
        self.keys = list(chaps)
        self.all = [v for vs in chaps.values() for v in vs]

    def verse(self):
        return self.rng.choice(self.all)

    def exchange(self, kind):
        """One (user text, answer text) pair of a given kind."""
        rng = self.rng
        if kind == "recite":
            v = self.verse()
            return rng.choice(RECITE).format(r=say_ref(v, rng)), v.text
        if kind == "range":
            vs = self.chaps[rng.choice(self.keys)]
            a = rng.randrange(len(vs))
            b = min(len(vs), a + rng.randint(2, 4))
            if b - a < 2:
                return self.exchange("recite")
            r = "%s %d:%d-%d" % (say_book(vs[a].book, rng), vs[a].chapter, vs[a].verse, vs[b - 1].verse)
            return rng.choice(RANGE).format(r=r), " ".join(v.text for v in vs[a:b])
        if kind == "chapter":
            key = rng.choice(self.keys)
            vs = self.chaps[key]
            return (rng.choice(CHAPTER).format(b=say_book(key[0], rng), c=key[1]),
                    " ".join(v.text for v in vs[:6]))
        if kind == "continue":
            v = self.verse()
            w = v.text.split(" ")
            if len(w) < 6:
                return self.exchange("recite")
            k = rng.randint(max(2, len(w) * 3 // 10), max(2, len(w) * 7 // 10))
            return rng.choice(CONTINUE).format(h=" ".join(w[:k])), " ".join(w[k:])
        if kind == "which":
            v = self.verse()
            return rng.choice(WHICH).format(t=v.text), "That is %s." % answer_ref(v)
        if kind == "next":
            vs = self.chaps[rng.choice(self.keys)]
            if len(vs) < 2:
                return self.exchange("recite")
            i = rng.randrange(len(vs) - 1)
            return rng.choice(NEXT).format(r=say_ref(vs[i], rng)), vs[i + 1].text
        if kind == "smalltalk":
            return rng.choice(SMALLTALK)
        raise ValueError(kind)

    def conversation(self):
        """{"messages", "tools", "enable_thinking"} for one sampled kind."""
        rng = self.rng
        kind = rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        system = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.25 else []
        if kind == "tool":
            return self.tool_conversation()
        if kind == "tool_direct":
            u, a = self.exchange(rng.choice(["continue", "smalltalk", "next"]))
            return {"messages": [_user(u), _model(a)], "tools": self.tools(), "enable_thinking": False}
        if kind == "multi":
            msgs = list(system)
            for _ in range(rng.randint(2, 3)):
                u, a = self.exchange(rng.choice(["recite", "continue", "next", "range"]))
                msgs += [_user(u), _model(a)]
            return {"messages": msgs, "tools": None, "enable_thinking": False}
        if kind == "think":
            v = self.verse()
            r = say_ref(v, rng)
            thought = rng.choice(["The user asks for %s. I will recite it.", "I need the text of %s.",
                                  "%s is asked for; I quote it."]) % r
            return {"messages": system + [_user(rng.choice(RECITE).format(r=r)),
                                          _model(v.text, reasoning_content=thought)],
                    "tools": None, "enable_thinking": True}
        u, a = self.exchange(kind)
        return {"messages": system + [_user(u), _model(a)], "tools": None, "enable_thinking": False}

    def tools(self):
        return [LOOKUP_TOOL, SEARCH_TOOL] if self.rng.random() < 0.3 else [LOOKUP_TOOL]

    def tool_conversation(self):
        rng = self.rng
        v = self.verse()
        r = say_ref(v, rng)
        call_id = "call_%d" % rng.randint(0, 999)
        call = {"id": call_id, "type": "function", "function": {
            "name": "lookup_verse", "arguments": {"book": v.book, "chapter": v.chapter, "verse": v.verse}}}
        result = v.text if rng.random() < 0.6 else {"text": v.text}
        tool_msg = {"role": "tool", "tool_call_id": call_id, "content": result}
        if rng.random() < 0.5:
            tool_msg["name"] = "lookup_verse"
        answer = v.text if rng.random() < 0.6 else "%s says: %s" % (r, v.text)
        msgs = [_user(rng.choice(LOOKUP).format(r=r)), {"role": "assistant", "tool_calls": [call]},
                tool_msg, _model(answer)]
        return {"messages": msgs, "tools": self.tools(), "enable_thinking": False}


def jinja_env():
    import jinja2
    # The environment transformers' apply_chat_template uses; the template renders the same without it.
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])


def render(template, conv, add_generation_prompt=False):
    return template.render(messages=conv["messages"], tools=conv["tools"],
                           enable_thinking=conv["enable_thinking"],
                           add_generation_prompt=add_generation_prompt, bos_token="<bos>", eos_token="<eos>")


def chat_docs(chaps, rng, template, target_chars):
    """Rendered conversations until their text reaches target_chars."""
    maker, out, n = ChatMaker(chaps, rng), [], 0
    while n < target_chars:
        text = render(template, maker.conversation())
        out.append(text)
        n += len(text)
    return out


def build_view(train_chaps, seed, view, template, chat_share):
    """One epoch's documents: raw [(text, style)] and chat [rendered text], from rng(seed, view)."""
    rng = random.Random("%d/%d" % (seed, view))
    raw = raw_docs(train_chaps, rng)
    raw_chars = sum(len(t) for t, _ in raw)
    chat = chat_docs(train_chaps, rng, template, raw_chars * chat_share / (1.0 - chat_share))
    return raw, chat


def heldout_docs(held_chaps):
    return raw_docs(held_chaps, random.Random("heldout"))


# Prompts whose continuations go into the parity set and the printed samples. "chat" ones are rendered by
# the chat template with a generation prompt; "raw" ones are tokenized with <bos>.
PARITY_PROMPTS = [
    {"name": "raw_genesis", "kind": "raw", "text": "In the beginning"},
    {"name": "raw_psalm", "kind": "raw", "text": "Psalms 23:1 The LORD is my shepherd"},
    {"name": "chat_recite", "kind": "chat", "conv": {"messages": [_user("Recite John 3:16.")],
                                                     "tools": None, "enable_thinking": False}},
    {"name": "chat_tool", "kind": "chat", "conv": {"messages": [_user("Look up Romans 8:28.")],
                                                   "tools": [LOOKUP_TOOL], "enable_thinking": False}},
]
DEMO_PROMPT = "Recite Psalm 23."
