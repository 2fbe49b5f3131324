#!/usr/bin/env python3
"""The anchor for fpat's FFN numbers: torch eager and torch.compile of the pre-norm SwiGLU FFN
block (RMSNorm, gate and up projections, silu(gate) * up, down projection, residual), timed on
the GPU the way fpat-bench-gemm times fpat: CUDA events around each run, 3 warm-up runs, 20
timed runs per round, 5 rounds taken in turn, the median of all runs; inputs and weights in
several copies used in turn, so that each run reads them from HBM, not from L2.

usage: python3 bench/torch_ffn.py [--d 4096] [--hidden 11008,14336] [--tokens 1,16,512,4096]
       [--dtype f16|bf16]
Writes a markdown table. Needs torch 2 with CUDA (the GPU machine has it); nothing else.
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def block(x, g, wg, wu, wd, eps=1e-6):
    # nn.Linear's layout: weights [out, in]; RMSNorm as Llama writes it (f32 statistics).
    v = x.float().pow(2).mean(-1, keepdim=True)
    n = (x.float() * torch.rsqrt(v + eps)).to(x.dtype) * g
    return x + F.linear(F.silu(F.linear(n, wg)) * F.linear(n, wu), wd)


def time_ms(fn, sets, warmup=3, reps=20, rounds=5):
    times = []
    for _ in range(rounds):
        for i in range(warmup):
            fn(*sets[i % len(sets)])
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        ev[0].record()
        for i in range(reps):
            fn(*sets[i % len(sets)])
            ev[i + 1].record()
        ev[-1].synchronize()
        times += [ev[i].elapsed_time(ev[i + 1]) for i in range(reps)]
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--hidden", default="11008,14336")
    ap.add_argument("--tokens", default="1,16,512,4096")
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    a = ap.parse_args()
    dt = torch.float16 if a.dtype == "f16" else torch.bfloat16
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 50 << 20)
    print(f"# torch {torch.__version__} on {props.name}; {a.dtype}; d = {a.d}; median of "
          f"5 x 20 runs after 3 warm-up runs, CUDA events, buffers rotated past 2x L2\n")
    print("| tokens | hidden | eager ms | torch.compile ms | compile, CUDA graphs ms | "
          "3 GEMMs alone ms | weights read, best compile TB/s | best compile / eager |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    torch._dynamo.config.cache_size_limit = 64  # one graph per shape, specialised
    compiled = torch.compile(block, dynamic=False)

    class Block(torch.nn.Module):
        # CUDA graphs copy every input that is not a parameter on each call: the weights are
        # parameters here, one set of them (3 d h elements, far more than L2 holds).
        def __init__(self, g, wg, wu, wd):
            super().__init__()
            p = lambda t: torch.nn.Parameter(t, requires_grad=False)
            self.g, self.wg, self.wu, self.wd = p(g), p(wg), p(wu), p(wd)

        def forward(self, x):
            return block(x, self.g, self.wg, self.wu, self.wd)

    def gemms(x, g, wg, wu, wd):
        gate = F.linear(x, wg)
        return gate, F.linear(x, wu), F.linear(gate, wd)

    torch.manual_seed(0)
    for h in [int(v) for v in a.hidden.split(",")]:
        for m in [int(v) for v in a.tokens.split(",")]:
            one = (2 * m * a.d + a.d + 3 * a.d * h) * 2
            copies = max(2, 2 * l2 // one + 1)
            sets = [(torch.randn(m, a.d, device=dev, dtype=dt),
                     1 + 0.1 * torch.randn(a.d, device=dev, dtype=dt),
                     torch.randn(h, a.d, device=dev, dtype=dt) * a.d ** -0.5,
                     torch.randn(h, a.d, device=dev, dtype=dt) * a.d ** -0.5,
                     torch.randn(a.d, h, device=dev, dtype=dt) * h ** -0.5)
                    for _ in range(copies)]
            with torch.no_grad():
                eager = time_ms(block, sets)
                comp = time_ms(compiled, sets)
                # CUDA graphs remove the host's launch gaps, which dominate at decode sizes.
                graphed = torch.compile(Block(*sets[0][1:]), dynamic=False,
                                        mode="reduce-overhead")
                cg = time_ms(lambda x, *w: graphed(x), sets)
                bare = time_ms(gemms, sets)
            best = min(comp, cg)
            tbs = 3 * a.d * h * 2 / (best * 1e-3) / 1e12
            print(f"| {m} | {h} | {eager:.3f} | {comp:.3f} | {cg:.3f} | {bare:.3f} | {tbs:.2f} | "
                  f"{best / eager:.2f} |", flush=True)
            del sets


if __name__ == "__main__":
    main()
