#!/usr/bin/env bash
# Checks that every tracked C, CUDA and header file matches the repository's .clang-format.
# `make test` runs it; `scripts/check_format.sh --fix` rewrites the files in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/lumen-format.$$; then
  grep -m 20 'error:' /tmp/lumen-format.$$ >&2 || true
  rm -f /tmp/lumen-format.$$
  echo "format: files differ from .clang-format (run scripts/check_format.sh --fix)" >&2
  exit 1
fi
rm -f /tmp/lumen-format.$$
echo "format: ${#files[@]} files match .clang-format"
