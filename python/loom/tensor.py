"""loom.tensor — loom tensors in Python, shared with NumPy and PyTorch without copies.

A loom.Tensor owns one lm_tensor handle (one reference on its storage). Memory moves
between loom and other libraries only as views:
  * NumPy reads a CPU tensor through __array_interface__ (np.asarray(t) keeps t alive);
    loom.from_numpy(a) wraps the array's buffer with lm_tensor_wrap and keeps the array
    alive until the last loom tensor over it is destroyed.
  * DLPack (legacy "dltensor" capsules, DLPack 0.8 struct layout) in both directions:
    torch.from_dlpack(t) reads a loom tensor via __dlpack__/__dlpack_device__, and
    loom.from_dlpack(x) consumes x.__dlpack__() (or a capsule), renames the capsule
    "used_dltensor" and calls its deleter when the last loom tensor over it goes.
Nothing is converted or copied behind the caller's back: unsupported dtypes, negative
strides and strides that are not whole elements raise instead.
On CUDA, exports and imports wait for the whole device (every stream) first, so the
memory is complete when the other library sees it.
"""
import ctypes
import itertools
import threading

from . import _lib
from ._lib import LIB, check, Device, TensorView

# ---- devices, dtypes and per-thread contexts -----------------------------------------------
_TYPESTR = {"f32": "<f4", "f16": "<f2", "i32": "<i4", "i64": "<i8", "u8": "|u1", "i8": "|i1"}  # NumPy; bf16 has none
_FROM_TYPESTR = {"<f4": "f32", "<f2": "f16", "<i4": "i32", "<i8": "i64", "|u1": "u8", "|i1": "i8", "|b1": None}


def _dtype_code(dtype):
    if isinstance(dtype, int):
        return dtype
    try:
        return _lib.DTYPES.index(str(dtype))
    except ValueError:
        raise _lib.make_error(LIB, 1, "dtype", "unknown dtype %r (one of %s)" % (dtype, ", ".join(_lib.DTYPES)))


def device(text="cpu"):
    """The lm_device for "cpu", "cuda" or "cuda:N" (or a Device, returned as is)."""
    if isinstance(text, Device):
        return text
    d = Device()
    check("lm_device_parse", str(text).encode(), ctypes.byref(d))
    return d


_parse_device = device  # for functions whose `device` parameter hides it


def device_name(d):
    return "cpu" if d.type == _lib.DEVICE_CPU else "cuda:%d" % d.index


class Context:
    """An lm_ctx: the device an operation runs on, its CUDA stream or CPU threads.
    Not thread-safe: loom.context() hands each thread its own."""

    def __init__(self, dev="cpu", threads=0):
        self.device = device(dev)
        h = ctypes.c_void_p()
        check("lm_ctx_create", self.device, int(threads), ctypes.byref(h))
        self._h = h

    def synchronize(self):
        check("lm_ctx_synchronize", self._h)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and LIB is not None:
            LIB.lm_ctx_destroy(h)


_tls = threading.local()


def context(dev="cpu"):
    """This thread's default Context for dev (created on first use)."""
    d = device(dev)
    cache = getattr(_tls, "ctxs", None)
    if cache is None:
        cache = _tls.ctxs = {}
    key = (d.type, d.index)
    if key not in cache:
        cache[key] = Context(d)
    return cache[key]


def _device_synchronize(d, ptr):
    """Waits for all work queued on CUDA device d, whatever the stream (loom's and other
    libraries'): lm_device_synchronize."""
    if d.type == _lib.DEVICE_CPU or not ptr:
        return
    check("lm_device_synchronize", d)


# ---- keeping foreign owners alive ---------------------------------------------------------
# key -> what to keep alive (or a function to call) until loom releases the memory. The
# key travels through C as the release callback's `user` pointer.
_owners = {}
_keys = itertools.count(1)
_owners_lock = threading.Lock()


def _hold(obj):
    with _owners_lock:
        key = next(_keys)
        _owners[key] = obj
    return key


def _drop(key):
    with _owners_lock:
        obj = _owners.pop(key, None)
    if isinstance(obj, _Deleter):
        obj()


class _Deleter:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self):
        self.fn()


def _release(user, data):  # lm_release_fn: runs once, when loom drops the last reference
    _drop(user)


_RELEASE = _lib.RELEASE_FN(_release)  # lives as long as the module (the C side may call it any time)


def live_owners():
    """How many foreign buffers (NumPy arrays, DLPack imports and exports) loom keeps alive now."""
    return len(_owners)


