"""loom._lib — finds libloom.so, declares the C structs and functions the package
uses (ctypes mirrors of include/loom/*.h), and turns a failing lm_status into a
loom.Error carrying lm_last_error().

Discovery order (the first library that loads and exports every function used wins):
  1. $LOOM_LIBRARY, an explicit path (nothing else is tried when it is set);
  2. a build tree around the package: <root>/build/release/libloom.so, then
     <root>/build/*/libloom.so, newest first (<root> = python/..), passing over
     sanitizer builds (they abort an uninstrumented interpreter);
  3. an installed prefix around the package (<prefix>/share/loom/python/loom or
     <prefix>/lib/python3*/.../loom): <prefix>/lib*/libloom.so.<major>;
  4. the dynamic loader's search path (LD_LIBRARY_PATH, ld.so.cache): libloom.so.<major>,
     then ctypes.util.find_library("loom").
ImportError lists every candidate tried and why it was refused.
"""
import ctypes
import ctypes.util
import glob
import os

SOVERSION = 0  # LM_VERSION_MAJOR: the SONAME libloom.so.0

c_status = ctypes.c_int
c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_int32_p = ctypes.POINTER(ctypes.c_int32)

LM_MAX_DIMS = 8
DTYPES = ("f32", "bf16", "f16", "i32", "i64", "u8", "i8")  # lm_dtype values 0..6
DEVICE_CPU, DEVICE_CUDA = 0, 1


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("index", ctypes.c_int)]


class TensorView(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("device", Device), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * LM_MAX_DIMS), ("stride", ctypes.c_int64 * LM_MAX_DIMS)]


class SamplerParams(ctypes.Structure):
    _fields_ = [("greedy", ctypes.c_int), ("temperature", ctypes.c_float), ("top_k", ctypes.c_int),
                ("top_p", ctypes.c_float), ("min_p", ctypes.c_float), ("repetition_penalty", ctypes.c_float),
                ("seed", ctypes.c_uint64)]


class GenerateParams(ctypes.Structure):
    _fields_ = [("max_new_tokens", ctypes.c_int64), ("sampler", SamplerParams),
                ("stop", ctypes.POINTER(ctypes.c_char_p)), ("n_stop", ctypes.c_int), ("ignore_eos", ctypes.c_int),
                ("decode_flags", ctypes.c_uint)]


class GenerateResult(ctypes.Structure):
    _fields_ = [("prompt_tokens", ctypes.c_int64), ("new_tokens", ctypes.c_int64), ("reason", ctypes.c_int),
                ("prefill_seconds", ctypes.c_double), ("decode_seconds", ctypes.c_double)]


class RopeScaling(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("factor", ctypes.c_double), ("low_freq_factor", ctypes.c_double),
                ("high_freq_factor", ctypes.c_double), ("original_max_position_embeddings", ctypes.c_int64),
                ("beta_fast", ctypes.c_double), ("beta_slow", ctypes.c_double),
                ("attention_factor", ctypes.c_double), ("mscale", ctypes.c_double),
                ("mscale_all_dim", ctypes.c_double), ("truncate", ctypes.c_int)]


class GenerationDefaults(ctypes.Structure):
    _fields_ = [("present", ctypes.c_int), ("do_sample", ctypes.c_int), ("temperature", ctypes.c_double),
                ("top_k", ctypes.c_int64), ("top_p", ctypes.c_double)]


