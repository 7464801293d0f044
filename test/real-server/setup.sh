#!/usr/bin/env bash
# Provides a pinned llama.cpp `llama-server` for the real-server tests (npm run test:real).
#
# The source is the git bundle that the npm package node-llama-cpp ships (package/llama/
# gitRelease.bundle, llama.cpp release $LLAMA_TAG at a pinned commit); only the `llama-server` target is built, statically linked,
# with CMake + Ninja, for a generic x86-64/arm64 CPU (GGML_NATIVE=OFF, so a cached binary also runs
# on another CPU model). The result is cached outside the repo in
#   ${XDG_CACHE_HOME:-~/.cache}/dsh/llama-server/$LLAMA_SERVER_VERSION/bin/llama-server
# so only the first run on a machine pays for the build (≈15–30 min on 2 cores). The build happens in
# a temporary directory beside the cache entry and is renamed into place only once the binary
# answers `--version`: an interrupted run leaves no half-finished cache entry. Concurrent runs wait
# on a lock. Nothing is written into the repository.
#
# Beside the binary: templates/$LLAMA_CHAT_TEMPLATE, a tool-capable chat template from the same tree.
#
# Usage: test/real-server/setup.sh        prints progress on stderr, the binary's path on stdout
# Env:   DSH_LLAMA_BUILD_JOBS  parallel compile jobs (default: number of cores)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=pin.env
. "$here/pin.env"

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/dsh/llama-server"
final="$cache_root/$LLAMA_SERVER_VERSION"
bin="$final/bin/llama-server"

template="$final/templates/$LLAMA_CHAT_TEMPLATE"
log() { printf '[setup %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# The source: node-llama-cpp's tarball (npm pack: the tarball only, no install) → its git bundle →
# a clone at the pinned commit, in $1/src (checked out unless $2 is "--no-checkout").
fetch_source() {
  log "fetching node-llama-cpp@$NODE_LLAMA_CPP_VERSION (npm pack: the tarball only, no install)"
  (cd "$1" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP_VERSION" >/dev/null)
  local tarball="$1/node-llama-cpp-$NODE_LLAMA_CPP_VERSION.tgz"
  [ -f "$tarball" ] || { log "npm pack produced no $tarball"; exit 1; }
  tar -xzf "$tarball" -C "$1" package/llama/gitRelease.bundle
  log "cloning llama.cpp $LLAMA_TAG from the bundled git bundle"
  git -c advice.detachedHead=false clone --quiet ${2:-} "$1/package/llama/gitRelease.bundle" "$1/src" >&2
  commit="$(git -C "$1/src" rev-parse HEAD)"
  [ "$commit" = "$LLAMA_COMMIT" ] || { log "the bundle's HEAD is $commit, expected $LLAMA_COMMIT (pin.env): refusing to use it"; exit 1; }
  log "source commit $commit (as pinned)"
  rm -rf "$1/package" "$tarball"
}

# $1: a clone of the source; writes the chat template into $2 (a directory).
install_template() {
  mkdir -p "$2"
  git -C "$1" show "HEAD:models/templates/$LLAMA_CHAT_TEMPLATE" >"$2/$LLAMA_CHAT_TEMPLATE.tmp"
  mv "$2/$LLAMA_CHAT_TEMPLATE.tmp" "$2/$LLAMA_CHAT_TEMPLATE"
}

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  if [ ! -s "$template" ]; then # an entry made before the template was pinned: fetch only that (seconds)
    tmp="$(mktemp -d "$cache_root/.template-XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    fetch_source "$tmp" --no-checkout
    install_template "$tmp/src" "$final/templates"
    log "installed $template"
  fi
  log "cached: $bin"
  echo "$bin"
  exit 0
fi

# Build tools: a fresh CI machine may lack them.
need=()
command -v git   >/dev/null || need+=(git)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v c++   >/dev/null || need+=(g++)
command -v npm   >/dev/null || { log "npm is required (it fetches node-llama-cpp@$NODE_LLAMA_CPP_VERSION)"; exit 1; }
if [ ${#need[@]} -gt 0 ]; then
  log "installing build tools: ${need[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { log "missing ${need[*]} and not root (no sudo): install them and rerun"; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2
fi

mkdir -p "$cache_root"
# One build at a time per machine; a second run waits, then finds the cache filled.
exec 9>"$cache_root/.lock"
if command -v flock >/dev/null; then
  log "waiting for the build lock" ; flock 9
  if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1 && [ -s "$template" ]; then log "cached (built meanwhile): $bin"; echo "$bin"; exit 0; fi
fi

rm -rf "$final"   # a broken entry (no binary, or one that does not run) is rebuilt
rm -rf "$cache_root"/.build-*   # left by a killed run (we hold the lock: no other build is running)
work="$(mktemp -d "$cache_root/.build-XXXXXX")"
trap 'rm -rf "$work"' EXIT
start=$(date +%s)

fetch_source "$work"

log "configuring (CMake + Ninja, Release, static, GGML_NATIVE=OFF)"
cmake -S "$work/src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF >"$work/configure.log" 2>&1 || { tail -40 "$work/configure.log" >&2; exit 1; }
jobs="${DSH_LLAMA_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}"
log "building target llama-server with $jobs jobs (the long part)"
# Ninja prints one status line per compiled file: keep the progress visible, the noise out.
cmake --build "$work/build" --target llama-server -j "$jobs" 2>&1 \
  | tee "$work/build.log" | grep --line-buffered -E '^\[[0-9]+/[0-9]+\]' \
  | awk '{ n++; if (n % 20 == 0) { print "[setup] compiled " $1; fflush() } }' >&2
[ "${PIPESTATUS[0]}" = 0 ] || { tail -40 "$work/build.log" >&2; exit 1; }

built="$work/build/bin/llama-server"
[ -x "$built" ] || { log "no binary at $built"; tail -20 "$work/build.log" >&2; exit 1; }
version="$("$built" --version 2>&1 | tr '\n' ' ')"
log "built: $version"
mkdir -p "$work/out/bin"
cp "$built" "$work/out/bin/llama-server"
install_template "$work/src" "$work/out/templates"
strip "$work/out/bin/llama-server" 2>/dev/null || true
"$work/out/bin/llama-server" --version >/dev/null 2>&1 || { log "the installed binary does not run"; exit 1; }
printf 'node-llama-cpp %s, llama.cpp %s, commit %s\nbuilt %s in %ss\n%s\n' \
  "$NODE_LLAMA_CPP_VERSION" "$LLAMA_TAG" "$commit" \
  "$(date -u +%FT%TZ)" "$(( $(date +%s) - start ))" "$version" >"$work/out/BUILD-INFO"
mv "$work/out" "$final"   # atomic on one file system: the cache entry appears complete or not at all
log "done in $(( $(date +%s) - start )) s: $bin"
echo "$bin"
