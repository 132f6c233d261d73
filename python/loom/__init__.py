"""loom — Python bindings for the loom C library (libloom.so), over ctypes.

Pure Python: no compiler and no pip needed (`PYTHONPATH=python python3 -c "import loom"`).
The library is found through $LOOM_LIBRARY, a build tree beside the package, an
installed prefix, or the loader's path (loom._lib says in which order).

    import loom
    m = loom.Model("models/default")
    for piece in m.generate("The capital of France is", max_new_tokens=16, temperature=0):
        print(piece, end="", flush=True)
    logits = m.logits(m.tokenizer.encode("Hello"))      # NumPy f32 [vocab], no copy
    t = loom.from_numpy(array); y = loom.ops.rmsnorm(t, w)  # zero-copy views in and out
    x = torch.from_dlpack(y); z = loom.from_dlpack(x)      # DLPack both ways

Errors raise loom.Error (subclasses per status, e.g. loom.InvalidArgumentError) with
loom's message from lm_last_error().
"""
from . import _lib
from ._lib import (Error, InvalidArgumentError, OutOfMemoryError, ShapeMismatchError, DtypeMismatchError,
                   UnsupportedError, OutOfRangeError, ParseError, NotFoundError, DeviceError, InternalError)
from ._lib import IOError_ as IOError  # noqa: A001 (loom's LM_IO_ERROR; also an OSError)
from .tensor import (Tensor, Context, context, device, empty, zeros, tensor, wrap, from_numpy, from_dlpack,
                     as_tensor, live_owners)
from .model import Tokenizer, Model, KVCache, Generation
from . import ops

__version__ = _lib.LIB.lm_version().decode()
library_path = _lib.LIB_PATH


def cuda_device_count():
    """Usable CUDA devices (0 when loom was built without CUDA or there is no GPU)."""
    return _lib.LIB.lm_cuda_device_count()


def cuda_compiled():
    return bool(_lib.LIB.lm_cuda_compiled())


__all__ = ["Error", "InvalidArgumentError", "OutOfMemoryError", "ShapeMismatchError", "DtypeMismatchError",
           "UnsupportedError", "OutOfRangeError", "IOError", "ParseError", "NotFoundError", "DeviceError",
           "InternalError", "Tensor", "Context", "context", "device", "empty", "zeros", "tensor", "wrap",
           "from_numpy", "from_dlpack", "as_tensor", "live_owners", "Tokenizer", "Model", "KVCache", "Generation",
           "ops", "cuda_device_count", "cuda_compiled", "library_path"]
