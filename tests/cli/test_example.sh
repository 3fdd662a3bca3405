#!/usr/bin/env bash
# test_example.sh — examples/chat.c, a program that includes only <lumen.h>, built three ways and
# run on the embedded model: the in-tree target (linked to liblumen.so), and against an installed
# tree through pkg-config, shared and static. Two piped turns (the second with quotes and a
# backslash, which the example escapes into its JSON messages) must each give a non-empty
# answer, exit 0, and, greedy, the same text from all three. Skipped in sanitizer builds.
set -euo pipefail
B=${LM_BUILD_DIR:?}
M=models/lumen-tiny-kjv
fail() { echo "FAIL: $*"; exit 1; }
if grep -q '^LUMEN_SANITIZE:BOOL=ON' "$B/CMakeCache.txt"; then
  echo "skip: sanitizer build"
  exit 77
fi
command -v pkg-config >/dev/null || { echo "skip: no pkg-config"; exit 77; }
bad=$(grep '^#include' examples/chat.c | grep -Ev '<(lumen|stdio|stdlib|string)\.h>' || true)
[ -z "$bad" ] || fail "examples/chat.c includes more than lumen.h and libc: $bad"

T=$B/tmp/example
P=$T/prefix
rm -rf "$T"
mkdir -p "$T"
cmake --build "$B" --target lumen_example_chat >"$T/build.log" 2>&1 || {
  cat "$T/build.log"
  fail "the in-tree example target does not build"
}
cmake --install "$B" --prefix "$P" >/dev/null || fail "cmake --install"
export PKG_CONFIG_PATH=$P/lib/pkgconfig
cc -std=c11 -Wall -Wextra -Werror examples/chat.c $(pkg-config --cflags --libs lumen) \
  -Wl,-rpath,"$P/lib" -o "$T/chat_shared" || fail "build against the installed liblumen.so"
libs=$(pkg-config --static --libs lumen)
cc -std=c11 -Wall -Wextra -Werror examples/chat.c $(pkg-config --cflags lumen) \
  ${libs/-llumen/$P/lib/liblumen.a} -o "$T/chat_static" || fail "build against liblumen.a"

turns='Who was Moses?
He said "\o/" and left.
'
for exe in "$B/examples/chat" "$T/chat_shared" "$T/chat_static"; do
  name=$(basename "$exe")
  printf '%s' "$turns" | "$exe" "$M" --max-tokens 24 >"$T/$name.out" 2>"$T/$name.err" ||
    fail "$name exited non-zero: $(cat "$T/$name.err")"
  answers=$(grep -cE '^(> )*\[[1-9][0-9]* bytes, [0-9]+ tokens' "$T/$name.err" || true)
  [ "$answers" = 2 ] || fail "$name: $answers non-empty answers of 2: $(cat "$T/$name.err")"
  grep -q '[[:alnum:]]' "$T/$name.out" || fail "$name printed no answer text"
done
cmp -s "$T/chat.out" "$T/chat_shared.out" || fail "in-tree and installed shared builds answer differently"
cmp -s "$T/chat.out" "$T/chat_static.out" || fail "shared and static builds answer differently"
echo "test_example: ok ($(wc -c <"$T/chat.out") bytes of answers)"