# ---- Tensor -------------------------------------------------------------------------------
class Tensor:
    """A loom tensor (metadata + a reference on its memory). Create with loom.empty,
    loom.zeros, loom.tensor (copy), loom.from_numpy / loom.from_dlpack (no copy)."""

    __slots__ = ("_h", "__weakref__")

    def __init__(self, handle):
        self._h = handle  # c_void_p: one lm_tensor this object destroys

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and LIB is not None:
            LIB.lm_tensor_destroy(h)

    @property
    def view(self):
        """The lm_tensor_view (borrowed: valid while self lives)."""
        return LIB.lm_tensor_as_view(self._h).contents

    @property
    def _view_p(self):
        return LIB.lm_tensor_as_view(self._h)

    @property
    def shape(self):
        v = self.view
        return tuple(v.shape[i] for i in range(v.ndim))

    @property
    def strides(self):
        """In elements, as loom and DLPack count them (NumPy counts bytes)."""
        v = self.view
        return tuple(v.stride[i] for i in range(v.ndim))

    @property
    def ndim(self):
        return self.view.ndim

    @property
    def dtype(self):
        return _lib.DTYPES[self.view.dtype]

    @property
    def itemsize(self):
        return (4, 2, 2, 4, 8, 1)[self.view.dtype]

    @property
    def device(self):
        return device_name(self.view.device)

    @property
    def data_ptr(self):
        """Address of element [0, ..., 0] (0 for an empty tensor without memory)."""
        return self.view.data or 0

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d loom tensor")
        return self.shape[0]

    def is_contiguous(self):
        expect = 1
        for size, stride in reversed(list(zip(self.shape, self.strides))):
            if size != 1 and stride != expect:
                return self.numel == 0
            expect *= size
        return True

    def __repr__(self):
        return "loom.Tensor(shape=%s, dtype=%s, device=%s, strides=%s)" % (list(self.shape), self.dtype, self.device,
                                                                          list(self.strides))

    # ---- NumPy ----
    @property
    def __array_interface__(self):
        if self.view.device.type != _lib.DEVICE_CPU:
            raise TypeError("a %s tensor is not host memory: copy it with .to('cpu') first" % self.device)
        if self.dtype not in _TYPESTR:
            raise TypeError("NumPy has no %s dtype: convert with loom.ops.cast(t, 'f32') first" % self.dtype)
        ptr = self.data_ptr
        if ptr == 0:  # an empty view may have no memory; NumPy wants a non-NULL address
            ptr = ctypes.addressof(_EMPTY)
        return {"version": 3, "shape": self.shape, "typestr": _TYPESTR[self.dtype], "data": (ptr, False),
                "strides": tuple(s * self.itemsize for s in self.strides)}

    def numpy(self):
        """A NumPy array over this tensor's memory (no copy; it keeps the tensor alive)."""
        import numpy as np
        return np.asarray(self)

    # ---- DLPack ----
    def __dlpack_device__(self):
        d = self.view.device
        return (_KDL_CPU, 0) if d.type == _lib.DEVICE_CPU else (_KDL_CUDA, d.index)

    def __dlpack__(self, stream=None, **kwargs):
        """A legacy "dltensor" capsule over this tensor's memory. On CUDA the device is
        synchronized first (loom's queued work is done when the consumer reads)."""
        return _export_dlpack(self)

    # ---- zero-copy derived views ----
    def _derive(self, fn, *args):
        out = TensorView()
        check(fn, self._view_p, *args, ctypes.byref(out))
        return self._from_view(out)

    def _from_view(self, v):
        h = ctypes.c_void_p()
        check("lm_tensor_from_view", self._h, ctypes.byref(v), ctypes.byref(h))
        return Tensor(h)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._derive("lm_tensor_view_reshape", len(shape), (ctypes.c_int64 * max(len(shape), 1))(*shape))

    def transpose(self, d0=0, d1=1):
        return self._derive("lm_tensor_view_transpose", d0, d1)

    @property
    def T(self):
        return self.transpose(-2, -1) if self.ndim >= 2 else self

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return self._derive("lm_tensor_view_permute", (ctypes.c_int32 * max(len(dims), 1))(*dims))

    def slice(self, dim, start, stop, step=1):
        return self._derive("lm_tensor_view_slice", dim, start, stop, step)

    def select(self, dim, index):
        return self._derive("lm_tensor_view_select", dim, index)

    def __getitem__(self, key):
        """Integer and positive-step slice indexing on leading dims (zero-copy)."""
        if not isinstance(key, tuple):
            key = (key,)
        t, dim = self, 0
        for k in key:
            if isinstance(k, int):
                size = t.shape[dim]
                t = t.select(dim, k + size if k < 0 else k)
            elif isinstance(k, slice):
                start, stop, step = k.indices(t.shape[dim])
                if step < 1:
                    raise IndexError("loom views need a positive step")
                t = t.slice(dim, start, max(start, stop), step)
                dim += 1
            else:
                raise TypeError("loom.Tensor indices are ints and slices, not %r" % (k,))
        return t

    # ---- copies (explicit) ----
    def contiguous(self, ctx=None):
        h = ctypes.c_void_p()
        check("lm_tensor_contiguous", (ctx or context(self.device))._h, self._h, ctypes.byref(h))
        return Tensor(h)

    def to(self, dev, ctx=None):
        """A contiguous copy on dev."""
        h = ctypes.c_void_p()
        d = device(dev)
        c = ctx or context(self.device if self.view.device.type != _lib.DEVICE_CPU else dev)
        check("lm_tensor_to_device", c._h, self._h, d, ctypes.byref(h))
        return Tensor(h)

    def copy_(self, src, ctx=None):
        """Copies src (same shape and dtype) into self, element by element."""
        check("lm_tensor_view_copy", (ctx or context(self.device))._h, self._view_p, as_tensor(src)._view_p)
        return self

    def poison_(self, ctx=None):
        """Fills with NaN (floats) or 0xA5 bytes (integers)."""
        check("lm_tensor_view_poison", (ctx or context(self.device))._h, self._view_p)
        return self

    def tolist(self):
        t = self if self.device == "cpu" else self.to("cpu")
        return t.numpy().tolist()


