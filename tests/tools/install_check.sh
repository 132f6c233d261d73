#!/bin/sh
# install_check.sh BUILD_DIR SOURCE_DIR — tests `cmake --install` and the installed
# package: installs the build tree BUILD_DIR into a temporary prefix, builds
# examples/c/generate.c against it four ways (CMake find_package with loom::loom and
# with loom::loom_static; pkg-config with -lloom and with libloom.a plus
# `pkg-config --static --libs`), runs each on SOURCE_DIR/models/default and checks it
# prints the prompt followed by a non-empty continuation. Also checks the installed
# layout (headers, SONAME links, loomConfig*.cmake, loom.pc) and that
# find_package(loom COMPONENTS CUDA) fails on a build without CUDA. And the installed
# Python package (P/share/loom/python/loom) runs examples/python/generate.py from outside
# the source tree, finding the installed libloom.so by itself and through LOOM_LIBRARY.
#
# Compiler and flags: the example is built with the build tree's CMAKE_C_COMPILER,
# CMAKE_C_FLAGS and CMAKE_EXE_LINKER_FLAGS (read from BUILD_DIR/CMakeCache.txt), so a
# sanitizer build (the `sanitize` preset: -fsanitize=address,undefined in the library)
# links the example with the same runtime. No timing is measured.
# Exit 77 (CTest: skipped) when cmake or a C compiler is missing. Registered in
# tests/CMakeLists.txt as test_install_check (label unit).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
    exit 2
fi
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
cache="$build/CMakeCache.txt"
[ -f "$cache" ] || { echo "install_check: $cache is missing (configure first)" >&2; exit 1; }

cache_get() { # the value of a cache entry, "" when absent
    sed -n "s/^$1:[A-Z]*=//p" "$cache" | head -n 1
}

CMAKE=$(cache_get CMAKE_COMMAND)
[ -x "$CMAKE" ] || CMAKE=$(command -v cmake || true)
CC_BIN=$(cache_get CMAKE_C_COMPILER)
[ -n "$CC_BIN" ] && [ -x "$CC_BIN" ] || CC_BIN=$(command -v cc || true)
if [ -z "$CMAKE" ] || [ -z "$CC_BIN" ]; then
    echo "install_check: SKIP: cmake or a C compiler is missing" >&2
    exit 77
fi
PKG_CONFIG=$(cache_get PKG_CONFIG_EXECUTABLE)
[ -n "$PKG_CONFIG" ] && [ -x "$PKG_CONFIG" ] || PKG_CONFIG=$(command -v pkg-config || true)
[ -n "$PKG_CONFIG" ] || { echo "install_check: pkg-config is missing (the build needed it)" >&2; exit 1; }
CFLAGS_EXTRA=$(cache_get CMAKE_C_FLAGS)
LDFLAGS_EXTRA=$(cache_get CMAKE_EXE_LINKER_FLAGS)

model="$src/models/default"
[ -f "$model/config.json" ] || { echo "install_check: no model in $model" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/loom-install-check.XXXXXX")
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
prefix="$tmp/prefix"
fails=0
fail() { echo "install_check: FAIL: $*" >&2; fails=$((fails + 1)); }

echo "== cmake --install $build --prefix $prefix"
"$CMAKE" --install "$build" --prefix "$prefix" > "$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log" >&2
    echo "install_check: FAIL: cmake --install" >&2
    exit 1
}

