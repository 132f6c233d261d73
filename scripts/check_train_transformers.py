#!/usr/bin/env python3
"""Cross-checks of loom's training against Hugging Face transformers (GPU machine).

1. Gradients: for every tests/data/models checkpoint, loads the model with
   transformers in float64 (eager attention), computes the mean cross-entropy of the
   batch stored in tests/data/train/grad_refs/<name>.lmfx (ids [B, T], per-position
   targets with -100 ignored) and backpropagates; compares the loss, every parameter
   gradient's sum of squares and the sampled entries with that fixture (which loom's
   tests already compare loom against). This checks the fixture itself against the
   reference implementation.
2. Checkpoint interop: loads tests/data/train/loom_checkpoint (written by
   `loom train`) with transformers in float32 and compares its logits for the ids in
   tests/data/train/loom_checkpoint_logits.jsonl (written by `loom logits` on the CPU)
   with loom's: the top-5 ids and values and the log-sum-exp at each position.
Usage: check_train_transformers.py OUT.json   (exit 1 when a check fails)
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MODELS = ["llama_gqa2_f32", "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
          "qwen2_bias_sharded", "qwen2_mqa_yarn", "qwen3_headdim"]


def read_lmfx(path):
    out = {}
    with open(path, "rb") as f:
        assert f.readline() == b"LMFX1\n"
        while True:
            line = f.readline()
            if not line:
                return out
            name, dt, nd, *dims = line.decode().split()
            shape = tuple(int(d) for d in dims)
            n = int(np.prod(shape)) if shape else 1
            a = np.frombuffer(f.read(8 * n), dtype="<i8" if dt == "i64" else "<f8").reshape(shape)
            out[name] = a


def load(path, dtype):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(path, torch_dtype=dtype, attn_implementation="eager")


def check_gradients(name, dev):
    ref = read_lmfx(os.path.join(ROOT, "tests/data/train/grad_refs", name + ".lmfx"))
    model = load(os.path.join(ROOT, "tests/data/models", name), torch.float64).to(dev)
    ids = torch.tensor(ref["ids"], device=dev)
    targets = torch.tensor(ref["targets"], device=dev)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=-100)
    loss.backward()
    worst_s = worst_v = 0.0
    for pname, p in model.named_parameters():
        if "s." + pname not in ref:
            raise RuntimeError(f"{name}: parameter {pname} has no fixture entry")
        g = p.grad.detach().double().cpu().numpy().reshape(-1)
        s_ref = float(ref["s." + pname])
        worst_s = max(worst_s, abs(float((g * g).sum()) - s_ref) / max(s_ref, 1e-300))
        v_ref = ref["v." + pname]
        vals = g[ref["i." + pname]]
        worst_v = max(worst_v, float(np.abs(vals - v_ref).max() / max(np.abs(v_ref).max(), 1e-300)))
    return {"loss_transformers": loss.item(), "loss_fixture": float(ref["loss"]),
            "loss_rel_diff": abs(loss.item() - float(ref["loss"])) / abs(float(ref["loss"])),
            "sumsq_max_rel_diff": worst_s, "sampled_max_rel_diff": worst_v}


def check_checkpoint(dev):
    rows = [json.loads(l) for l in open(os.path.join(ROOT, "tests/data/train/loom_checkpoint_logits.jsonl"))]
    ids = [5, 17, 33, 2, 9, 41, 7, 100]
    model = load(os.path.join(ROOT, "tests/data/train/loom_checkpoint"), torch.float32).to(dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=dev)).logits[0].double().cpu()
    worst, same_top = 0.0, True
    for r in rows:
        row = logits[r["pos"]]
        lse = torch.logsumexp(row, 0).item()
        worst = max(worst, abs(lse - r["logsumexp"]))
        top = torch.topk(row, len(r["top"]))
        same_top &= [int(i) for i in top.indices] == [t[0] for t in r["top"]]
        for t in r["top"]:
            worst = max(worst, abs(row[t[0]].item() - t[1]))
    return {"max_abs_diff": worst, "top5_identical": bool(same_top), "positions": len(rows)}


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    out = {"device": dev, "torch": torch.__version__}
    import transformers
    out["transformers"] = transformers.__version__
    ok = True
    out["gradients"] = {}
    for name in MODELS:
        r = check_gradients(name, dev)
        out["gradients"][name] = r
        # float64 on both sides; the slack covers RoPE tables computed in float32 vs float64
        ok &= r["loss_rel_diff"] < 1e-6 and r["sumsq_max_rel_diff"] < 1e-5 and r["sampled_max_rel_diff"] < 1e-5
    out["loom_checkpoint"] = check_checkpoint(dev)
    ok &= out["loom_checkpoint"]["top5_identical"] and out["loom_checkpoint"]["max_abs_diff"] < 1e-4
    out["ok"] = bool(ok)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
