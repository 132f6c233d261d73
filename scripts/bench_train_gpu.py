#!/usr/bin/env python3
"""Training throughput and loss parity: loom against PyTorch (transformers) on one GPU.

Usage: bench_train_gpu.py --loom BUILD/loom [--work DIR] [--out DIR] [--steps N] [--batch B]
                          [--seq T] [--skip-compile] [--shape qwen2.5-0.5b|llama-3.2-1b]
One run, GPU otherwise idle, Qwen2.5-0.5B shape (or Llama-3.2-1B's; published configuration, random weights from
transformers' own initializer, seed 0, saved as float32 safetensors so both sides start from the
very same master weights), random token data (seed 0) written as a loom token shard. Both sides
train B sequences of T tokens per step in file order (window k = tokens [kT, kT + T + 1)), with
AdamW (lr 3e-4 constant, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only),
global-norm clipping at 1.0, f32 master weights:
  loom         `loom train --device cuda --dtype bf16 --no-shuffle ...` (bf16 compute); step
               times and losses from its log.jsonl, peak memory from its caching allocator
  torch eager  transformers model in f32, torch.autocast(bfloat16), torch.optim.AdamW(fused=True),
               loss = cross_entropy(logits.float(), targets)
  torch.compile  the same with the model wrapped in torch.compile (default mode)
Throughput = B*T / median step time over the steps after the first WARMUP; MFU uses loom's
model-FLOPs count (6 x matmul weights incl. the output projection + 12 x layers x heads x
head_dim x T per token) and the H200's 989.4 TFLOP/s dense bf16 peak for every column.
Parity: loom's per-step losses against torch eager's over the first steps (same weights, same
batches, same optimizer); both use bf16 matmuls, so agreement is to bf16 rounding (~1e-2), not
bit level. Writes OUT/train_bench.md (table) and OUT/train_bench.json (raw numbers).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import transformers

SHAPES = {
    "qwen2.5-0.5b": ("Qwen2.5-0.5B", transformers.Qwen2Config, dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, max_window_layers=21, bos_token_id=151643,
        eos_token_id=151643)),
    # the published Llama-3.2-1B shape without its llama3 RoPE frequency scaling (which
    # changes no amount of work)
    "llama-3.2-1b": ("Llama-3.2-1B", transformers.LlamaConfig, dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001)),
}
CONFIG = SHAPES["qwen2.5-0.5b"][2]  # the --shape in use (set in main)
PEAK_TFLOPS = 989.4
WARMUP = 3
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loom", required=True)
    p.add_argument("--work", default="/tmp/loom-train-bench")
    p.add_argument("--out", default=".")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--loom-only", action="store_true", help="just the loom run (no PyTorch, no table)")
    return p.parse_args()


def make_checkpoint(work, shape):
    cfg = SHAPES[shape][1](**CONFIG)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    path = os.path.join(work, "model")
    model.save_pretrained(path, safe_serialization=True)
    return path


def write_shard(path, tokens, vocab):
    header = b"LMTOKENS" + np.array([1, 2], "<u4").tobytes() + np.array([len(tokens), vocab], "<u8").tobytes()
    with open(path, "wb") as f:
        f.write(header)
        f.write(tokens.astype("<i4").tobytes())


def batches(tokens, steps, B, T):
    for s in range(steps):
        rows = [tokens[(s * B + b) * T:(s * B + b) * T + T + 1] for b in range(B)]
        x = np.stack(rows)
        yield torch.from_numpy(x[:, :-1].astype(np.int64)), torch.from_numpy(x[:, 1:].astype(np.int64))


def flops_per_token(T):
    c = CONFIG
    H, I, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = H // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    per_layer = H * H * 2 + H * kv * 2 + 3 * H * I
    return 6.0 * (L * per_layer + V * H) + 12.0 * L * c["num_attention_heads"] * hd * T


def run_loom(args, model, shard):
    out = os.path.join(args.work, "loom-run")
    cmd = [args.loom, "train", "--model", model, "--data", shard, "--out", out, "--device", "cuda",
           "--dtype", "bf16", "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
           "--lr", str(LR), "--min-lr", str(LR), "--schedule", "constant", "--warmup", "0",
           "--clip", str(CLIP), "--weight-decay", str(WD), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
           "--no-shuffle"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(r.stderr[-3000:])
    if r.returncode != 0:
        raise SystemExit(f"loom train failed ({r.returncode})")
    steps, mem = [], {}
    with open(os.path.join(out, "log.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j:
                steps.append(j)
            elif "peak_bytes" in j:
                mem = j
    times = [s["step_s"] for s in steps[WARMUP:]]
    return dict(losses=[s["loss"] for s in steps], step_s=statistics.median(times),
                peak_gib=mem.get("peak_bytes", 0) / 2**30, reserved_gib=mem.get("peak_reserved_bytes", 0) / 2**30,
                wall_s=time.time() - t0)


def run_torch(args, model_dir, tokens, compiled):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": other, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, fused=True)
    fwd = torch.compile(model) if compiled else model
    losses, times = [], []
    for x, y in batches(tokens, args.steps, args.batch, args.seq):
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=x).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    res = dict(losses=losses, step_s=statistics.median(times[WARMUP:]),
               peak_gib=torch.cuda.max_memory_allocated() / 2**30,
               reserved_gib=torch.cuda.max_memory_reserved() / 2**30)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return res


def main():
    global CONFIG
    args = parse_args()
    CONFIG = SHAPES[args.shape][2]
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    B, T = args.batch, args.seq
    model = make_checkpoint(args.work, args.shape)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, CONFIG["vocab_size"], size=args.steps * B * T + 1, dtype=np.int64)
    shard = os.path.join(args.work, "train.bin")
    write_shard(shard, tokens, CONFIG["vocab_size"])
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}",
          flush=True)
    results = {"loom": run_loom(args, model, shard)}
    print("loom done", flush=True)
    if args.loom_only:
        r = results["loom"]
        print(f"loom: {r['step_s'] * 1e3:.1f} ms/step, {B * T / r['step_s']:,.0f} tokens/s, losses {r['losses']}")
        return 0
    results["torch eager"] = run_torch(args, model, tokens, False)
    print("torch eager done", flush=True)
    if not args.skip_compile:
        results["torch.compile"] = run_torch(args, model, tokens, True)
        print("torch.compile done", flush=True)
    fpt = flops_per_token(T)
    for r in results.values():
        r["tok_s"] = B * T / r["step_s"]
        r["mfu"] = r["tok_s"] * fpt / (PEAK_TFLOPS * 1e12)
    ref = results["torch eager"]["losses"]
    parity = [abs(a - b) / abs(b) for a, b in zip(results["loom"]["losses"], ref)]
    lines = [f"{SHAPES[args.shape][0]} shape, B={B}, T={T}, {args.steps} steps (median step after {WARMUP}), "
             f"{torch.cuda.get_device_name()}", "",
             "| engine | step ms | tokens/s | MFU | peak GiB (allocated) | reserved GiB | loom / this |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = results["loom"]["tok_s"] / r["tok_s"]
        lines.append(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['tok_s']:,.0f} | {r['mfu'] * 100:.1f}% | "
                     f"{r['peak_gib']:.2f} | {r['reserved_gib']:.2f} | {ratio:.2f}x |")
    lines += ["", "step losses (loom | torch eager | rel diff):"]
    for i, (a, b) in enumerate(zip(results["loom"]["losses"], ref)):
        lines.append(f"  {i + 1:2d}  {a:.5f}  {b:.5f}  {parity[i]:.1e}")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "train_bench.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(args.out, "train_bench.json"), "w") as f:
        json.dump(dict(results=results, parity=parity, flops_per_token=fpt, peak_tflops=PEAK_TFLOPS), f, indent=1)
    worst = max(parity[:5])
    print(f"parity over the first 5 steps: worst relative loss difference {worst:.1e} "
          f"({'OK' if worst <= 2e-2 else 'FAILED'}: gate 2e-2)")
    return 0 if worst <= 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