_EMPTY = ctypes.c_uint64(0)


def _new(fn, shape, dtype, dev):
    shape = tuple(int(s) for s in shape)
    h = ctypes.c_void_p()
    check(fn, device(dev), _dtype_code(dtype), len(shape), (ctypes.c_int64 * max(len(shape), 1))(*shape),
          ctypes.byref(h))
    return Tensor(h)


def empty(shape, dtype="f32", device="cpu"):
    """A new contiguous tensor, contents uninitialized."""
    return _new("lm_tensor_create", shape, dtype, device)


def zeros(shape, dtype="f32", device="cpu"):
    return _new("lm_tensor_zeros", shape, dtype, device)


def wrap(data_ptr, shape, dtype="f32", device="cpu", strides=None, owner=None):
    """A tensor over memory at data_ptr (strides in elements, None = contiguous) that keeps
    owner alive until the last loom tensor over it is gone (lm_tensor_wrap)."""
    shape = tuple(int(s) for s in shape)
    n = len(shape)
    c_shape = (ctypes.c_int64 * max(n, 1))(*shape)
    c_strides = None if strides is None else (ctypes.c_int64 * max(n, 1))(*[int(s) for s in strides])
    dev = _parse_device(device)
    key = _hold(owner)
    h = ctypes.c_void_p()
    st = LIB.lm_tensor_wrap(dev, ctypes.c_void_p(data_ptr or None), _dtype_code(dtype), n, c_shape, c_strides,
                            _RELEASE, ctypes.c_void_p(key), ctypes.byref(h))
    if st != 0:
        with _owners_lock:
            _owners.pop(key, None)  # loom did not take it: release was not called
        raise _lib.make_error(LIB, st, "lm_tensor_wrap")
    return Tensor(h)


