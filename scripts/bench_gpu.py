#!/usr/bin/env python3
"""loom against Hugging Face transformers on one GPU, on identical random bf16 checkpoints.

Usage: bench_gpu.py --loom BUILD/loom [--work DIR] [--out DIR] [--only qwen2.5-0.5b|llama-3.2-1b]
For each shape (Qwen2.5-0.5B and Llama-3.2-1B published configurations, random weights from
transformers' own initializer, seed 0) the model is built with transformers in bfloat16 on the
GPU and saved with save_pretrained, so both engines read the very same safetensors. Then, in one
run, with the GPU otherwise idle:
  transformers (PyTorch eager, the model's default attention implementation):
    prefill  B=1, T=512: model(ids, logits_to_keep=1) + argmax, best of 10 after warm-up; the
             Qwen2.5-0.5B shape also at T=4096 (best of 3)
    decode   B=1 and B=32, prompt 16: generate(max_new_tokens=256, min_new_tokens=256, greedy);
             after one warm-up run of the same length, decode time = t(256 new) - t(1 new),
             tokens/s = B * 255 / that; peak memory of the
             256-token run (torch.cuda max allocated / max reserved, weights included); the
             Qwen2.5-0.5B shape also B=1 after prompts of 4,096 and 16,384 tokens (64 new)
  loom (`loom bench prefill|decode --device cuda`, JSON): the same shapes (128 new tokens
    after the long prompts); peak memory from loom's caching allocator (bytes in use /
    reserved), weights included
  the FLOP bound of a prefill: its FLOPs (loom's `prefill_flops`: the layers' products,
    causal attention's two products, the head over the last position) / the bf16 GEMM rate
    torch's matmul reaches on this GPU (8,192 x 8,192 x 8,192, best of 10)
  logits agreement on 32 random ids: loom on CUDA against transformers (bf16) and against loom
    on the CPU (f32 compute on the same bf16 weights): top-1 agreement over positions and the
    max |difference| over the 10 largest logits of each position (plus the logsumexp)
  copy bandwidth (`loom bench bandwidth --device cuda`): HBM roofline for decode = bandwidth /
    bytes one step reads (weights + KV cache at the mean context)
Prints a markdown table (ratios loom / transformers, fraction of the roofline, the goals of
GPU inference at the memory limit in the target column) and writes it to OUT/bench_table.md
with the raw numbers in OUT/bench_results.json.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch
import transformers

SHAPES = {
    "qwen2.5-0.5b": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        max_window_layers=21, bos_token_id=151643, eos_token_id=151643)),
    "llama-3.2-1b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
        eos_token_id=128001,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
}
PREFILL_T, DECODE_PROMPT, DECODE_NEW = 512, 16, 256
# the Qwen2.5-0.5B shape only: a long prefill and decode after long prompts (new tokens:
# transformers, loom)
LONG_PREFILL_T, LONG_CONTEXTS, LONG_NEW = 4096, (4096, 16384), (64, 128)
LONG_SHAPES = ("qwen2.5-0.5b",)
# the goals (docs/CUDA.md, bench/NOTES.md "Decode at the memory limit")
TARGETS = {
    "qwen2.5-0.5b": {"prefill_ms": 1.3, "decode1_tok_s": 2500.0, "decode32_tok_s": 50000.0,
                     "decode1_ctx16384_tok_s": 1500.0, "prefill4096_x_flop_bound": 1.5},
    "llama-3.2-1b": {"decode1_tok_s": 1100.0},
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loom", required=True, help="the loom executable (built with CUDA)")
    p.add_argument("--work", default="/tmp/loom-bench-models", help="where the checkpoints are written")
    p.add_argument("--out", default=".", help="where bench_table.md and bench_results.json go")
    p.add_argument("--only", choices=sorted(SHAPES), action="append", help="just these shapes")
    return p.parse_args()


def make_checkpoint(name, work):
    cls, kw = SHAPES[name]
    cfg = getattr(transformers, cls)(**kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    path = os.path.join(work, name)
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def hf_prefill(model, vocab, T=PREFILL_T, runs=10):
    ids = torch.randint(0, vocab, (1, T), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    run = lambda: model(ids, logits_to_keep=1).logits[:, -1].argmax(-1)  # noqa: E731
    with torch.inference_mode():
        for _ in range(3):
            run()
        times = sorted(sync_time(run)[0] for _ in range(runs))
    return {"best_ms": times[0] * 1e3, "median_ms": times[len(times) // 2] * 1e3}


def hf_decode(model, vocab, batch, prompt=DECODE_PROMPT, new=DECODE_NEW):
    ids = torch.randint(0, vocab, (batch, prompt), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(2))
    kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids))
    gen = lambda n: model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)  # noqa: E731
    with torch.inference_mode():
        # warm-up at the full length: the first pass through each cache length is several
        # times slower (H100, Qwen2.5-0.5B shape, B1: 66.7 ms a step against 17.6 once warm)
        gen(new)
        t1, _ = sync_time(lambda: gen(1))
        torch.cuda.reset_peak_memory_stats()
        tn, out = sync_time(lambda: gen(new))
    assert out.shape[1] == prompt + new, out.shape
    return {"tok_per_s": batch * (new - 1) / (tn - t1), "total_s": tn,
            "peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}


def gemm_tflops():
    """The bf16 GEMM rate torch's matmul reaches here: 8,192^3, best of 10 after warm-up."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = min(sync_time(lambda: a @ b)[0] for _ in range(10))
    return 2 * n**3 / best / 1e12


