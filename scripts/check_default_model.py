#!/usr/bin/env python3
"""Checks loom's default model (models/default) against Hugging Face transformers and
tokenizers (run where they are installed, e.g. the GPU machine; no network needed).

    check_default_model.py --loom build/release/loom [--model models/default] [--out result.json]

1. AutoTokenizer.from_pretrained(MODEL) (tokenizer.json + tokenizer_config.json)
   encodes each prompt below to the ids `loom tokenize` gives, and decodes them back.
2. AutoModelForCausalLM.from_pretrained(MODEL) in float32 (the bf16 weights widened
   exactly, eager attention, no TF32) against `loom logits` on the CPU for a 64-token
   text: at every position the top-5 ids must be equal (unless the reference's own gap
   is below the tolerance) and the top-5 logits and the log-sum-exp within 1e-3.
3. Greedy continuations (48 new tokens) of each prompt: transformers' ids against
   `loom generate --greedy --print-ids`; equal up to the first step where the
   reference's top-2 margin is below 1e-3 (a tie the two float orders may break
   differently), which is reported.
Writes a JSON summary (--out) and exits 1 when a check fails.
"""
import argparse
import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["It is a truth universally acknowledged", "The President said that", "In the beginning",
           "A database index is", "The old man looked at the sea and"]
TEXT = ("It was the best of times, and the people of the land went up to the city to hear the words of the "
        "king. Then said the woman unto him, Sir, thou hast nothing to draw with.")
TOL = 1e-3


def run(cmd, stdin=None):
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", required=True)
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    import tokenizers
    import transformers
    res = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "torch": torch.__version__}
    ok = True

    tok = AutoTokenizer.from_pretrained(a.model)
    loom_ids = [json.loads(l) for l in run([a.loom, "tokenize", "--tokenizer", a.model + "/tokenizer.json"],
                                           "".join(json.dumps(p) + "\n" for p in PROMPTS + [TEXT])).splitlines()]
    hf_ids = [tok(p, add_special_tokens=True)["input_ids"] for p in PROMPTS + [TEXT]]
    same = [x == y for x, y in zip(loom_ids, hf_ids)]
    round_trip = all(tok.decode(i) == p for i, p in zip(hf_ids, PROMPTS + [TEXT]))
    res["tokenizer"] = {"prompts": len(same), "ids_equal": all(same), "decode_round_trip": round_trip}
    ok &= all(same) and round_trip

    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="eager").eval()
    ids = hf_ids[-1][:64]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([ids])).logits[0].double()
    rows = [json.loads(l) for l in run([a.loom, "logits", "--model", a.model, "--ids", ",".join(map(str, ids)),
                                         "--top", "5"]).splitlines()]
    worst, top_ok = 0.0, True
    for r in rows:
        row = ref[r["pos"]]
        worst = max(worst, abs(torch.logsumexp(row, 0).item() - r["logsumexp"]))
        top = torch.topk(row, 6)
        for k, (i, v) in enumerate(r["top"]):
            worst = max(worst, abs(row[i].item() - v))
            if i != int(top.indices[k]) and abs(top.values[k].item() - row[i].item()) > TOL:
                top_ok = False
    res["logits"] = {"positions": len(rows), "max_abs_diff": worst, "top5_equal": top_ok,
                     "logit_scale": float(ref.abs().max())}
    ok &= top_ok and worst < TOL and len(rows) == len(ids)

    gens = []
    for p, pid in zip(PROMPTS, hf_ids):
        with torch.no_grad():
            out = model.generate(torch.tensor([pid]), max_new_tokens=48, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        want = out.sequences[0, len(pid):].tolist()
        margins = []
        for s in out.scores:
            t2 = torch.topk(s[0].double(), 2).values
            margins.append((t2[0] - t2[1]).item())
        got = json.loads(run([a.loom, "generate", "--model", a.model, "--ids", ",".join(map(str, pid)), "--max-new",
                              "48", "--greedy", "--print-ids", "--ignore-eos"]))
        first_diff = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), None)
        tie = next((k for k, m in enumerate(margins) if m < TOL), None)
        fine = first_diff is None and len(got) == len(want) or (tie is not None and first_diff is not None and tie <= first_diff)
        gens.append({"prompt": p, "equal": first_diff is None and len(got) == len(want), "first_difference": first_diff,
                     "first_near_tie": tie, "text": tok.decode(want)})
        ok &= bool(fine)
    res["greedy"] = gens
    res["ok"] = bool(ok)
    text = json.dumps(res, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