def from_numpy(array):
    """A loom tensor over a NumPy array's memory (no copy). The array stays alive while
    any loom tensor over it does; writes through either side are seen by the other."""
    import numpy as np
    a = array if isinstance(array, np.ndarray) else np.asarray(array)
    dt = _FROM_TYPESTR.get(a.dtype.str)
    if dt is None:
        raise TypeError("loom has no dtype for NumPy %s (f32, f16, i32, i64, u8)" % a.dtype)
    if any(s < 0 or s % a.itemsize for s in a.strides):
        raise ValueError("strides %s (bytes) are negative or not whole %d-byte elements: loom views cannot "
                         "describe them (np.ascontiguousarray makes a copy that can)" % (a.strides, a.itemsize))
    strides = [s // a.itemsize for s in a.strides]
    ptr = a.__array_interface__["data"][0] if a.size else 0
    return wrap(ptr, a.shape, dt, "cpu", strides, owner=a)


def tensor(data, dtype=None, device="cpu"):
    """A new contiguous loom tensor on device holding a copy of data (anything
    np.asarray accepts; float64 becomes f32 unless dtype says otherwise)."""
    import numpy as np
    a = np.asarray(data)
    if dtype is None:
        dtype = "f32" if a.dtype.kind == "f" and a.dtype.str not in _FROM_TYPESTR else _FROM_TYPESTR.get(a.dtype.str)
        if dtype is None:
            raise TypeError("loom has no dtype for NumPy %s (f32, f16, i32, i64, u8)" % a.dtype)
    a = np.ascontiguousarray(a, dtype=_TYPESTR[dtype])
    t = empty(a.shape, dtype, device)
    if a.size:
        check("lm_tensor_view_write", context(device)._h, t._view_p, ctypes.c_void_p(a.ctypes.data))
    return t


def as_tensor(x):
    """x if it is a loom.Tensor; a zero-copy view of a NumPy array or DLPack producer."""
    if isinstance(x, Tensor):
        return x
    if hasattr(x, "__dlpack__") and not hasattr(x, "__array_interface__"):
        return from_dlpack(x)
    return from_numpy(x)


# ---- DLPack ---------------------------------------------------------------------------------
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST = 1, 2, 3
_DL_CODES = {"f32": (2, 32), "f16": (2, 16), "bf16": (4, 16), "i32": (0, 32), "i64": (0, 64), "u8": (1, 8), "i8": (0, 8)}
_DL_FROM = {v: k for k, v in _DL_CODES.items()}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_DL_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor *)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject *)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The raw-pointer forms the capsule destructor needs (its argument is a PyObject * whose
# refcount may already be 0, so it must not become a py_object).
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

# Capsule names must outlive the capsules: module-level buffers.
_NAME_DLTENSOR = ctypes.create_string_buffer(b"dltensor")
_NAME_USED = ctypes.create_string_buffer(b"used_dltensor")


def _dl_deleter(managed):  # called by the consumer (or the unconsumed capsule) once
    _drop(DLManagedTensor.from_address(managed).manager_ctx)


def _capsule_destructor(capsule):
    if _is_valid_raw(capsule, b"dltensor"):  # never consumed: we still own the DLManagedTensor
        _dl_deleter(_get_pointer_raw(capsule, b"dltensor"))


_DL_DELETER_FN = _DL_DELETER(_dl_deleter)
_CAPSULE_DESTRUCTOR_FN = _CAPSULE_DESTRUCTOR(_capsule_destructor)


def _export_dlpack(t):
    v = t.view
    if t.numel:
        _device_synchronize(v.device, t.data_ptr)
    n = v.ndim
    shape = (ctypes.c_int64 * max(n, 1))(*[v.shape[i] for i in range(n)])
    strides = (ctypes.c_int64 * max(n, 1))(*[v.stride[i] for i in range(n)])
    m = DLManagedTensor()
    m.dl_tensor.data = v.data
    dev_type, dev_id = t.__dlpack_device__()
    m.dl_tensor.device = DLDevice(dev_type, dev_id)
    m.dl_tensor.ndim = n
    code, bits = _DL_CODES[t.dtype]
    m.dl_tensor.dtype = DLDataType(code, bits, 1)
    m.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    m.dl_tensor.byte_offset = 0
    m.manager_ctx = _hold((m, shape, strides, t))  # t keeps the loom memory alive
    m.deleter = ctypes.cast(_DL_DELETER_FN, ctypes.c_void_p)
    return _api.PyCapsule_New(ctypes.addressof(m), ctypes.cast(_NAME_DLTENSOR, ctypes.c_char_p),
                              _CAPSULE_DESTRUCTOR_FN)


def from_dlpack(x):
    """A loom tensor over the memory of a DLPack producer (a torch.Tensor, a CuPy or JAX
    array, ...) or of a "dltensor" capsule, without copying. The producer's deleter runs
    when the last loom tensor over it is destroyed."""
    if hasattr(x, "__dlpack__"):
        dev_type = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else _KDL_CPU
        capsule = x.__dlpack__(stream=None) if dev_type == _KDL_CUDA else x.__dlpack__()
    else:
        capsule = x
    ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor")  # raises ValueError for a used capsule
    m = DLManagedTensor.from_address(ptr)
    dl = m.dl_tensor
    if dl.device.device_type in (_KDL_CPU, _KDL_CUDA_HOST):
        dev = device("cpu")
    elif dl.device.device_type == _KDL_CUDA:
        dev = device("cuda:%d" % dl.device.device_id)
    else:
        raise _lib.make_error(LIB, 5, "from_dlpack", "DLPack device type %d is not one loom has (CPU, CUDA, "
                                                      "CUDA host)" % dl.device.device_type)
    key = (dl.dtype.code, dl.dtype.bits)
    if dl.dtype.lanes != 1 or key not in _DL_FROM:
        raise _lib.make_error(LIB, 5, "from_dlpack", "DLPack dtype code %d, %d bits, %d lanes has no loom dtype"
                              % (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes))
    n = dl.ndim
    shape = [dl.shape[i] for i in range(n)]
    strides = [dl.strides[i] for i in range(n)] if dl.strides else None
    data = (dl.data or 0) + dl.byte_offset
    deleter = m.deleter

    def release(ptr=ptr, deleter=deleter):
        if deleter:
            _DL_DELETER(deleter)(ptr)

    if dev.type != _lib.DEVICE_CPU and all(shape):
        _device_synchronize(dev, data)  # the producer's queued writes are done
    t = wrap(data if data else None, shape, _DL_FROM[key], dev, strides, owner=_Deleter(release))
    _api.PyCapsule_SetName(capsule, ctypes.cast(_NAME_USED, ctypes.c_char_p))  # ours now
    return t
