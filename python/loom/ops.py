"""loom.ops — the operator API (include/loom/ops.h) for experiments from Python.

Each operator takes loom tensors, NumPy arrays or DLPack producers (wrapped without
copies) and runs on the first input's device with this thread's context (or ctx=).
Without out= it returns a new loom.Tensor (the allocating form); with out= it writes
into out (any caller memory: a NumPy array, a torch tensor) and returns it. Errors
raise loom.Error with loom's message. On CUDA the work is queued: read results with
.to("cpu"), .numpy() after .to("cpu"), or through DLPack (which synchronizes).
"""
import ctypes

from ._lib import check
from .tensor import Tensor, as_tensor, context, _dtype_code


def _ctx(ctx, first):
    return (ctx or context(first.device))._h


def _run(name, inputs, scalars, out, ctx):
    ts = [as_tensor(x) for x in inputs]
    c = _ctx(ctx, ts[0])
    if out is not None:
        o = as_tensor(out)
        check("lm_%s_out" % name, c, *[t._view_p for t in ts], *scalars, o._view_p)
        return out
    h = ctypes.c_void_p()
    check("lm_" + name, c, *[t._view_p for t in ts], *scalars, ctypes.byref(h))
    return Tensor(h)


def add(a, b, out=None, ctx=None):
    """a + b with NumPy broadcasting."""
    return _run("add", [a, b], [], out, ctx)


def mul(a, b, out=None, ctx=None):
    return _run("mul", [a, b], [], out, ctx)


def scale(x, s, out=None, ctx=None):
    return _run("scale", [x], [float(s)], out, ctx)


def silu(x, out=None, ctx=None):
    return _run("silu", [x], [], out, ctx)


def swiglu(gate, up, out=None, ctx=None):
    """silu(gate) * up."""
    return _run("swiglu", [gate, up], [], out, ctx)


def rmsnorm(x, weight, eps=1e-6, out=None, ctx=None):
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight."""
    return _run("rmsnorm", [x, weight], [float(eps)], out, ctx)


def softmax(x, scale=1.0, causal=False, out=None, ctx=None):
    """softmax(x * scale) over the last dim (causal: a lower-triangular mask)."""
    return _run("softmax", [x], [float(scale), int(bool(causal))], out, ctx)


def matmul(a, b, out=None, ctx=None):
    """a[..., M, K] @ b[..., K, N] (b may be a transposed view, e.g. w.T)."""
    return _run("matmul", [a, b], [], out, ctx)


def embedding(table, ids, out=None, ctx=None):
    """Rows of table [V, D] picked by ids (i32/i64)."""
    return _run("embedding", [table, ids], [], out, ctx)


def cast(x, dtype=None, out=None, ctx=None):
    """x converted to dtype ("f32", "bf16", ...) or to out's dtype."""
    t = as_tensor(x)
    if out is not None:
        check("lm_cast_out", _ctx(ctx, t), t._view_p, as_tensor(out)._view_p)
        return out
    h = ctypes.c_void_p()
    check("lm_cast", _ctx(ctx, t), t._view_p, _dtype_code(dtype), ctypes.byref(h))
    return Tensor(h)


def _reduce(name, x, dim, out_dtype, ctx, out):
    t = as_tensor(x)
    nd = t.ndim
    d = dim + nd if dim < 0 else dim
    shape = t.shape[:d] + t.shape[d + 1:]
    if out is None:
        from .tensor import empty
        out = empty(shape, out_dtype or t.dtype, t.device)
    args = [t._view_p] + ([d] if name != "argmax" else []) + [as_tensor(out)._view_p]
    check("lm_%s_out" % name, _ctx(ctx, t), *args)
    return out


def argmax(x, out=None, ctx=None):
    """Index of the largest element over the last dim (i64)."""
    return _reduce("argmax", x, -1, "i64", ctx, out)


def sum(x, dim=-1, out=None, ctx=None):  # noqa: A001 (mirrors lm_sum_out)
    return _reduce("sum", x, dim, None, ctx, out)


def max(x, dim=-1, out=None, ctx=None):  # noqa: A001 (mirrors lm_max_out)
    return _reduce("max", x, dim, None, ctx, out)


__all__ = ["add", "mul", "scale", "silu", "swiglu", "rmsnorm", "softmax", "matmul", "embedding", "cast", "argmax",
           "sum", "max"]