def run_json(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def loom_logits(loom, path, ids, device):
    cmd = [loom, "logits", "--model", path, "--ids", ",".join(map(str, ids)), "--top", "10", "--device", device]
    return run_json(cmd)


def compare_logits(rows, ref_logits):
    """rows: loom JSON lines; ref_logits [T, V] float tensor (CPU). -> agreement metrics."""
    top1 = maxdiff = lse = 0.0
    ref_lse = torch.logsumexp(ref_logits, dim=-1)
    for t, row in enumerate(rows):
        ids = [i for i, _ in row["top"]]
        vals = torch.tensor([v for _, v in row["top"]])
        top1 += float(ids[0] == int(ref_logits[t].argmax()))
        d = (vals - ref_logits[t, ids]).abs()
        d = d[torch.isfinite(d)]  # a loom-to-loom comparison only knows both runs' top-10
        maxdiff = max(maxdiff, float(d.max()) if d.numel() else 0.0)
        lse = max(lse, abs(row["logsumexp"] - float(ref_lse[t])))
    return {"top1_agree": top1 / len(rows), "max_abs_top10": maxdiff, "max_abs_logsumexp": lse,
            "ref_logit_std": float(ref_logits.std())}


def rows_to_tensor(rows, vocab):
    """Loom rows -> a [T, V] tensor holding only the top-10 logits (-inf elsewhere), for
    comparing two loom runs through compare_logits' top-10 lookup."""
    t = torch.full((len(rows), vocab), float("-inf"))
    for i, row in enumerate(rows):
        for j, v in row["top"]:
            t[i, j] = v
    return t


def agreement(loom, model, path, vocab):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (32,), generator=g).tolist()
    with torch.inference_mode():
        hf = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
    gpu = loom_logits(loom, path, ids, "cuda")
    cpu = loom_logits(loom, path, ids, "cpu")
    vs_cpu = compare_logits(gpu, rows_to_tensor(cpu, vocab))
    vs_cpu.pop("ref_logit_std")
    vs_cpu["max_abs_logsumexp"] = max(abs(a["logsumexp"] - b["logsumexp"]) for a, b in zip(gpu, cpu))
    return {"loom_cuda_vs_transformers": compare_logits(gpu, hf), "loom_cuda_vs_loom_cpu": vs_cpu}


def bench_shape(args, name, bandwidth):
    print(f"== {name}: building the checkpoint", flush=True)
    model, path = make_checkpoint(name, args.work)
    vocab = model.config.vocab_size
    r = {"model": name, "path": path}
    print(f"== {name}: transformers", flush=True)
    r["hf_prefill"] = hf_prefill(model, vocab)
    r["hf_decode1"] = hf_decode(model, vocab, 1)
    r["hf_decode32"] = hf_decode(model, vocab, 32)
    if name in LONG_SHAPES:
        r["hf_prefill_long"] = hf_prefill(model, vocab, LONG_PREFILL_T, runs=3)
        for c in LONG_CONTEXTS:
            r[f"hf_decode1_ctx{c}"] = hf_decode(model, vocab, 1, prompt=c, new=LONG_NEW[0])
    print(f"== {name}: logits agreement", flush=True)
    r["agreement"] = agreement(args.loom, model, path, vocab)
    del model
    torch.cuda.empty_cache()
    print(f"== {name}: loom", flush=True)
    base = [args.loom, "bench"]
    r["loom_prefill"] = run_json(base + ["prefill", "--device", "cuda", "--model", path, "--prompt", str(PREFILL_T),
                                         "--batch", "1", "--repeat", "10"])[0]
    for b in (1, 32):
        r[f"loom_decode{b}"] = run_json(base + ["decode", "--device", "cuda", "--model", path, "--prompt",
                                                str(DECODE_PROMPT), "--tokens", str(DECODE_NEW), "--batch", str(b),
                                                "--repeat", "3"])[0]
    if name in LONG_SHAPES:
        r["loom_prefill_long"] = run_json(base + ["prefill", "--device", "cuda", "--model", path, "--prompt",
                                                  str(LONG_PREFILL_T), "--batch", "1", "--repeat", "3"])[0]
        for c in LONG_CONTEXTS:
            r[f"loom_decode1_ctx{c}"] = run_json(base + ["decode", "--device", "cuda", "--model", path, "--prompt",
                                                         str(c), "--tokens", str(LONG_NEW[1]), "--batch", "1",
                                                         "--repeat", "3"])[0]
    r["copy_gb_s"] = bandwidth
    return r


def mib(x):
    return f"{x / 2**20:.0f}"


