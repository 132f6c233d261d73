#!/usr/bin/env python3
"""Two loom builds side by side on one GPU: the no-regression check of a change.

Usage: bench_compare_gpu.py --old OLD/loom --new NEW/loom [--work DIR] [--out DIR] [--rounds N]
                            [--skip-train] [--train-steps N]
On the Qwen2.5-0.5B shape (bench_gpu.py's random bf16 checkpoint, built with transformers) the two
binaries run alternately, `--rounds` times each (default 2), so drift of the machine falls on
both: `loom bench prefill` B1 T512 (best of 10), `loom bench decode` B1 and B32 (prompt 16, 256
new tokens, best of 3); the best of the rounds counts. Their logits on 32 random ids are compared
(`loom logits --device cuda`, top-10 and logsumexp). Training (unless --skip-train): `loom train`
on bench_train_gpu.py's f32 checkpoint and token shard, B8 x T1024, bf16, for each binary:
median step time after the warm-up, tokens/s, peak memory, and the per-step losses of the two.
Prints a markdown table (new / old ratios) and writes OUT/compare.md and OUT/compare.json.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_gpu  # noqa: E402
import bench_train_gpu  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", required=True, help="the baseline loom executable (CUDA build)")
    p.add_argument("--new", required=True, help="the changed loom executable (CUDA build)")
    p.add_argument("--work", default="/tmp/loom-compare")
    p.add_argument("--out", default=".")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--train-steps", type=int, default=12)
    return p.parse_args()


def inference(loom, path):
    base = [loom, "bench"]
    r = {"prefill": bench_gpu.run_json(base + ["prefill", "--device", "cuda", "--model", path, "--prompt", "512",
                                               "--batch", "1", "--repeat", "10"])[0]}
    for b in (1, 32):
        r[f"decode{b}"] = bench_gpu.run_json(base + ["decode", "--device", "cuda", "--model", path, "--prompt", "16",
                                                     "--tokens", "256", "--batch", str(b), "--repeat", "3"])[0]
    return r


def best(runs):
    """Best of the rounds: lowest prefill time, highest decode rates (peak memory of that run)."""
    out = {"prefill": min((r["prefill"] for r in runs), key=lambda x: x["best_s"])}
    for b in (1, 32):
        out[f"decode{b}"] = max((r[f"decode{b}"] for r in runs), key=lambda x: x["tok_per_s"])
    return out


def train(loom, model, shard, steps, tag, work):
    a = argparse.Namespace(loom=loom, work=os.path.join(work, tag), batch=8, seq=1024, steps=steps)
    os.makedirs(a.work, exist_ok=True)
    r = bench_train_gpu.run_loom(a, model, shard)
    r["tok_s"] = 8 * 1024 / r["step_s"]
    return r


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    model, path = bench_gpu.make_checkpoint("qwen2.5-0.5b", args.work)
    vocab = model.config.vocab_size
    del model
    torch.cuda.empty_cache()
    runs = {"old": [], "new": []}
    for i in range(args.rounds):
        for tag in ("old", "new"):
            print(f"== round {i}: {tag}", flush=True)
            runs[tag].append(inference(getattr(args, tag), path))
    res = {tag: best(runs[tag]) for tag in runs}
    res["rounds"] = runs
    ids = torch.randint(0, vocab, (32,), generator=torch.Generator().manual_seed(3)).tolist()
    old_rows = bench_gpu.loom_logits(args.old, path, ids, "cuda")
    new_rows = bench_gpu.loom_logits(args.new, path, ids, "cuda")
    agree = bench_gpu.compare_logits(new_rows, bench_gpu.rows_to_tensor(old_rows, vocab))
    agree.pop("ref_logit_std")
    agree["max_abs_logsumexp"] = max(abs(a["logsumexp"] - b["logsumexp"]) for a, b in zip(new_rows, old_rows))
    res["logits_new_vs_old"] = agree
    if not args.skip_train:
        tw = os.path.join(args.work, "train")
        os.makedirs(tw, exist_ok=True)
        tmodel = bench_train_gpu.make_checkpoint(tw)
        steps = args.train_steps
        tokens = np.random.default_rng(0).integers(0, bench_train_gpu.CONFIG["vocab_size"], size=steps * 8 * 1024 + 1,
                                                    dtype=np.int64)
        shard = os.path.join(tw, "train.bin")
        bench_train_gpu.write_shard(shard, tokens, bench_train_gpu.CONFIG["vocab_size"])
        for tag in ("old", "new"):
            print(f"== train: {tag}", flush=True)
            res[f"train_{tag}"] = train(getattr(args, tag), tmodel, shard, steps, tag, tw)
    o, n = res["old"], res["new"]
    lines = [f"GPU: {torch.cuda.get_device_name(0)}; Qwen2.5-0.5B shape, bf16; best of {args.rounds} alternating "
             "rounds", "", "| measure | old | new | new / old |", "|---|---|---|---|"]
    po, pn = o["prefill"]["best_s"] * 1e3, n["prefill"]["best_s"] * 1e3
    lines.append(f"| prefill B1 T512, ms | {po:.3f} | {pn:.3f} | {pn / po:.3f} |")
    for b in (1, 32):
        a, c = o[f"decode{b}"], n[f"decode{b}"]
        lines.append(f"| decode B{b}, tok/s | {a['tok_per_s']:.0f} | {c['tok_per_s']:.0f} | "
                     f"{c['tok_per_s'] / a['tok_per_s']:.3f} |")
        lines.append(f"| decode B{b}, peak MiB in use | {a['peak_bytes'] / 2**20:.0f} | {c['peak_bytes'] / 2**20:.0f} | "
                     f"{c['peak_bytes'] / max(a['peak_bytes'], 1):.3f} |")
    if not args.skip_train:
        a, c = res["train_old"], res["train_new"]
        lines.append(f"| train B8 T1024 bf16, tok/s | {a['tok_s']:.0f} | {c['tok_s']:.0f} | {c['tok_s'] / a['tok_s']:.3f} |")
        lines.append(f"| train peak GiB in use | {a['peak_gib']:.2f} | {c['peak_gib']:.2f} | "
                     f"{c['peak_gib'] / max(a['peak_gib'], 1e-9):.3f} |")
        d = max(abs(x - y) / abs(x) for x, y in zip(a["losses"], c["losses"]))
        lines.append(f"| train losses, max relative difference over {len(a['losses'])} steps | | {d:.2e} | |")
    g = res["logits_new_vs_old"]
    lines.append(f"| logits new vs old (32 ids): top-1 agree, max abs top-10, max abs lse | | "
                 f"{100 * g['top1_agree']:.0f}%, {g['max_abs_top10']:.4f}, {g['max_abs_logsumexp']:.4f} | |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