# ---- layout ------------------------------------------------------------------------
pc=$(find "$prefix" -name loom.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { echo "install_check: FAIL: no loom.pc installed" >&2; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
echo "   libdir $libdir"
for f in "$prefix/include/loom/loom.h" "$prefix/include/loom/base.h" "$prefix/include/loom/generate.h" \
         "$libdir/libloom.a" "$libdir/libloom.so" "$libdir/libloom.so.0" "$libdir/libloom.so.0.1.0" \
         "$libdir/cmake/loom/loomConfig.cmake" "$libdir/cmake/loom/loomConfigVersion.cmake" "$prefix/bin/loom"; do
    [ -e "$f" ] || fail "missing $f"
done
[ -L "$libdir/libloom.so" ] || fail "$libdir/libloom.so is not a symlink"
nh=$(ls "$src"/include/loom/*.h | wc -l)
ni=$(ls "$prefix"/include/loom/*.h | wc -l)
[ "$nh" -eq "$ni" ] || fail "$ni headers installed, the source tree has $nh"
if grep -q 'loom_HAVE_CUDA ON' "$libdir/cmake/loom/loomConfig.cmake"; then have_cuda=1; else have_cuda=0; fi

export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

prompt="The capital of France is"
run_check() { # NAME BINARY: runs it on the default model and checks the continuation
    name=$1 bin=$2
    if ! "$bin" "$model" "$prompt" 8 > "$tmp/$name.out" 2> "$tmp/$name.err"; then
        cat "$tmp/$name.err" >&2
        fail "$name: $bin exited with an error"
        return 0
    fi
    out=$(cat "$tmp/$name.out")
    rest=${out#"$prompt"}
    if [ "$rest" = "$out" ]; then
        fail "$name: the output does not start with the prompt: '$out'"
    elif [ -z "$(printf '%s' "$rest" | tr -d ' \t\n')" ]; then
        fail "$name: empty continuation: '$out'"
    else
        echo "   $name: $out"
    fi
}

# ---- CMake: find_package(loom) -------------------------------------------------------
for kind in shared static; do
    static=OFF
    [ $kind = static ] && static=ON
    echo "== CMake build ($kind)"
    if "$CMAKE" -S "$src/examples/c" -B "$tmp/cmake-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
            -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_BUILD_TYPE=Release -DLOOM_EXAMPLE_STATIC=$static \
            -DCMAKE_C_FLAGS="$CFLAGS_EXTRA" -DCMAKE_EXE_LINKER_FLAGS="$LDFLAGS_EXTRA" \
            > "$tmp/cmake-$kind.log" 2>&1 &&
        "$CMAKE" --build "$tmp/cmake-$kind" >> "$tmp/cmake-$kind.log" 2>&1; then
        run_check "cmake-$kind" "$tmp/cmake-$kind/generate"
    else
        cat "$tmp/cmake-$kind.log" >&2
        fail "CMake build ($kind)"
    fi
done

# ---- CMake: the CUDA component ----------------------------------------------------------
mkdir -p "$tmp/cuda-src"
cat > "$tmp/cuda-src/CMakeLists.txt" <<'CML'
cmake_minimum_required(VERSION 3.25)
project(loom_cuda_component LANGUAGES C)
find_package(loom REQUIRED COMPONENTS CUDA)
CML
if "$CMAKE" -S "$tmp/cuda-src" -B "$tmp/cuda-build" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_C_COMPILER="$CC_BIN" > "$tmp/cuda.log" 2>&1; then
    [ $have_cuda = 1 ] || fail "find_package(loom COMPONENTS CUDA) succeeded on a build without CUDA"
else
    [ $have_cuda = 0 ] || { cat "$tmp/cuda.log" >&2; fail "find_package(loom COMPONENTS CUDA) failed on a CUDA build"; }
fi
echo "== find_package(loom COMPONENTS CUDA) as expected for CUDA=$have_cuda"

# ---- pkg-config ------------------------------------------------------------------------------
echo "== pkg-config build (shared)"
# shellcheck disable=SC2046,SC2086
if flags=$("$PKG_CONFIG" --cflags --libs loom) &&
    "$CC_BIN" -std=c11 $CFLAGS_EXTRA "$src/examples/c/generate.c" -o "$tmp/pc-shared" $flags $LDFLAGS_EXTRA \
        > "$tmp/pc-shared.log" 2>&1; then
    run_check pc-shared "$tmp/pc-shared"
else
    cat "$tmp/pc-shared.log" >&2 2>/dev/null || true
    fail "pkg-config build (shared)"
fi
echo "== pkg-config build (static: libloom.a + pkg-config --static --libs)"
# shellcheck disable=SC2046,SC2086
if sflags=$("$PKG_CONFIG" --static --libs loom) && cflags=$("$PKG_CONFIG" --cflags loom) &&
    sflags=$(printf ' %s ' "$sflags" | sed 's/ -lloom / /g') &&
    "$CC_BIN" -std=c11 $CFLAGS_EXTRA $cflags "$src/examples/c/generate.c" -o "$tmp/pc-static" "$libdir/libloom.a" \
        $sflags $LDFLAGS_EXTRA > "$tmp/pc-static.log" 2>&1; then
    run_check pc-static "$tmp/pc-static"
else
    cat "$tmp/pc-static.log" >&2 2>/dev/null || true
    fail "pkg-config build (static)"
fi

# ---- Python: the installed package finds the installed library -----------------------------
# examples/python/generate.py copied outside the source tree, run with PYTHONPATH at the
# installed package: once with discovery alone (no LOOM_LIBRARY, no LD_LIBRARY_PATH: the
# package must find P/lib*/libloom.so.0 itself) and once with LOOM_LIBRARY naming the
# installed library. Prefers Debian's /usr/bin/python3 (NumPy: the example also prints
# logits); skipped, not failed, without a Python 3 or for a sanitizer build (an ASan
# libloom.so cannot be loaded by an uninstrumented python3).
pkgdir="$prefix/share/loom/python"
[ -f "$pkgdir/loom/__init__.py" ] || fail "missing $pkgdir/loom/__init__.py (the Python package)"
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 || true)
case "$CFLAGS_EXTRA" in *-fsanitize=*) san=1 ;; *) san=0 ;; esac
if [ -z "$PY" ] || [ $san = 1 ] || [ ! -f "$pkgdir/loom/__init__.py" ]; then
    echo "== Python: skipped (python3: '${PY:-none}', sanitizer build: $san)"
else
    mkdir -p "$tmp/py"
    cp "$src/examples/python/generate.py" "$tmp/py/generate.py"
    cat > "$tmp/py/discover" <<PYSH
#!/bin/sh
cd "$tmp/py" && exec env -u LOOM_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$pkgdir" "$PY" generate.py "\$@"
PYSH
    cat > "$tmp/py/explicit" <<PYSH
#!/bin/sh
cd "$tmp/py" && exec env -u LD_LIBRARY_PATH PYTHONPATH="$pkgdir" LOOM_LIBRARY="$libdir/libloom.so" "$PY" generate.py "\$@"
PYSH
    chmod +x "$tmp/py/discover" "$tmp/py/explicit"
    echo "== Python ($PY): import loom from $pkgdir"
    found=$(cd "$tmp/py" && env -u LOOM_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$pkgdir" "$PY" -c \
        'import loom; print(loom.library_path)' 2> "$tmp/py/import.err") || { cat "$tmp/py/import.err" >&2; found=""; }
    case "$found" in
        "$libdir"/libloom.so*) echo "   found $found" ;;
        *) fail "Python: the installed package did not find the installed library (got '$found')" ;;
    esac
    run_check python-discover "$tmp/py/discover"
    run_check python-explicit "$tmp/py/explicit"
fi

if [ $fails -ne 0 ]; then
    echo "install_check: $fails failure(s)" >&2
    exit 1
fi
echo "install_check: OK"