class ModelConfig(ctypes.Structure):
    _fields_ = [("arch", ctypes.c_int), ("vocab_size", ctypes.c_int64), ("hidden_size", ctypes.c_int64),
                ("intermediate_size", ctypes.c_int64), ("num_hidden_layers", ctypes.c_int64),
                ("num_attention_heads", ctypes.c_int64), ("num_key_value_heads", ctypes.c_int64),
                ("head_dim", ctypes.c_int64), ("max_position_embeddings", ctypes.c_int64),
                ("rms_norm_eps", ctypes.c_double), ("rope_theta", ctypes.c_double), ("rope_scaling", RopeScaling),
                ("tie_word_embeddings", ctypes.c_int), ("qkv_bias", ctypes.c_int), ("o_bias", ctypes.c_int),
                ("mlp_bias", ctypes.c_int), ("qk_norm", ctypes.c_int), ("sliding_window", ctypes.c_int64),
                ("sliding_window_first_layer", ctypes.c_int64), ("dtype", ctypes.c_int),
                ("dtype_given", ctypes.c_int), ("bos_token_id", ctypes.c_int64), ("pad_token_id", ctypes.c_int64),
                ("n_eos", ctypes.c_int), ("eos_token_ids", ctypes.c_int64 * 16),
                ("generation", GenerationDefaults), ("reserved", ctypes.c_int64 * 16)]


RELEASE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)  # lm_release_fn(user, data)
TOKEN_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t)

P = ctypes.c_void_p  # opaque handles (lm_tensor *, lm_model *, ...)
VIEW_P = ctypes.POINTER(TensorView)

