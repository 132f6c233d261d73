#!/usr/bin/python3
"""Copy a `loom quantize --to int4` directory with its bf16 group scales rewritten as f32.

The f32 values are the bf16 ones exactly (a bf16 value is the top 16 bits of an f32), so
both directories hold the same model and give the same logits; they differ only in the
bytes a step reads for scales (4 instead of 2 a group). loom still loads such a directory
(int4 directories written before bf16 group scales held f32 ones), so the pair measures
what the bf16 scales save: `python3 scripts/widen_scales.py SRC DST`. Only python3 +
numpy; the safetensors file is rewritten with the same tensor order and metadata.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np


def widen(src, dst):
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f != "model.safetensors":
            shutil.copy(os.path.join(src, f), dst)
    with open(os.path.join(src, "model.safetensors"), "rb") as fi:
        blob = fi.read()
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n])
    base = 8 + n
    meta = head.pop("__metadata__", None)
    out, parts, off, widened = {}, [], 0, 0
    for name in sorted(head, key=lambda k: head[k]["data_offsets"][0]):
        t = head[name]
        s, e = t["data_offsets"]
        raw, dt = blob[base + s:base + e], t["dtype"]
        if name.endswith("_scale") and dt == "BF16":
            raw = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32).tobytes()
            dt, widened = "F32", widened + 1
        out[name] = {"dtype": dt, "shape": t["shape"], "data_offsets": [off, off + len(raw)]}
        parts.append(raw)
        off += len(raw)
    if meta:
        out["__metadata__"] = meta
    hj = json.dumps(out).encode()
    hj += b" " * ((-len(hj)) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as fo:
        fo.write(struct.pack("<Q", len(hj)))
        fo.write(hj)
        for p in parts:
            fo.write(p)
    return widened


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: widen_scales.py SRC_DIR DST_DIR")
    count = widen(sys.argv[1], sys.argv[2])
    if count == 0:
        raise SystemExit(f"{sys.argv[1]}: no bf16 '_scale' tensors to widen")
    print(f"{count} scale tensors widened to f32 into {sys.argv[2]}")
