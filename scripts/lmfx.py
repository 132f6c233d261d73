"""lmfx — the small container loom's tests read reference tensors from.

A file is the line b"LMFX1\n" followed by records, each a text header line
"name dtype ndim d0 d1 ...\n" (dtype f64 or i64) and then the tensor's elements as
little-endian raw bytes in row-major order. tests/harness.c (lt_fixture_*) reads it.
"""
import numpy as np


def write(path, tensors):
    """tensors: dict name -> array-like; floats are stored as f64, integers as i64."""
    with open(path, "wb") as f:
        f.write(b"LMFX1\n")
        for name, value in tensors.items():
            if " " in name or "\n" in name:
                raise ValueError(f"fixture name {name!r} may not contain whitespace")
            a = np.asarray(value)
            if a.dtype.kind in "iub":
                a, dt = a.astype("<i8"), "i64"
            else:
                a, dt = a.astype("<f8"), "f64"
            dims = " ".join(str(d) for d in a.shape)
            f.write(f"{name} {dt} {a.ndim}{' ' if a.ndim else ''}{dims}\n".encode())
            f.write(np.ascontiguousarray(a).tobytes())
