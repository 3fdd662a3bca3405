# lib.sh — what several tests/cli scripts share; sourced as `. "$(dirname "$0")/lib.sh"` (relative
# to the script, since ctest runs the scripts from the source root). The functions call the
# sourcing script's own fail(), so each failure keeps that script's prefix and exit code.

# lm_serve_start OUT LOG SECONDS ARGS...: `$LUMEN_BIN serve ARGS...` (ARGS should hold --port 0)
# in the background, stdout to OUT and stderr to LOG. Sets PID at once, so the caller's EXIT trap
# can kill a server that never got to listen, and PORT once OUT has the "listening on
# http://127.0.0.1:PORT/v1" line: the port the kernel picked is known only from that line. Fails
# when the server exits first or SECONDS pass without the line.
lm_serve_start() {
  local out=$1 log=$2 secs=$3 i
  shift 3
  : >"$out" # exists before the background shell opens it, so the poll never reads a missing file
  "${LUMEN_BIN:?LUMEN_BIN is not set}" serve "$@" >"$out" 2>"$log" &
  PID=$!
  PORT=
  for ((i = 0; i < secs * 10; i++)); do
    PORT=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/v1.*|\1|p' "$out" || true)
    [ -n "$PORT" ] && return 0
    kill -0 "$PID" 2>/dev/null || fail "the server exited: $(cat "$log")"
    sleep 0.1
  done
  fail "no 'listening on' line within $secs s"
}

# lm_serve_stop [SIGNAL]: sends SIGNAL (default TERM) to the server lm_serve_start started, waits for
# it and clears PID (so the caller's EXIT trap has nothing left to kill); returns its exit status.
lm_serve_stop() {
  local rc=0
  kill "-${1:-TERM}" "$PID"
  wait "$PID" || rc=$?
  PID=
  return $rc
}

# lm_need_node NAME [WHAT]: exits 77 (ctest's skip) with "NAME: ..." on stderr unless node >= 20 and
# npm are on the PATH; WHAT says which part of the test is skipped.
lm_need_node() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "$1: node/npm missing${2:+, $2 skipped}" >&2
    exit 77
  fi
  [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] || { echo "$1: node >= 20 needed" >&2; exit 77; }
}

# lm_npm_install PREFIX NAME@VERSION...: the pinned npm packages under PREFIX/node_modules,
# installed (all of them, in one npm run) unless every one is already there at its version.
# npm's own output goes to the caller's stdout / stderr. Returns npm's failure, for the caller
# to skip or fail on. Each test keeps its own PREFIX: two npm installs into one prefix at once
# (ctest -j) make one of them fail.
lm_npm_install() {
  local prefix=$1 spec have
  shift
  for spec in "$@"; do
    have=$(node -p "try{require('$prefix/node_modules/${spec%@*}/package.json').version}catch(e){''}")
    if [ "$have" != "${spec##*@}" ]; then
      mkdir -p "$prefix"
      timeout 300 npm install --prefix "$prefix" --no-save --no-audit --no-fund --silent "$@"
      return
    fi
  done
}
