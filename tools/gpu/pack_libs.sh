#!/usr/bin/env bash
# tools/gpu/pack_libs.sh PACK — copies into PACK/lib the shared libraries that PACK/bin/*
# link and the GPU machine's image does not have (utf8proc, cmocka, libmicrohttpd; it has
# jansson, PCRE2, OpenBLAS and CUDA's own cuBLAS), resolved through this machine's ldd.
# Used by check.sh and serve_bench.sh.
set -euo pipefail
PACK=${1:?usage: pack_libs.sh PACK}
mkdir -p "$PACK/lib"
for b in "$PACK"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libutf8proc.so*|libcmocka.so*|libmicrohttpd.so*) cp -L "$lib" "$PACK/lib/" ;;
  esac
done