# name: (restype, argtypes). restype c_status means "raise loom.Error on failure".
PROTOTYPES = {
    "lm_version": (ctypes.c_char_p, []),
    "lm_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "lm_last_error": (ctypes.c_char_p, []),
    "lm_clear_error": (None, []),
    "lm_free": (None, [P]),
    "lm_cuda_device_count": (ctypes.c_int, []),
    "lm_cuda_compiled": (ctypes.c_int, []),
    "lm_device_parse": (c_status, [ctypes.c_char_p, ctypes.POINTER(Device)]),
    "lm_device_copy": (c_status, [Device, P, Device, P, ctypes.c_size_t]),
    "lm_ctx_create": (c_status, [Device, ctypes.c_int, ctypes.POINTER(P)]),
    "lm_ctx_destroy": (None, [P]),
    "lm_ctx_synchronize": (c_status, [P]),
    "lm_device_synchronize": (c_status, [Device]),
    # tensors
    "lm_tensor_wrap": (c_status, [Device, P, ctypes.c_int, ctypes.c_int, c_int64_p, c_int64_p, RELEASE_FN, P,
                                  ctypes.POINTER(P)]),
    "lm_tensor_create": (c_status, [Device, ctypes.c_int, ctypes.c_int, c_int64_p, ctypes.POINTER(P)]),
    "lm_tensor_zeros": (c_status, [Device, ctypes.c_int, ctypes.c_int, c_int64_p, ctypes.POINTER(P)]),
    "lm_tensor_destroy": (None, [P]),
    "lm_tensor_as_view": (VIEW_P, [P]),
    "lm_tensor_from_view": (c_status, [P, VIEW_P, ctypes.POINTER(P)]),
    "lm_tensor_contiguous": (c_status, [P, P, ctypes.POINTER(P)]),
    "lm_tensor_to_device": (c_status, [P, P, Device, ctypes.POINTER(P)]),
    "lm_tensor_view_reshape": (c_status, [VIEW_P, ctypes.c_int, c_int64_p, VIEW_P]),
    "lm_tensor_view_transpose": (c_status, [VIEW_P, ctypes.c_int, ctypes.c_int, VIEW_P]),
    "lm_tensor_view_permute": (c_status, [VIEW_P, c_int32_p, VIEW_P]),
    "lm_tensor_view_slice": (c_status, [VIEW_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, VIEW_P]),
    "lm_tensor_view_select": (c_status, [VIEW_P, ctypes.c_int, ctypes.c_int64, VIEW_P]),
    "lm_tensor_view_copy": (c_status, [P, VIEW_P, VIEW_P]),
    "lm_tensor_view_read": (c_status, [P, VIEW_P, P]),
    "lm_tensor_view_write": (c_status, [P, VIEW_P, P]),
    "lm_tensor_view_poison": (c_status, [P, VIEW_P]),
    # tokenizer
    "lm_tokenizer_load": (c_status, [ctypes.c_char_p, ctypes.POINTER(P)]),
    "lm_tokenizer_destroy": (None, [P]),
    "lm_tokenizer_vocab_size": (ctypes.c_int32, [P]),
    "lm_tokenizer_encode": (c_status, [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(c_int32_p),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "lm_tokenizer_decode": (c_status, [P, c_int32_p, ctypes.c_size_t, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "lm_tokenizer_token_to_id": (c_status, [P, ctypes.c_char_p, ctypes.c_size_t, c_int32_p]),
    # model
    "lm_model_load": (c_status, [ctypes.c_char_p, Device, ctypes.POINTER(P)]),
    "lm_model_destroy": (None, [P]),
    "lm_model_get_config": (ctypes.POINTER(ModelConfig), [P]),
    "lm_kv_cache_create": (c_status, [P, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(P)]),
    "lm_kv_cache_destroy": (None, [P]),
    "lm_kv_cache_length": (ctypes.c_int64, [P, ctypes.c_int]),
    "lm_kv_cache_reset": (c_status, [P, ctypes.c_int]),
    "lm_model_forward": (c_status, [P, P, P, c_int32_p, ctypes.c_int, c_int32_p, ctypes.c_int64, P, ctypes.c_int]),
    "lm_sampler_params_default": (SamplerParams, []),
    "lm_generate": (c_status, [P, P, P, c_int32_p, ctypes.c_size_t, ctypes.POINTER(GenerateParams), TOKEN_FN, P,
                               ctypes.POINTER(GenerateResult)]),
}

# Operators: (name, inputs (views), scalars (ctypes types), has allocating form).
# The _out form is name + "_out"; inputs come first, then scalars, then the output(s).
OPS = {
    "add": (2, []), "mul": (2, []), "scale": (1, [ctypes.c_float]), "silu": (1, []), "swiglu": (2, []),
    "rmsnorm": (2, [ctypes.c_float]), "softmax": (1, [ctypes.c_float, ctypes.c_int]), "matmul": (2, []),
    "embedding": (2, []),
}
for _name, (_nin, _scalars) in OPS.items():
    PROTOTYPES["lm_%s_out" % _name] = (c_status, [P] + [VIEW_P] * _nin + _scalars + [VIEW_P])
    PROTOTYPES["lm_" + _name] = (c_status, [P] + [VIEW_P] * _nin + _scalars + [ctypes.POINTER(P)])
PROTOTYPES["lm_cast_out"] = (c_status, [P, VIEW_P, VIEW_P])
PROTOTYPES["lm_cast"] = (c_status, [P, VIEW_P, ctypes.c_int, ctypes.POINTER(P)])
for _name in ("argmax", ):
    PROTOTYPES["lm_%s_out" % _name] = (c_status, [P, VIEW_P, VIEW_P])
for _name in ("sum", "max"):
    PROTOTYPES["lm_%s_out" % _name] = (c_status, [P, VIEW_P, ctypes.c_int, VIEW_P])


# ---- errors ---------------------------------------------------------------------------
class Error(Exception):
    """A loom call failed. .status is the lm_status value, .status_name its name
    ("LM_SHAPE_MISMATCH"), .detail the text of lm_last_error() (what went wrong, naming
    the file, tensor or value at fault)."""

    def __init__(self, status, status_name, detail, function=None):
        self.status, self.status_name, self.detail, self.function = status, status_name, detail, function
        where = "%s: " % function if function else ""
        super().__init__("%s%s: %s" % (where, status_name, detail or "(no detail)"))


class InvalidArgumentError(Error, ValueError): pass
class OutOfMemoryError(Error, MemoryError): pass
class ShapeMismatchError(Error, ValueError): pass
class DtypeMismatchError(Error, TypeError): pass
class UnsupportedError(Error, NotImplementedError): pass
class OutOfRangeError(Error, IndexError): pass
class IOError_(Error, OSError): pass


IOError_.__name__ = IOError_.__qualname__ = "IOError"  # loom.IOError (LM_IO_ERROR)
class ParseError(Error, ValueError): pass
class NotFoundError(Error, LookupError): pass
class DeviceError(Error): pass
class InternalError(Error): pass


ERRORS = {1: InvalidArgumentError, 2: OutOfMemoryError, 3: ShapeMismatchError, 4: DtypeMismatchError,
          5: UnsupportedError, 6: OutOfRangeError, 7: IOError_, 8: ParseError, 9: NotFoundError, 10: DeviceError,
          11: InternalError}


def make_error(lib, status, function=None, detail=None):
    """The exception for status; detail defaults to this thread's lm_last_error()."""
    name = lib.lm_status_name(status).decode()
    if detail is None:
        detail = lib.lm_last_error().decode("utf-8", "replace")
    return ERRORS.get(status, Error)(status, name, detail, function)


# ---- discovery --------------------------------------------------------------------------
def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))  # .../loom
    out = []
    root = os.path.dirname(os.path.dirname(here))  # python/loom -> the source tree
    out.append(os.path.join(root, "build", "release", "libloom.so"))
    builds = glob.glob(os.path.join(root, "build", "*", "libloom.so"))
    builds.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
    out += [p for p in builds if p not in out]
    # installed: <prefix>/share/loom/python/loom or <prefix>/lib*/python3*/{site,dist}-packages/loom
    parts = here.split(os.sep)
    for up in (4, 5):
        if len(parts) > up:
            prefix = os.sep.join(parts[:-up]) or os.sep
            for lib in sorted(glob.glob(os.path.join(prefix, "lib*", "libloom.so.%d" % SOVERSION)) +
                              glob.glob(os.path.join(prefix, "lib", "*", "libloom.so.%d" % SOVERSION))):
                if lib not in out:
                    out.append(lib)
    return out


def _sanitizer_build(path):
    """1 when path sits in a CMake build tree configured with -fsanitize: dlopen of such
    a library aborts an uninstrumented python3 ("ASan runtime does not come first")
    unless the runtime is preloaded."""
    cache = os.path.join(os.path.dirname(path), "CMakeCache.txt")
    if "asan" in os.environ.get("LD_PRELOAD", "") or not os.path.exists(cache):
        return False
    with open(cache, errors="replace") as f:
        return any(line.startswith("CMAKE_C_FLAGS") and "-fsanitize" in line for line in f)


def _try_load(path, tried):
    if _sanitizer_build(path):
        tried.append("%s (a sanitizer build: preload its runtime with LD_PRELOAD to use it)" % path)
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        tried.append("%s (%s)" % (path, str(e).strip()))
        return None
    missing = [n for n in PROTOTYPES if not hasattr(lib, n)]
    if missing:
        tried.append("%s (lacks %s: an older loom)" % (path, ", ".join(missing[:3])))
        return None
    return lib


def load_library():
    tried = []
    explicit = os.environ.get("LOOM_LIBRARY")
    if explicit:
        lib = _try_load(explicit, tried)
        if lib is None:
            raise ImportError("loom: LOOM_LIBRARY=%s cannot be used: %s" % (explicit, tried[0]))
        return lib, explicit
    for path in _candidates():
        if os.path.exists(path):
            lib = _try_load(path, tried)
            if lib is not None:
                return lib, path
    for name in ("libloom.so.%d" % SOVERSION, ctypes.util.find_library("loom")):
        if name:
            lib = _try_load(name, tried)
            if lib is not None:
                return lib, name
    if not any("libloom.so.%d" % SOVERSION in t for t in tried):
        tried.append("libloom.so.%d (not on the loader's path)" % SOVERSION)
    raise ImportError("loom: cannot find libloom.so; set LOOM_LIBRARY to its path, build loom "
                      "(cmake --preset release && cmake --build --preset release) or install it. Tried: " +
                      "; ".join(tried))


def _declare(lib):
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


LIB, LIB_PATH = load_library()
_declare(LIB)


def check(name, *args):
    """Calls lm_<name>(*args); raises the matching loom.Error unless it returns LM_OK."""
    st = getattr(LIB, name)(*args)
    if st != 0:
        raise make_error(LIB, st, name)
    return st
