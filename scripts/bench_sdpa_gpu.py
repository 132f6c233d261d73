#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention timed at loom's training attention shapes.

The peer for bench/cuda_train_ops.c's flash attention lines: bf16 q, k, v of
[B, H, T, 64], causal, the same FLOP count (4 B Hq T^2 D / 2 forward, 2.5x that
backward). Grouped kv heads are given to SDPA twice: with enable_gqa=True and with
K/V repeated to every query head (the form the flash backend takes). The backward is
timed alone (out.backward with retain_graph, O and the logsumexp kept from the
forward); loom's lab line includes its forward recompute. Prints one JSON line per
measurement. Runs on the GPU machine: python3 scripts/bench_sdpa_gpu.py
"""
import json

import torch
import torch.nn.functional as F


def timed(fn, reps=10):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1e3  # us


def main():
    torch.manual_seed(0)
    for B, T, Hq, Hkv in ((8, 1024, 14, 2), (4, 2048, 32, 8)):
        D = 64
        fl = 4.0 * B * Hq * T * T * D / 2
        q = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, Hkv, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dout = torch.randn(B, Hq, T, D, device="cuda", dtype=torch.bfloat16)
        rep = Hq // Hkv
        for form in ("enable_gqa", "repeated_kv"):
            if form == "enable_gqa":
                run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                kr = k.detach().repeat_interleave(rep, 1).requires_grad_(True)
                vr = v.detach().repeat_interleave(rep, 1).requires_grad_(True)
                run = lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True)
            with torch.no_grad():
                fwd = timed(run)
            out = run()
            bwd = timed(lambda: out.backward(dout, retain_graph=True))
            name = f"B{B} T{T} H{Hq}/{Hkv} D64 causal, {form}"
            print(json.dumps({"op": "torch sdpa fwd " + name, "us": round(fwd, 1), "tflops": round(fl / fwd / 1e6, 1)}))
            print(json.dumps({"op": "torch sdpa bwd " + name, "us": round(bwd, 1), "tflops": round(2.5 * fl / bwd / 1e6, 1)}))


if __name__ == "__main__":
    main()
