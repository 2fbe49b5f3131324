#!/usr/bin/env python3
"""The anchor for fpat's attention numbers: torch SDPA's FlashAttention-2 and cuDNN backends at
fpat-bench-attn's cases, timed the same way: 3 warm-up runs, then CUDA events around each of
20 runs, the median; q, k and v in enough copies used in turn that a run reads them from HBM.

Prefill: 16k tokens a batch (B = 16384 / S), hidden 2048 (H = 2048 / d), S 512 ... 16k, d 64
and 128, causal and not (FLOPs 4 B H S^2 d, halved when causal). Decode: one query token,
32 query heads and 8 KV heads (enable_gqa), d 128, KV 4k ... 64k, batch 1 and 16 (GB/s of
K and V read), next to what one kernel that only reads as many bytes reaches (torch's sum of
a buffer of the cache's size: the bandwidth a decode step can hope for, launch and ramp included).

usage: python3 bench/torch_attn.py [--quick] [--dtype f16|bf16] [--no-prefill] [--d 64,128]
Writes a markdown table. Needs torch >= 2.5 with CUDA (the GPU machine has it).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_ffn import time_ms  # the same timing (here one round of 20 runs)


def make_sets(b, h, hkv, sq, sk, d, dt, l2):
    # Token-major buffers [B, S, H, d], as fpat reads them, seen as [B, H, S, d].
    per = 2 * (b * sq * h * d + 2 * b * sk * hkv * d)
    n = max(1, min(8, -(-2 * l2 // per)))
    sets = []
    for _ in range(n):
        q = torch.randn(b, sq, h, d, device="cuda", dtype=dt).transpose(1, 2)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt).transpose(1, 2)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dt).transpose(1, 2)
        sets.append((q, k, v))
    return sets


def per_backend(backends, sets, work, fmt, fn):
    """`work` per millisecond of `fn` under each SDPA backend, formatted; n/a where a backend
    refuses the case."""
    row = []
    for _, be in backends:
        try:
            with sdpa_kernel(be):
                ms = time_ms(fn, sets, rounds=1)
            row.append(format(work / ms, fmt))
        except RuntimeError as e:
            row.append("n/a (" + str(e).splitlines()[0][:40] + ")")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--no-prefill", action="store_true", help="only the decode cases")
    ap.add_argument("--no-decode", action="store_true", help="only the prefill cases")
    ap.add_argument("--d", default="64,128", help="the prefill cases' head dimensions")
    a = ap.parse_args()
    dt = torch.float16 if a.dtype == "f16" else torch.bfloat16
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    backends = [("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION)]
    print(f"# torch {torch.__version__} on {props.name}; {a.dtype}; median of 20 runs after 3 "
          "warm-up runs, CUDA events, buffers rotated past 2x L2\n")
    print("## prefill\n\n| d | S | B | H | causal | FA2 TFLOP/s | cuDNN TFLOP/s |")
    print("|---:|---:|---:|---:|---|---:|---:|")
    for d in () if a.no_prefill else [int(x) for x in a.d.split(",")]:
        for s in (512, 1024, 2048, 4096, 8192, 16384):
            if a.quick and (d != 128 or s not in (1024, 8192)):
                continue
            b, h = 16384 // s, 2048 // d
            sets = make_sets(b, h, h, s, s, d, dt, l2)
            for causal in (False, True):
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                row = per_backend(backends, sets, flops / 1e9, ".1f",
                                  lambda q, k, v: F.scaled_dot_product_attention(
                                      q, k, v, is_causal=causal))
                print(f"| {d} | {s} | {b} | {h} | {'yes' if causal else 'no'} | "
                      + " | ".join(row) + " |", flush=True)
            del sets
            torch.cuda.empty_cache()
    if a.no_decode:
        return
    print("\n## decode (32 query heads, 8 KV heads, d 128)\n")
    print("| B | KV length | FA2 GB/s | cuDNN GB/s | plain read GB/s |\n|---:|---:|---:|---:|---:|")
    for b in (1, 16):
        for kv in (4096, 16384, 65536):
            if (a.quick and kv != 16384) or (b == 16 and kv > 16384):
                continue
            sets = make_sets(b, 32, 8, 1, kv, 128, dt, l2)
            nbytes = 2 * b * kv * 8 * 128 * 2
            row = per_backend(backends, sets, nbytes / 1e6, ".0f",
                              lambda q, k, v: F.scaled_dot_product_attention(
                                  q, k, v, enable_gqa=True))
            del sets
            reads = [(torch.randn(nbytes // 2, device="cuda", dtype=dt),)
                     for _ in range(max(1, min(8, -(-2 * l2 // nbytes))))]
            row.append(format(nbytes / 1e6 / time_ms(lambda x: x.sum(), reads, rounds=1), ".0f"))
            print(f"| {b} | {kv} | " + " | ".join(row) + " |", flush=True)
            del reads
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