def table(results, versions):
    lines = [f"GPU: {versions['gpu']}; torch {versions['torch']}, transformers {versions['transformers']}; "
             f"copy bandwidth {results[0]['copy_gb_s']:.0f} GB/s (read + write); bf16 GEMM "
             f"{versions['gemm_tflops']:.0f} TFLOP/s (torch, 8,192^3)", "",
             "| model | measure | transformers | loom | loom vs transformers | target |",
             "|---|---|---|---|---|---|"]
    for r in results:
        tg = TARGETS.get(r["model"], {})
        hp, lp = r["hf_prefill"]["best_ms"], r["loom_prefill"]["best_s"] * 1e3
        lines.append(f"| {r['model']} | prefill B1 T512, ms (best) | {hp:.2f} | {lp:.3f} | {hp / lp:.1f}x faster | "
                     f"{'<= %.1f' % tg['prefill_ms'] if 'prefill_ms' in tg else ''} |")
        if "loom_prefill_long" in r:
            hp, lp = r["hf_prefill_long"]["best_ms"], r["loom_prefill_long"]["best_s"] * 1e3
            bound = r["loom_prefill_long"]["prefill_flops"] / (versions["gemm_tflops"] * 1e12) * 1e3
            tgt = tg.get("prefill4096_x_flop_bound")
            lines.append(f"| {r['model']} | prefill B1 T{LONG_PREFILL_T}, ms (best); x the FLOP bound "
                         f"({bound:.2f} ms) | {hp:.2f}; {hp / bound:.1f}x | {lp:.3f}; {lp / bound:.2f}x | "
                         f"{hp / lp:.1f}x faster | "
                         f"{'<= %.1fx' % tgt if tgt else ''} |")
        for b in (1, 32):
            h, lm = r[f"hf_decode{b}"], r[f"loom_decode{b}"]
            tgt = tg.get(f"decode{b}_tok_s")
            lines.append(f"| {r['model']} | decode B{b}, tok/s | {h['tok_per_s']:.0f} | {lm['tok_per_s']:.0f} | "
                         f"{lm['tok_per_s'] / h['tok_per_s']:.1f}x | {'>= %.0f' % tgt if tgt else ''} |")
            roof = lm["roofline_tok_per_s"]
            lines.append(f"| {r['model']} | decode B{b}, % of HBM roofline ({roof:.0f} tok/s) | "
                         f"{100 * h['tok_per_s'] / roof:.1f}% | {100 * lm['fraction_of_roofline']:.1f}% | | |")
            for c in LONG_CONTEXTS if b == 1 else ():
                if f"loom_decode1_ctx{c}" not in r:
                    continue
                hc, lc = r[f"hf_decode1_ctx{c}"], r[f"loom_decode1_ctx{c}"]
                tgt = tg.get(f"decode1_ctx{c}_tok_s")
                lines.append(f"| {r['model']} | decode B1 at context {c}, tok/s; % of HBM roofline | "
                             f"{hc['tok_per_s']:.0f} | {lc['tok_per_s']:.0f}; "
                             f"{100 * lc['fraction_of_roofline']:.1f}% | "
                             f"{lc['tok_per_s'] / hc['tok_per_s']:.1f}x | {'>= %.0f' % tgt if tgt else ''} |")
            if "achieved_gb_s" in lm:
                lines.append(f"| {r['model']} | decode B{b}, weight GB/s achieved; kernels per step | | "
                             f"{lm['achieved_gb_s']:.0f}; {lm.get('kernels_per_step', 0)} | | |")
            lines.append(f"| {r['model']} | decode B{b}, peak MiB in use / reserved | {mib(h['peak_allocated'])} / "
                         f"{mib(h['peak_reserved'])} | {mib(lm['peak_bytes'])} / {mib(lm['peak_reserved_bytes'])} | "
                         f"{lm['peak_reserved_bytes'] / h['peak_reserved']:.2f}x reserved | <= transformers |")
        a, c = r["agreement"]["loom_cuda_vs_transformers"], r["agreement"]["loom_cuda_vs_loom_cpu"]
        lines.append(f"| {r['model']} | logits vs transformers bf16: top-1 agree, max abs top-10, logit std | | "
                     f"{100 * a['top1_agree']:.0f}%, {a['max_abs_top10']:.4f}, {a['ref_logit_std']:.3f} | | |")
        lines.append(f"| {r['model']} | logits vs loom CPU (f32): top-1 agree, max abs top-10, max abs lse | | "
                     f"{100 * c['top1_agree']:.0f}%, {c['max_abs_top10']:.4f}, {c['max_abs_logsumexp']:.4f} | | |")
    return "\n".join(lines)


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    bw = run_json([args.loom, "bench", "bandwidth", "--device", "cuda", "--repeat", "10"])[0]["copy_gb_s"]
    versions["gemm_tflops"] = gemm_tflops()
    results = []
    for name in args.only or list(SHAPES):
        results.append(bench_shape(args, name, bw))
        with open(os.path.join(args.out, "bench_results.json"), "w") as f:
            json.dump({"versions": versions, "results": results}, f, indent=1)
    text = table(results, versions)
    print(text)
    with open(os.path.join(args.out, "bench_table.md"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
