#!/usr/bin/env python3
"""Exports the MLP blocks fpat's ONNX tests import, with PyTorch's own exporter.

    /usr/bin/python3 tests/onnx/export_models.py OUTDIR

Writes gpt2_mlp_opset{13,17}.onnx and llama_mlp_opset{13,17}.onnx, and the MLPs of Hugging
Face's hand-written activations and T5 at opset 13: f32, as torch.onnx.export
writes them, inputs [batch, seq, d]; and gpt2_mlp_dyn_opset17.onnx, llama_mlp_dyn_opset13.onnx
and hf_gpt2_mlp_dyn_opset13.onnx (Hugging Face's Conv1D: views of the rows, shape arithmetic)
with batch and seq symbolic (dynamic axes: fpatc --dim batch=B --dim seq=T). Needs Debian's python3-torch (1.13) and python3-onnx; the
files in tests/onnx/models were made with it. Small sizes keep them small: d = 64.
"""
import math
import os
import sys

import torch
from torch import nn

D, HIDDEN, BATCH, SEQ = 64, 176, 2, 50  # 100 token rows: no multiple of any tile


class Gpt2Mlp(nn.Module):
    """GPT-2's MLP sub-block: x + c_proj(gelu(c_fc(ln_2(x)))) (tanh GeLU as in GPT-2)."""

    def __init__(self, approximate):
        super().__init__()
        self.ln = nn.LayerNorm(D, eps=1e-5)
        self.fc = nn.Linear(D, HIDDEN)
        self.act = nn.GELU(approximate=approximate)
        self.proj = nn.Linear(HIDDEN, D)

    def forward(self, x):
        return x + self.proj(self.act(self.fc(self.ln(x))))


class RmsNorm(nn.Module):
    """Llama's RMSNorm, as Hugging Face writes it."""

    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class LlamaMlp(nn.Module):
    """Llama's MLP sub-block: x + down(silu(gate(n)) * up(n)), n = rmsnorm(x)."""

    def __init__(self):
        super().__init__()
        self.norm = RmsNorm()
        self.gate = nn.Linear(D, HIDDEN, bias=False)
        self.up = nn.Linear(D, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)
        self.act = nn.SiLU()

    def forward(self, x):
        n = self.norm(x)
        return x + self.down(self.act(self.gate(n)) * self.up(n))


class NewGelu(nn.Module):
    """Hugging Face's gelu_new (GPT-2, Phi, GPT-J, Flan-T5): the tanh GeLU, written out."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) *
                                           (x + 0.044715 * torch.pow(x, 3.0))))


class FastGelu(nn.Module):
    """Hugging Face's gelu_fast: the same function, the cube factored differently."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class QuickGelu(nn.Module):
    """Hugging Face's quick_gelu (CLIP): x * sigmoid(1.702 x)."""

    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 Conv1D: a linear layer as addmm over the rows, viewed back."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.05)
        self.bias = nn.Parameter(torch.randn(nf) * 0.05)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class HfGpt2Mlp(nn.Module):
    """Hugging Face's GPT2MLP with its block's ln_2 and residual: Conv1D layers, gelu_new."""

    def __init__(self):
        super().__init__()
        self.ln_2 = nn.LayerNorm(D, eps=1e-5)
        self.c_fc = Conv1D(HIDDEN, D)
        self.act = NewGelu()
        self.c_proj = Conv1D(D, HIDDEN)

    def forward(self, x):
        return x + self.c_proj(self.act(self.c_fc(self.ln_2(x))))


class ActMlp(nn.Module):
    """An MLP sub-block with a hand-written activation: x + fc2(act(fc1(x)))."""

    def __init__(self, act, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(D, HIDDEN, bias=bias)
        self.act = act
        self.fc2 = nn.Linear(HIDDEN, D, bias=bias)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    models = {"gpt2_mlp": Gpt2Mlp("tanh"), "gpt2_mlp_erf": Gpt2Mlp("none"),
              "llama_mlp": LlamaMlp()}

    for name, m in models.items():
        # Non-trivial norm scales, so a wrong gamma cannot pass.
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1 and not isinstance(m, Gpt2Mlp) or p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5 if p.dim() == 1 else p)
        m.eval()
        x = torch.randn(BATCH, SEQ, D)
        for opset in (13, 17):
            path = os.path.join(out, f"{name}_opset{opset}.onnx")
            torch.onnx.export(m, (x,), path, opset_version=opset, input_names=["x"],
                              output_names=["y"], do_constant_folding=True)
            print(path)
    # Hugging Face's hand-written activations, and T5's feed-forward (ReLU, no biases); made
    # after the others, so that those come out as before.
    hf = {"gelu_new_mlp": ActMlp(NewGelu()), "gelu_fast_mlp": ActMlp(FastGelu()),
          "quick_gelu_mlp": ActMlp(QuickGelu()), "t5_mlp": ActMlp(nn.ReLU(), bias=False)}
    for name, m in hf.items():
        m.eval()
        x = torch.randn(BATCH, SEQ, D)
        path = os.path.join(out, f"{name}_opset13.onnx")
        torch.onnx.export(m, (x,), path, opset_version=13, input_names=["x"],
                          output_names=["y"], do_constant_folding=True)
        print(path)
    # Dynamic axes, as a user exporting for any sequence length writes them; made last, so
    # that the files above come out as before.
    dyn = {"gpt2_mlp_dyn_opset17": (Gpt2Mlp("tanh"), 17), "llama_mlp_dyn_opset13": (LlamaMlp(), 13)}
    axes = {0: "batch", 1: "seq"}
    for name, (m, opset) in dyn.items():
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5)
        m.eval()
        x = torch.randn(BATCH, SEQ, D)
        path = os.path.join(out, f"{name}.onnx")
        torch.onnx.export(m, (x,), path, opset_version=opset, input_names=["x"],
                          output_names=["y"], do_constant_folding=True,
                          dynamic_axes={"x": axes, "y": axes})
        print(path)
    # Hugging Face's GPT-2 MLP: Shape, Gather, Slice, Concat and Reshape around each view,
    # folded once --dim gives the sizes; made last, so that the files above come out as before.
    m = HfGpt2Mlp().eval()
    x = torch.randn(BATCH, SEQ, D)
    path = os.path.join(out, "hf_gpt2_mlp_dyn_opset13.onnx")
    torch.onnx.export(m, (x,), path, opset_version=13, input_names=["x"], output_names=["y"],
                      do_constant_folding=True, dynamic_axes={"x": axes, "y": axes})
    print(path)


if __name__ == "__main__":
    main()
