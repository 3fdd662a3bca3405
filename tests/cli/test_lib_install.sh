#!/usr/bin/env bash
# test_lib_install.sh — the installed library: `cmake --install` (what `make install PREFIX=…`
# runs) lays out bin/lumen, lib/liblumen.{a,so}, include/lumen.h and lib/pkgconfig/lumen.pc; the
# shared library has its SONAME and exports exactly what lumen.h declares (internal lm_
# functions stay hidden); a program built with `pkg-config --cflags --libs lumen` links it, and
# one built with `--static` links the archive; both run. Skipped in sanitizer builds, whose
# library needs the sanitizer runtime in every program that links it.
set -euo pipefail
B=${LM_BUILD_DIR:?}
fail() { echo "FAIL: $*"; exit 1; }
if grep -q '^LUMEN_SANITIZE:BOOL=ON' "$B/CMakeCache.txt"; then
  echo "skip: sanitizer build"
  exit 77
fi
for tool in cc pkg-config nm readelf; do
  command -v "$tool" >/dev/null || { echo "skip: no $tool"; exit 77; }
done
P=$B/tmp/prefix-lib
rm -rf "$P"
mkdir -p "$P"
cmake --install "$B" --prefix "$P" >/dev/null || fail "cmake --install"
for f in bin/lumen lib/liblumen.a lib/liblumen.so lib/liblumen.so.0 include/lumen.h \
  lib/pkgconfig/lumen.pc; do
  [ -e "$P/$f" ] || fail "not installed: $f"
done
cmp -s include/lumen.h "$P/include/lumen.h" || fail "installed lumen.h differs from the tree's"
readelf -d "$P/lib/liblumen.so" | grep -q 'SONAME.*\[liblumen\.so\.0\]' || fail "no SONAME liblumen.so.0"
# The installed library loads the OpenBLAS the build linked (and tested), not another variant.
blas=$(sed -n 's/^OPENBLAS_LIBRARY_DIRS:INTERNAL=//p' "$B/CMakeCache.txt" | sed 's:/*$::')
case "$blas" in
  "" | /usr/lib | /usr/lib/x86_64-linux-gnu) ;;
  *) readelf -d "$P/lib/liblumen.so" | grep -E 'R(UN)?PATH' | grep -q "$blas" ||
    fail "installed liblumen.so has no run path to $blas" ;;
esac

# Exports: the functions the header declares (the version script's list), nothing else.
declared=$(sed -n 's/^ *\(lm_[a-z0-9_]*\);$/\1/p' "$B/lumen.map" | sort)
exported=$(nm -D --defined-only "$P/lib/liblumen.so" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort)
[ -n "$exported" ] || fail "liblumen.so exports nothing"
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
[ -z "$extra" ] || fail "exported but not in lumen.h: $(echo $extra)"
for s in lm_version_number lm_errmsg lm_status_name; do
  grep -qx "$s" <<<"$exported" || fail "$s not exported"
done
internal=$(nm --defined-only "$P/lib/liblumen.a" 2>/dev/null | awk '$2 == "T" && $3 ~ /^lm_/ {print $3}' |
  sort -u | comm -23 - <(echo "$declared"))
[ -n "$internal" ] || fail "the archive has no internal lm_ function to hide (the check is void)"
leaked=$(comm -12 <(echo "$internal") <(echo "$exported"))
[ -z "$leaked" ] || fail "internal functions exported: $(echo $leaked)"

# pkg-config finds the installed tree wherever it lies (the prefix is relative to the .pc).
export PKG_CONFIG_PATH=$P/lib/pkgconfig
want=$(sed -n 's/^#define LUMEN_VERSION "\(.*\)"$/\1/p' include/lumen.h)
[ "$(pkg-config --modversion lumen)" = "$want" ] || fail "pkg-config version is not $want"
T=$B/tmp/lib-probe
mkdir -p "$T"
cat >"$T/probe.c" <<'C'
#include <lumen.h>
#include <stdio.h>
int main(void) {
  if (lm_version_number() != LUMEN_VERSION_NUMBER) return 1;
  printf("%d %s [%s]\n", lm_version_number(), lm_status_name(LM_ERR_CORRUPT), lm_errmsg());
  return 0;
}
C
cc -std=c11 -Wall -Wextra -Werror "$T/probe.c" $(pkg-config --cflags --libs lumen) \
  -Wl,-rpath,"$P/lib" -o "$T/probe_shared" || fail "shared link"
readelf -d "$T/probe_shared" | grep -q 'NEEDED.*\[liblumen\.so\.0\]' || fail "probe_shared: no liblumen.so.0"
libs=$(pkg-config --static --libs lumen)
cc -std=c11 -Wall -Wextra -Werror "$T/probe.c" $(pkg-config --cflags lumen) \
  ${libs/-llumen/$P/lib/liblumen.a} -o "$T/probe_static" || fail "static link"
if readelf -d "$T/probe_static" | grep -q 'liblumen\.so'; then fail "probe_static needs liblumen.so"; fi
for p in probe_shared probe_static; do
  out=$("$T/$p") || fail "$p exited non-zero"
  [ "$out" = "$(printf '%d' "$(grep -o 'LUMEN_VERSION_NUMBER [0-9]*' include/lumen.h | cut -d' ' -f2)") LM_ERR_CORRUPT []" ] ||
    fail "$p printed: $out"
done
echo "test_lib_install: ok ($(wc -l <<<"$exported") exports, $(wc -l <<<"$internal") internal hidden)"
