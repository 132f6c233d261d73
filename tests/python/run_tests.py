"""run_tests.py LIBLOOM CLI SOURCE_DIR — runs the Python package's tests (tests/python/
test_*.py, unittest) against the libloom.so at LIBLOOM, with the package from
SOURCE_DIR/python. CLI is the `loom` binary (greedy output to compare with). Exit 77
(CTest: skipped) when this interpreter has no NumPy (use Debian's /usr/bin/python3 with
python3-numpy). A sanitizer build of LIBLOOM runs with its runtime preloaded
(LD_PRELOAD, leak checking off: the interpreter's own allocations are not leaks).
Registered in tests/CMakeLists.txt as test_python (labels unit, model).
"""
import os
import subprocess
import sys
import unittest


def sanitizer_runtime(lib):
    """For a sanitizer build of libloom.so (which an uninstrumented python3 cannot dlopen:
    "ASan runtime does not come first"), the runtime libraries to preload, found with
    the C compiler; None when lib loads as it is; [] when it cannot be helped."""
    probe = [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", lib]
    r = subprocess.run(probe, capture_output=True, text=True)
    if r.returncode == 0:
        return None
    if "runtime does not come first" not in r.stderr:
        return None  # another problem: let the import report it
    pre = []
    for name in ("libasan.so", "libubsan.so"):
        try:
            path = subprocess.run(["cc", "-print-file-name=" + name], capture_output=True, text=True).stdout.strip()
        except OSError:
            return []
        if os.path.isabs(path) and os.path.exists(path):
            pre.append(os.path.realpath(path))
    return pre


def main():
    if len(sys.argv) != 4:
        print("usage: run_tests.py LIBLOOM CLI SOURCE_DIR", file=sys.stderr)
        return 2
    lib, cli, src = (os.path.abspath(a) for a in sys.argv[1:])
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: %s has no NumPy (install python3-numpy)" % sys.executable)
        return 77
    if "LOOM_TESTS_PRELOADED" not in os.environ:
        pre = sanitizer_runtime(lib)
        if pre is not None:
            if not pre:
                print("SKIP: %s is a sanitizer build and its runtime was not found to preload" % lib)
                return 77
            # Python itself leaks by ASan's count: leak checking is for the C tests. The
            # setting goes last: ASan takes the last of repeated options, and the sanitize
            # preset's test environment sets detect_leaks=1.
            opts = [o for o in os.environ.get("ASAN_OPTIONS", "").split(":") if o] + ["detect_leaks=0"]
            env = dict(os.environ, LD_PRELOAD=":".join(pre), LOOM_TESTS_PRELOADED="1", ASAN_OPTIONS=":".join(opts))
            return subprocess.run([sys.executable] + sys.argv, env=env).returncode
    os.environ["LOOM_LIBRARY"] = lib
    os.environ["LOOM_CLI"] = cli
    os.environ["LOOM_SOURCE_DIR"] = src
    sys.path.insert(0, os.path.join(src, "python"))
    import loom
    print("loom %s from %s, Python %s, NumPy %s" % (loom.__version__, loom.library_path, sys.version.split()[0],
                                                   numpy.__version__))
    here = os.path.dirname(os.path.abspath(__file__))
    suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py", top_level_dir=here)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
