#!/bin/sh
# Sourced on the GPU machine, whose image has CUDA and PyTorch but not the Debian
# development packages loom builds against (jansson, PCRE2, utf8proc, libmicrohttpd,
# pkg-config).
# Unpacks the .deb files carried in third_party/debs (fetched on a Debian machine
# with `apt-get download`) into /tmp/loomdeps and points the build at them. The set, from
# the repository root: mkdir -p third_party/debs && cd third_party/debs && apt-get download
#   libjansson4 libjansson-dev libpcre2-8-0 libpcre2-dev libutf8proc2 libutf8proc-dev
#   libmicrohttpd12 libmicrohttpd-dev
# (third_party/ is ignored by git; name third_party/debs in the device call's carry).
d=/tmp/loomdeps
if [ ! -d "$d/usr" ]; then
  mkdir -p "$d"
  for f in third_party/debs/*.deb; do dpkg -x "$f" "$d"; done
fi
lib="$d/usr/lib/x86_64-linux-gnu"
export PKG_CONFIG_PATH="$lib/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$d"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$d/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
if ! command -v pkg-config >/dev/null 2>&1; then
  export PATH="$d/usr/bin:$PATH"
  export PKG_CONFIG_LIBDIR="$lib/pkgconfig"
fi
