#!/usr/bin/env bash
# Install the Debian packages lumen needs to build and test. Idempotent: packages
# already present are skipped, and apt is not touched at all when nothing is missing.
# Works as root on a fresh Debian 12 machine; uses sudo when run as another user.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  clang-format          # `make test` checks the tree against .clang-format
  libjansson-dev        # JSON: configs, safetensors headers, tokenizer.json, HTTP bodies
  libmicrohttpd-dev     # HTTP server
  libcurl4-openssl-dev  # HTTPS client of `lumen get` (the Hugging Face hub); TLS is not ours to write
  libcmocka-dev         # unit tests
  libpcre2-dev          # regex pre-tokenizers (Llama 3, Qwen 3)
  libutf8proc-dev       # NFC normalization
  libopenblas-openmp-dev # fp32 GEMM for CPU prefill; shares libgomp's pool with our kernels
  nodejs npm            # test-time tokenizer goldens and the OpenAI client conformance test
  chromium              # the headless browser that tests the chat page of `lumen serve` (test_web_chat)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# node/npm may come from outside Debian (the image ships Node 20): accept any working node+npm.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  filtered=()
  for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]}")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "bootstrap: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
