#!/usr/bin/env python3
"""Exports the MLP blocks fpat's ONNX tests import, with PyTorch's own exporter.

    /usr/bin/python3 tests/onnx/export_models.py OUTDIR

Writes gpt2_mlp_opset{13,17}.onnx and llama_mlp_opset{13,17}.onnx, and the MLPs of Hugging
Face's hand-written activations and T5 at opset 13: f32, as torch.onnx.export
writes them, inputs [batch, seq, d]; and gpt2_mlp_dyn_opset17.onnx, llama_mlp_dyn_opset13.onnx
and hf_gpt2_mlp_dyn_opset13.onnx (Hugging Face's Conv1D: views of the rows, shape arithmetic)
with batch and seq symbolic (dynamic axes: fpatc --dim batch=B --dim seq=T); and the attention
sub-blocks of GPT-2 (Hugging Face's eager attention: one c_attn GEMM split in three, heads as
views, a bool causal buffer and torch.where) and a Llama decoder layer (RMSNorm, rotate_half
RoPE, GQA by repeat_kv, an additive causal mask, then its SwiGLU MLP), gpt2_attn_opset{13,17}
and llama_layer_opset{13,17}; and for any sequence length (batch and seq symbolic), those two
and GPT-2 with attention as the exporter decomposes scaled_dot_product_attention (width 128,
heads of 64): gpt2_attn_dyn_opset17, llama_layer_dyn_opset17, gpt2_sdpa_dyn_opset17; and
GPT-NeoX's attention (rotary on a quarter of each head), neox_attn_dyn_opset17; and a BERT
layer with its padding mask an input, an OPT layer (torch.bmm form) and T5's attention
(relative-position buckets), {bert_layer,opt_layer,t5_attn}_dyn_opset17, and Falcon's
multi-query layer, an explicitly expanded one and heads split apart along their axis,
{falcon_layer,mqa_attn,split_heads}_dyn_opset17, and BERT as Hugging Face writes it (an int64
attention_mask scaled by finfo.min), hf_bert_dyn_opset17, and DistilBERT's attention (the mask
compared with 0, expanded, masked_fill), distil_attn_dyn_opset17, and BLOOM's (a fused projection
viewed as [B, S, H, 3, d], ALiBi by baddbmm), bloom_attn_dyn_opset17, and GPT-2's eager attention
given a bool padding mask, gpt2_boolmask_dyn_opset17, and Hugging Face's causal and expanded
padding masks of Llama before 4.38, hf_mask_attn_dyn_opset17, and MPT's attention (torch.chunk of
a clamped projection, ALiBi), mpt_attn_dyn_opset17, and Hugging Face's Llama masks from 4.38
(_update_causal_mask: the padding mask summed with the causal one and compared with 0, or And-ed,
written into it through a slice assignment), hf_causal_{sum,and}_dyn_opset17, Mistral's sliding
window, hf_sliding_dyn_opset17, and 4.35-4.37's to_4d, hf_to4d_dyn_opset17, and Llama's rotary
as 4.38-4.44 compute it (inv_freq @ position_ids), hf_rotary_dyn_opset17, or as 4.45 on take it
(cos and sin inputs), hf_posemb_dyn_opset17, a padding mask Or-ed with a causal one and given to
masked_fill, or_mask_dyn_opset17, Qwen2's attention (biases, GQA, its rotary written the
partial way over the whole head: an empty slice joined), qwen2_attn_dyn_opset17, Phi-2's
parallel block, phi2_block_dyn_opset17, Gemma's MLP (RMSNorm by 1 + weight, GeGLU),
gemma_mlp_dyn_opset17, GPTBigCode's multi-query attention (the query's heads as rows,
baddbmm), bigcode_attn_dyn_opset17, and given a float padding mask, bigcode_pad_dyn_opset17,
or its int64 attention_mask as Hugging Face builds it (a causal buffer times the mask,
unsqueezed), hf_bigcode_dyn_opset17, and with multi_query=False (Split of the heads),
hf_bigcode_mha_dyn_opset17, and GPT-J's
attention (interleaved rotary on part of each head), gptj_attn_dyn_opset17, and torch.nn's own
MultiheadAttention, TransformerEncoderLayer (post-norm ReLU, pre-norm GeLU) and
TransformerDecoderLayer (cross-attention to a memory of length mseq), batch_first,
torch_{mha,encoder,encoder_pre,decoder}_dyn_opset17, and the encoder layer given
src_key_padding_mask, torch_encoder_pad_dyn_opset17, and the three sequence-first (torch's
default, batch_first=False; x [seq, batch, d]), and nn.Transformer so (one encoder and one
decoder layer), torch_{mha,encoder,decoder,transformer}_sf_dyn_opset17, and an attention block
in fairseq's layout (x [T, B, C] transposed to batch-first on entry and back on exit),
fairseq_attn_sf_dyn_opset17, and an encoder layer whose output is added to a second
sequence-first input, torch_encoder_res_sf_dyn_opset17, with
torch's output at length 7 in OUTDIR/../expect (fpatc --inputs/--expect). Needs
Debian's python3-torch (1.13, which has no scaled_dot_product_attention) and python3-onnx;
the files in tests/onnx/models were made with it. Small sizes keep them small: d = 64.
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


HEADS, KV_HEADS, MAX_POS = 4, 2, 128  # head dim 16; Llama's GQA: 2 query heads per KV head


class Gpt2Attn(nn.Module):
    """GPT-2's attention sub-block as Hugging Face's eager GPT2Attention writes it:
    x + c_proj(merge(softmax(where(causal, q k^T / sqrt(dh), finfo.min)) v)), q, k, v =
    split(c_attn(ln_1(x))); the causal mask a bool buffer sliced to the sequence."""

    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D, eps=1e-5)
        self.c_attn = Conv1D(3 * D, D)
        self.c_proj = Conv1D(D, D)
        self.register_buffer("bias", torch.tril(torch.ones(MAX_POS, MAX_POS, dtype=torch.bool))
                             .view(1, 1, MAX_POS, MAX_POS))

    def heads(self, t):
        return t.view(t.size()[:-1] + (HEADS, D // HEADS)).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        s = q.size(-2)
        causal = self.bias[:, :, :s, :s]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = nn.functional.softmax(w, dim=-1)
        o = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous()
        return x + self.c_proj(o.view(o.size()[:-2] + (D,)))


class Gpt2AttnBoolMask(Gpt2Attn):
    """GPT-2's eager attention given a bool padding mask input (True: attend): the causal
    where, then where(mask[:, None, None, :], w, finfo.min)."""
    def forward(self, x, m):
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        s = q.size(-2)
        low = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
        w = torch.where(self.bias[:, :, :s, :s], w, low)
        w = torch.where(m[:, None, None, :], w, low)
        o = torch.matmul(nn.functional.softmax(w, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        return x + self.c_proj(o.view(o.size()[:-2] + (D,)))


class HfMaskAttn(nn.Module):
    """Hugging Face's Llama attention masks before 4.38: _make_causal_mask (finfo.min above the
    diagonal, expanded to [B, 1, S, S]) plus _expand_mask of the int64 attention_mask (expanded,
    cast, inverted, masked_fill where the inversion cast to bool is set), added to the scores
    and clamped at finfo.min; softmax in f32."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        low = torch.finfo(x.dtype).min
        causal = torch.full((s, s), low)
        cond = torch.arange(s)
        causal.masked_fill_(cond < (cond + 1).view(s, 1), 0)
        causal = causal[None, None].expand(b, 1, s, s)
        inv = 1.0 - m[:, None, None, :].expand(b, 1, s, s).to(x.dtype)
        inv = inv.masked_fill(inv.to(torch.bool), low)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh) + (inv + causal)
        w = torch.max(w, torch.tensor(low))
        c = torch.matmul(nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return x + self.o(c.transpose(1, 2).reshape(b, s, D))


class HfCausalMaskAttn(nn.Module):
    """Hugging Face's Llama attention masks from 4.38 (_update_causal_mask, eager attention, no
    cache): finfo.min above the diagonal (triu, times arange > cache_position), expanded to
    [B, 1, S, S] and cloned; the int64 attention_mask combined with it, as 4.42 on does (summed
    with it and compared with 0) or as 4.38-4.41 did (both compared with 0 and multiplied, And),
    and written into it by masked_fill through a slice assignment (ScatterND); added to the
    scores; softmax in f32. "sliding": Mistral's, keys more than 5 back masked too (Or);
    "to4d": 4.35-4.37's AttentionMaskConverter.to_4d (the causal constant masked_fill'ed where
    the inverted, expanded padding mask is set)."""
    def __init__(self, combine="sum"):
        super().__init__()
        self.combine = combine
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
    def causal_mask(self, m, b, s, dtype):
        low = torch.finfo(dtype).min
        if self.combine == "to4d":
            causal = torch.full((s, s), low)
            cond = torch.arange(s)
            causal.masked_fill_(cond < (cond + 1).view(s, 1), 0)
            inverted = 1.0 - m[:, None, None, :].expand(b, 1, s, s).to(dtype)
            padding = inverted.masked_fill(inverted.to(torch.bool), low)
            return causal[None, None].expand(b, 1, s, s).masked_fill(padding.bool(), low)
        cache_position = torch.arange(s)
        target = m.shape[-1]
        cm = torch.triu(torch.full((s, target), fill_value=low, dtype=dtype), diagonal=1)
        if self.combine == "sliding":
            cm = torch.full((s, target), fill_value=low, dtype=dtype)
            keep = torch.arange(target) > cache_position.reshape(-1, 1)
            cm *= keep | (torch.arange(target) <= cache_position.reshape(-1, 1) - 5)
        else:
            cm *= torch.arange(target) > cache_position.reshape(-1, 1)
        cm = cm[None, None, :, :].expand(b, 1, -1, -1).clone()
        n = m.shape[-1]
        if self.combine in ("sum", "sliding"):
            pad = (cm[:, :, :, :n] + m[:, None, None, :]) == 0
        else:
            pad = cm[:, :, :, :n].eq(0.0) * m[:, None, None, :].eq(0.0)
        cm[:, :, :, :n] = cm[:, :, :, :n].masked_fill(pad, low)
        return cm
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        cm = self.causal_mask(m, b, s, x.dtype)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh) + cm[:, :, :, : k.shape[-2]]
        c = torch.matmul(nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return x + self.o(c.transpose(1, 2).reshape(b, s, D))


def rotate_every_two(x):
    return torch.stack((-x[:, :, :, 1::2], x[:, :, :, ::2]), dim=-1).flatten(-2)


class GptJAttn(nn.Module):
    """GPT-J's attention: rotary on the first 8 of each head's 16 dimensions in the interleaved
    form (rotate_every_two: strided slices, stack, flatten; sin and cos gathered from a table
    by position and repeat_interleave'd), applied on [B, S, H, d] before the transpose; causal
    by torch.where with finfo.min."""
    def __init__(self, rotary_dim=8, positions=2048):
        super().__init__()
        self.rd = rotary_dim
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2) / rotary_dim))
        t = torch.einsum("i , j -> i j", torch.arange(positions, dtype=torch.float), inv)
        self.register_buffer("embed_positions", torch.cat((torch.sin(t), torch.cos(t)), dim=1))
    def rotary(self, t, sin, cos):
        sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
        cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
        r = t[:, :, :, : self.rd]
        return torch.cat([r * cos + rotate_every_two(r) * sin, t[:, :, :, self.rd :]], dim=-1)
    def forward(self, x):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        sincos = self.embed_positions[torch.arange(s)[None].expand(b, s)]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        q = self.rotary(q, sin, cos).permute(0, 2, 1, 3)
        k = self.rotary(k, sin, cos).permute(0, 2, 1, 3)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = torch.where(torch.ones(s, s, dtype=torch.bool).tril(), w,
                        torch.tensor(torch.finfo(w.dtype).min))
        c = torch.matmul(nn.functional.softmax(w, dim=-1), v.permute(0, 2, 1, 3))
        return x + self.o(c.permute(0, 2, 1, 3).reshape(b, s, D))


class HfPosEmbAttn(nn.Module):
    """Llama's attention as transformers 4.45 on call it: cos and sin ([B, S, d], the rotary
    tables at each token's position) given by the caller (position_embeddings), unsqueezed to
    one head and applied to q and k by rotate_half; an additive causal mask."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
    def forward(self, x, cos, sin):
        return self.attend(x, cos.unsqueeze(1), sin.unsqueeze(1))
    def attend(self, x, cos, sin):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh)
        w = w + torch.triu(torch.full((s, s), torch.finfo(x.dtype).min), 1)
        c = torch.matmul(nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype), v)
        return x + self.o(c.transpose(1, 2).reshape(b, s, D))


class HfRotaryAttn(HfPosEmbAttn):
    """Llama's attention with transformers 4.38-4.44's LlamaRotaryEmbedding.forward: cos and sin
    computed in the forward pass from inv_freq @ position_ids (a batched MatMul of constants
    once the length is known), rotate_half; an additive causal mask; softmax in f32."""
    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))
    def forward(self, x):
        s = x.shape[1]
        position_ids = torch.arange(s).unsqueeze(0)
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        freqs = (inv.float() @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return self.attend(x, emb.cos().to(x.dtype).unsqueeze(1), emb.sin().to(x.dtype).unsqueeze(1))


def rotary_tables(b, s, dh):
    """cos and sin [b, s, dh] as Llama's rotary embedding computes them for positions 0..s-1."""
    inv = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
    emb = torch.cat([torch.outer(torch.arange(s).float(), inv)] * 2, dim=-1)
    return emb.cos()[None].expand(b, s, dh), emb.sin()[None].expand(b, s, dh)


class OrMaskAttn(nn.Module):
    """Eager attention whose padding mask (the int64 attention_mask compared with 0) is Or-ed
    with a constant causal mask and given to masked_fill with finfo.min."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh)
        mask = (m[:, None, None, :] == 0) | torch.ones(s, s, dtype=torch.bool).triu(1)
        w = w.masked_fill(mask, torch.finfo(w.dtype).min)
        c = torch.matmul(nn.functional.softmax(w, dim=-1), v)
        return x + self.o(c.transpose(1, 2).reshape(b, s, D))


class MptAttn(nn.Module):
    """MPT's attention: q, k, v by torch.chunk of one projection clamped to +-8 (clip_qkv),
    ALiBi [1, H, 1, S] added to the scores, the causal mask by masked_fill with finfo.min."""
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.wqkv = nn.Linear(D, 3 * D, bias=False)
        self.out = nn.Linear(D, D, bias=False)
        self.register_buffer("slopes", torch.tensor(
            [1.0 / 2 ** (8 * (i + 1) / HEADS) for i in range(HEADS)]).view(1, HEADS, 1, 1))
    def forward(self, x):
        b, s, _ = x.shape; dh = D // HEADS
        q, k, v = self.wqkv(self.norm(x)).clamp(min=-8.0, max=8.0).chunk(3, dim=2)
        q = q.view(b, s, HEADS, dh).permute(0, 2, 1, 3)
        k = k.view(b, s, HEADS, dh).permute(0, 2, 3, 1)
        v = v.view(b, s, HEADS, dh).permute(0, 2, 1, 3)
        w = q.matmul(k) * (1.0 / math.sqrt(dh))
        w = w + torch.arange(1 - s, 1, dtype=torch.float32).view(1, 1, 1, s) * self.slopes
        w = w.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril().view(1, 1, s, s),
                          torch.finfo(w.dtype).min)
        return x + self.out(torch.softmax(w, dim=-1).matmul(v).permute(0, 2, 1, 3).reshape(b, s, D))


class Gpt2AttnSdpa(nn.Module):
    """GPT-2's attention sub-block with its attention as torch's TorchScript exporter decomposes
    F.scaled_dot_product_attention (torch/onnx/symbolic_opset14.py; torch 1.13 has no SDPA, so
    the decomposition is written out): q and k^T each multiplied by sqrt(scale), their product,
    the bool causal mask added as Where(mask, 0, -inf), softmax, P V. Width 128 in 2 heads of
    64 (a head dimension of the sm_90 flash kernel); the causal mask computed from the sequence
    length (tril of ones), so that any length exports."""

    def __init__(self, d=128, heads=2):
        super().__init__()
        self.d, self.heads = d, heads
        self.ln_1 = nn.LayerNorm(d, eps=1e-5)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x):
        b, s, _ = x.shape
        dh = self.d // self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(self.d, dim=2)
        q, k, v = (t.view(b, s, self.heads, dh).transpose(1, 2) for t in (q, k, v))
        root = math.sqrt(1.0 / math.sqrt(dh))
        w = torch.matmul(q * root, k.transpose(-2, -1) * root)
        causal = torch.tril(torch.ones(s, s, dtype=torch.bool))
        w = w + torch.where(causal, torch.zeros(()), torch.full((), float("-inf")))
        o = torch.matmul(nn.functional.softmax(w, dim=-1), v).transpose(1, 2).reshape(b, s, self.d)
        return x + self.c_proj(o)


def rotate_half(t):
    h = t.shape[-1] // 2
    return torch.cat((-t[..., h:], t[..., :h]), dim=-1)


class LlamaLayer(nn.Module):
    """A Llama decoder layer as Hugging Face's eager LlamaAttention writes it: RMSNorm, q/k/v
    projections, rotate_half RoPE (cos and sin from inv_freq), repeat_kv for GQA, an additive
    causal mask of finfo.min above the diagonal, softmax in f32, o_proj and the residual; then
    the SwiGLU MLP with its RMSNorm and residual."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.norm = RmsNorm()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, KV_HEADS * dh, bias=False)
        self.v = nn.Linear(D, KV_HEADS * dh, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))
        self.mlp = LlamaMlp()

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        n = self.norm(x)
        q = self.q(n).view(b, s, HEADS, dh).transpose(1, 2)
        k = self.k(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        v = self.v(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        t = torch.arange(s, dtype=torch.float32)
        emb = torch.cat((torch.outer(t, self.inv_freq),) * 2, dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = HEADS // KV_HEADS
        k = k[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        v = v[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh)
        # Hugging Face's _make_causal_mask (triu has no ONNX export before opset 14).
        mask = torch.full((s, s), torch.finfo(w.dtype).min)
        cond = torch.arange(s)
        mask = mask.masked_fill(cond < (cond + 1).view(s, 1), 0)
        w = nn.functional.softmax((w + mask[None, None]).float(), dim=-1).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(b, s, D)
        return self.mlp(x + self.o(o))


class NeoxAttn(nn.Module):
    """GPT-NeoX's attention (Pythia) as Hugging Face's eager GPTNeoXAttention writes it: one
    query_key_value Linear viewed as [B, S, H, 3 d] and sliced into q, k and v per head, rotary
    embeddings on the first quarter of each head only (rotary_pct 0.25: rotate_half on a slice,
    concatenated with the rest), a bool causal buffer and torch.where with finfo.min, the dense
    projection and the residual."""

    def __init__(self, pct=0.25):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        self.rd = int(D // HEADS * pct)
        self.register_buffer("inv_freq",
                             1.0 / (10000 ** (torch.arange(0, self.rd, 2).float() / self.rd)))
        self.register_buffer("bias", torch.tril(torch.ones(128, 128, dtype=torch.bool))[None, None])

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        qkv = self.qkv(x).view(b, s, HEADS, 3 * dh)
        q = qkv[..., :dh].permute(0, 2, 1, 3)
        k = qkv[..., dh:2 * dh].permute(0, 2, 1, 3)
        v = qkv[..., 2 * dh:].permute(0, 2, 1, 3)
        f = torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        qr, kr = q[..., :self.rd], k[..., :self.rd]
        q = torch.cat((qr * cos + rotate_half(qr) * sin, q[..., self.rd:]), dim=-1)
        k = torch.cat((kr * cos + rotate_half(kr) * sin, k[..., self.rd:]), dim=-1)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = torch.where(self.bias[:, :, :s, :s], w, torch.tensor(torch.finfo(w.dtype).min))
        o = torch.matmul(nn.functional.softmax(w, dim=-1), v).permute(0, 2, 1, 3).reshape(b, s, D)
        return x + self.dense(o)


class BertLayer(nn.Module):
    """BERT: post-LN, q/k/v with bias, extended mask (1-m)*-10000 from an attention_mask input."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.o = nn.Linear(D, D); self.ln1 = nn.LayerNorm(D, eps=1e-12)
        self.i = nn.Linear(D, 4 * D); self.out = nn.Linear(4 * D, D); self.ln2 = nn.LayerNorm(D, eps=1e-12)
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).permute(0, 2, 1, 3)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        ext = (1.0 - m[:, None, None, :].to(x.dtype)) * -10000.0
        p = nn.functional.softmax(w + ext, dim=-1)
        c = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(b, s, D)
        a = self.ln1(self.o(c) + x)
        return self.ln2(self.out(nn.functional.gelu(self.i(a))) + a)


class HfBertLayer(BertLayer):
    """BERT as Hugging Face writes it now: the attention_mask an int64 input, cast to the float
    type and scaled by finfo.min ((1 - m) * finfo.min)."""
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).permute(0, 2, 1, 3)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        ext = (1.0 - m[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        p = nn.functional.softmax(w + ext, dim=-1)
        c = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous().view(b, s, D)
        a = self.ln1(self.o(c) + x)
        return self.ln2(self.out(nn.functional.gelu(self.i(a))) + a)


class DistilAttn(nn.Module):
    """DistilBERT's attention: the int64 attention_mask compared with 0, viewed and expanded to
    the scores, which masked_fill sets to finfo.min there; then out_lin and the residual."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.o = nn.Linear(D, D)
    def forward(self, x, m):
        b, s, _ = x.shape; dh = D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(x)) / math.sqrt(dh), sh(self.k(x)), sh(self.v(x))
        scores = torch.matmul(q, k.transpose(2, 3))
        mask = (m == 0).view(b, 1, 1, s).expand_as(scores)
        scores = scores.masked_fill(mask, torch.tensor(torch.finfo(scores.dtype).min))
        c = torch.matmul(nn.functional.softmax(scores, dim=-1), v)
        return x + self.o(c.transpose(1, 2).contiguous().view(b, s, D))


class BloomAttn(nn.Module):
    """BLOOM's attention: one fused projection viewed as [B, S, H, 3, d] (q, k and v of each head
    side by side) and indexed, ALiBi added by baddbmm on [B*H, S, S], a causal mask by
    masked_fill with finfo.min, softmax, bmm; dense and the residual."""
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        self.register_buffer("slopes", torch.tensor([2 ** (-8 * (i + 1) / HEADS)
                                                     for i in range(HEADS)]))
    def forward(self, x):
        b, s, _ = x.shape; dh = D // HEADS
        f = self.qkv(self.ln(x)).view(b, s, HEADS, 3, dh)
        q, k, v = f[..., 0, :], f[..., 1, :], f[..., 2, :]
        q = q.transpose(1, 2).reshape(b * HEADS, s, dh)
        k = k.permute(0, 2, 3, 1).reshape(b * HEADS, dh, s)
        v = v.transpose(1, 2).reshape(b * HEADS, s, dh)
        alibi = self.slopes[:, None] * torch.arange(s, dtype=torch.float32)[None, :]
        alibi = alibi[None].expand(b, HEADS, s).reshape(b * HEADS, 1, s)
        w = alibi.baddbmm(batch1=q, batch2=k, beta=1.0, alpha=1.0 / math.sqrt(dh))
        w = w.view(b, HEADS, s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1),
                                               torch.finfo(w.dtype).min)
        p = nn.functional.softmax(w, dim=-1).view(b * HEADS, s, s)
        c = torch.bmm(p, v).view(b, HEADS, s, dh).permute(0, 2, 1, 3).reshape(b, s, D)
        return x + self.dense(c)


class OptLayer(nn.Module):
    """OPT: pre-LN, q scaled before the matmul, causal mask of finfo.min, ReLU MLP."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def forward(self, x):
        b, s, _ = x.shape; dh = D // HEADS
        n = self.ln1(x)
        q = self.q(n) * dh ** -0.5
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2).contiguous().view(b * HEADS, s, dh)
        q, k, v = sh(q), sh(self.k(n)), sh(self.v(n))
        w = torch.bmm(q, k.transpose(1, 2))
        mask = torch.full((s, s), torch.finfo(x.dtype).min)
        c = torch.arange(s)
        mask = mask.masked_fill(c < (c + 1).view(s, 1), 0)
        w = w.view(b, HEADS, s, s) + mask[None, None]
        w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
        p = nn.functional.softmax(w.view(b * HEADS, s, s), dim=-1)
        o = torch.bmm(p, v).view(b, HEADS, s, dh).transpose(1, 2).reshape(b, s, D)
        h = x + self.o(o)
        return h + self.fc2(torch.relu(self.fc1(self.ln2(h))))


class T5Attn(nn.Module):
    """T5 self-attention (encoder): no scaling, learned relative position bias from buckets."""
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=False) for _ in range(4))
        self.rel = nn.Embedding(32, HEADS)
        self.norm = RmsNorm()
    def bucket(self, rel, nb=32, maxd=128):
        nb //= 2
        ret = (rel > 0).to(torch.long) * nb
        rel = torch.abs(rel)
        me = nb // 2
        small = rel < me
        large = me + (torch.log(rel.float() / me) / math.log(maxd / me) * (nb - me)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return ret + torch.where(small, rel, large)
    def forward(self, x):
        b, s, _ = x.shape; dh = D // HEADS
        n = self.norm(x)
        sh = lambda t: t.view(b, s, HEADS, dh).transpose(1, 2)
        q, k, v = sh(self.q(n)), sh(self.k(n)), sh(self.v(n))
        w = torch.matmul(q, k.transpose(3, 2))
        ctx = torch.arange(s)[:, None]; mem = torch.arange(s)[None, :]
        pb = self.rel(self.bucket(mem - ctx)).permute(2, 0, 1)[None]
        p = nn.functional.softmax((w + pb).float(), dim=-1).type_as(w)
        o = torch.matmul(p, v).transpose(1, 2).reshape(b, s, D)
        return x + self.o(o)


class FalconLayer(nn.Module):
    """Falcon-7B: attention and MLP in parallel on one LayerNorm, multi-query attention from one
    fused projection viewed as [B, S, H + 2, d] (q the first H heads by a slice, k and v one
    head each by a gather, broadcast against the query heads by matmul), rotate_half RoPE, a
    causal mask of -inf."""
    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, D + 2 * dh, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.up, self.down = nn.Linear(D, 4 * D, bias=False), nn.Linear(4 * D, D, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        n = self.ln(x)
        f = self.qkv(n).view(b, s, HEADS + 2, dh)
        q = f[:, :, :-2].transpose(1, 2)
        k, v = f[:, :, [-2]].transpose(1, 2), f[:, :, [-1]].transpose(1, 2)
        emb = torch.cat((torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq),) * 2, -1)
        q = q * emb.cos() + rotate_half(q) * emb.sin()
        k = k * emb.cos() + rotate_half(k) * emb.sin()
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = w.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        a = torch.matmul(nn.functional.softmax(w, -1), v).transpose(1, 2).reshape(b, s, D)
        return x + self.o(a) + self.down(nn.functional.gelu(self.up(n)))


class MqaAttn(nn.Module):
    """Multi-query attention written with an explicit expand (GPT-BigCode's and some Gemma
    ports' form): k and v of one head expanded to the query heads, q scaled after Q K^T."""
    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.q, self.o = nn.Linear(D, D, bias=False), nn.Linear(D, D)
        self.k, self.v = nn.Linear(D, dh, bias=False), nn.Linear(D, dh, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        q = self.q(x).view(b, s, HEADS, dh).transpose(1, 2)
        k = self.k(x).view(b, s, 1, dh).transpose(1, 2).expand(b, HEADS, s, dh)
        v = self.v(x).view(b, s, 1, dh).transpose(1, 2).expand(b, HEADS, s, dh)
        w = nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)) * dh ** -0.5, -1)
        return x + self.o(torch.matmul(w, v).transpose(1, 2).reshape(b, s, D))


class SplitHeadsAttn(nn.Module):
    """q, k and v split along the head axis of one projection viewed as [B, S, H + 2 Hkv, d]
    (GQA 2), k's two heads split apart and joined again along the head axis, repeat_kv."""
    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.qkv, self.o = nn.Linear(D, D + 2 * KV_HEADS * dh), nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        dh, rep = D // HEADS, HEADS // KV_HEADS
        f = self.qkv(x).view(b, s, HEADS + 2 * KV_HEADS, dh)
        q, k, v = (t.transpose(1, 2) for t in f.split([HEADS, KV_HEADS, KV_HEADS], dim=2))
        k = torch.cat(k.split(1, dim=1), dim=1)
        k = k[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        v = v[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        w = nn.functional.softmax(torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh), -1)
        return x + self.o(torch.matmul(w, v).transpose(1, 2).reshape(b, s, D))


def causal_bias(s, dtype):
    """Hugging Face's _make_causal_mask: finfo.min above the diagonal, 0 elsewhere."""
    mask = torch.full((s, s), torch.finfo(dtype).min)
    cond = torch.arange(s)
    return mask.masked_fill(cond < (cond + 1).view(s, 1), 0)


def partial_rotary(q, k, s, rot):
    """RoPE on the first `rot` dims of each head, the rest passed through and joined again, as
    Phi, StableLM and Persimmon write it (rot may be the whole head: the rest is then empty)."""
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    emb = torch.cat((torch.outer(torch.arange(s, dtype=torch.float32), inv),) * 2, dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]

    def apply(t):
        tr, tp = t[..., :rot], t[..., rot:]
        return torch.cat((tr * cos + rotate_half(tr) * sin, tp), dim=-1)
    return apply(q), apply(k)


class Qwen2Attn(nn.Module):
    """Qwen2's attention: RMSNorm, q, k and v with biases, GQA by repeat_kv, softmax in f32;
    its rotary written the partial way over the whole head (x[..., rot:] is empty)."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.norm = RmsNorm()
        self.q, self.o = nn.Linear(D, D), nn.Linear(D, D, bias=False)
        self.k, self.v = nn.Linear(D, KV_HEADS * dh), nn.Linear(D, KV_HEADS * dh)

    def forward(self, x):
        b, s, _ = x.shape
        dh, rep = D // HEADS, HEADS // KV_HEADS
        n = self.norm(x)
        q = self.q(n).view(b, s, HEADS, dh).transpose(1, 2)
        k = self.k(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        v = self.v(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        q, k = partial_rotary(q, k, s, dh)
        k = k[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        v = v[:, :, None].expand(b, KV_HEADS, rep, s, dh).reshape(b, HEADS, s, dh)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh) + causal_bias(s, q.dtype)[None, None]
        w = nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        return x + self.o(torch.matmul(w, v).transpose(1, 2).reshape(b, s, D))


class Phi2Block(nn.Module):
    """Phi-2's decoder block: one LayerNorm feeding attention (rotary on half of each head,
    biases) and a gelu_new MLP in parallel, both added to the residual."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.q, self.k, self.v, self.dense = (nn.Linear(D, D) for _ in range(4))
        self.fc1, self.fc2, self.act = nn.Linear(D, HIDDEN), nn.Linear(HIDDEN, D), NewGelu()

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        h = self.ln(x)
        q, k, v = (f(h).view(b, s, HEADS, dh).transpose(1, 2) for f in (self.q, self.k, self.v))
        q, k = partial_rotary(q, k, s, dh // 2)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh) + causal_bias(s, q.dtype)[None, None]
        w = nn.functional.softmax(w.float(), dim=-1).to(v.dtype)
        a = self.dense(torch.matmul(w, v).transpose(1, 2).reshape(b, s, D))
        return a + self.fc2(self.act(self.fc1(h))) + x


class GemmaMlp(nn.Module):
    """Gemma's MLP: RMSNorm scaling by (1 + weight) in f32, GeGLU with the tanh GeLU."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(D))
        self.gate, self.up = nn.Linear(D, HIDDEN, bias=False), nn.Linear(D, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x):
        xf = x.float()
        n = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * (1.0 + self.weight.float())
        n = n.type_as(x)
        return x + self.down(nn.functional.gelu(self.gate(n), approximate="tanh") * self.up(n))


class BigCodeAttn(nn.Module):
    """GPTBigCode's (StarCoder's) multi-query attention as its eager code writes it: one c_attn
    projection split into q and one key and value head, the query's heads made rows of their
    own ([B, S*H, d]) for baddbmm against K^T (beta 0: torch.empty's values times 0), viewed
    [B, S, H, S] for a bool causal mask by torch.where, softmax, then bmm with V."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.ln = nn.LayerNorm(D)
        self.c_attn, self.c_proj = nn.Linear(D, D + 2 * dh), nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        dh = D // HEADS
        q, kv = self.c_attn(self.ln(x)).split((D, 2 * dh), dim=2)
        k, v = kv.split((dh, dh), dim=-1)
        scores = torch.empty(b, s * HEADS, s)
        w = torch.baddbmm(scores, q.reshape(b, s * HEADS, dh), k.transpose(1, 2), beta=0,
                          alpha=1.0 / math.sqrt(dh)).view(b, s, HEADS, s)
        causal = torch.tril(torch.ones(s, s, dtype=torch.bool))[None, :, None, :]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min))
        w = nn.functional.softmax(w, dim=-1).view(b, s * HEADS, s)
        return x + self.c_proj(torch.bmm(w, v).view(b, s, D))


class BigCodePadAttn(BigCodeAttn):
    """GPTBigCode's attention given a float padding mask (1 keep, 0 pad) as the original BERT
    takes one: (1 - m) -10000 added to the query-major scores as [B, 1, 1, S]."""

    def forward(self, x, m):
        b, s, _ = x.shape
        dh = D // HEADS
        q, kv = self.c_attn(self.ln(x)).split((D, 2 * dh), dim=2)
        k, v = kv.split((dh, dh), dim=-1)
        w = torch.bmm(q.reshape(b, s * HEADS, dh), k.transpose(1, 2)).view(b, s, HEADS, s)
        w = w / math.sqrt(dh) + (1.0 - m)[:, None, None, :] * -10000.0
        w = nn.functional.softmax(w, dim=-1).view(b, s * HEADS, s)
        return x + self.c_proj(torch.bmm(w, v).view(b, s, D))


class HfBigCodeAttn(BigCodeAttn):
    """GPTBigCode's multi-query attention given its attention_mask (int64, 1 keep) as Hugging
    Face's model builds the mask: its causal buffer [1, S, S] times the mask viewed [B, 1, S],
    unsqueezed between the query and key axes ([B, S, 1, S]) for the query-major scores."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(512, 512, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x, m):
        b, s, _ = x.shape
        dh = D // HEADS
        mask = (self.bias[None, :s, :s] * m.view(b, 1, -1).to(torch.bool)).unsqueeze(2)
        q, kv = self.c_attn(self.ln(x)).split((D, 2 * dh), dim=2)
        k, v = kv.split((dh, dh), dim=-1)
        scores = torch.empty(b, s * HEADS, s)
        w = torch.baddbmm(scores, q.reshape(b, s * HEADS, dh), k.transpose(1, 2), beta=0,
                          alpha=1.0 / math.sqrt(dh)).view(b, s, HEADS, s)
        w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min))
        w = nn.functional.softmax(w, dim=-1).view(b, s * HEADS, s)
        return x + self.c_proj(torch.bmm(w, v).view(b, s, D))


class HfBigCodeMhaAttn(HfBigCodeAttn):
    """The same model with multi_query=False: q, k and v split from each head of one projection
    viewed [B, H, S, 3d] (Split on the heads' last axis), the mask unsqueezed at 1."""

    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)

    def forward(self, x, m):
        b, s, _ = x.shape
        dh = D // HEADS
        mask = (self.bias[None, :s, :s] * m.view(b, 1, -1).to(torch.bool)).unsqueeze(1)
        qkv = self.c_attn(self.ln(x)).view(b, s, HEADS, 3 * dh).transpose(1, 2)
        q, kv = qkv.split((dh, 2 * dh), dim=3)
        k, v = kv.split((dh, dh), dim=-1)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = torch.where(mask, w, torch.full([], torch.finfo(w.dtype).min))
        w = nn.functional.softmax(w, dim=-1)
        return x + self.c_proj(torch.matmul(w, v).transpose(1, 2).reshape(b, s, D))


class TorchMha(nn.Module):
    """torch.nn.MultiheadAttention (batch_first: it transposes to [S, B, E] inside, in_proj as
    one weight, heads as [B*H, S, d] for bmm) given a causal float attn_mask of -inf."""

    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(D, HEADS, batch_first=True)

    def forward(self, x):
        s = x.shape[1]
        mask = torch.triu(torch.full((s, s), float("-inf")), 1)
        return self.m(x, x, x, attn_mask=mask, need_weights=False)[0]


class TorchEncoderLayer(nn.Module):
    """torch.nn.TransformerEncoderLayer, batch_first: post-norm with ReLU, or pre-norm with GeLU."""

    def __init__(self, norm_first):
        super().__init__()
        self.m = nn.TransformerEncoderLayer(D, HEADS, HIDDEN, dropout=0.0, batch_first=True,
                                            norm_first=norm_first,
                                            activation="gelu" if norm_first else "relu")

    def forward(self, x):
        return self.m(x)


class TorchDecoderLayer(nn.Module):
    """torch.nn.TransformerDecoderLayer, batch_first, pre-norm: causal self-attention, then
    cross-attention to a memory of another length (input mem, [B, M, E])."""

    def __init__(self):
        super().__init__()
        self.m = nn.TransformerDecoderLayer(D, HEADS, HIDDEN, dropout=0.0, batch_first=True,
                                            norm_first=True)

    def forward(self, x, mem):
        s = x.shape[1]
        return self.m(x, mem, tgt_mask=torch.triu(torch.full((s, s), float("-inf")), 1))


class TorchSeqFirst(nn.Module):
    """torch.nn's MultiheadAttention, TransformerEncoderLayer (post-norm, ReLU),
    TransformerDecoderLayer (pre-norm; causal self-attention, cross-attention to mem) or a
    Transformer of one encoder and one decoder layer (mem its source, x its causal target) as
    they are by default, batch_first=False: x [S, B, E] (mem [M, B, E]), y sequence-first."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "mha":
            self.m = nn.MultiheadAttention(D, HEADS)
        elif kind == "encoder":
            self.m = nn.TransformerEncoderLayer(D, HEADS, HIDDEN, dropout=0.0)
        elif kind == "transformer":
            self.m = nn.Transformer(D, HEADS, 1, 1, HIDDEN, dropout=0.0)
        elif kind == "residual":
            self.m = nn.TransformerEncoderLayer(D, HEADS, HIDDEN, dropout=0.0)
        else:
            self.m = nn.TransformerDecoderLayer(D, HEADS, HIDDEN, dropout=0.0, norm_first=True)

    def forward(self, x, mem=None):
        s = x.shape[0]
        if self.kind == "mha":
            return self.m(x, x, x, need_weights=False)[0]
        if self.kind == "encoder":
            return self.m(x)
        if self.kind == "residual":  # mem: an input that meets x's rows only after attention
            return self.m(x) + mem
        mask = torch.triu(torch.full((s, s), float("-inf")), 1)
        if self.kind == "transformer":  # mem is the encoder's source
            return self.m(mem, x, tgt_mask=mask)
        return self.m(x, mem, tgt_mask=mask)


class TorchEncoderPadded(TorchEncoderLayer):
    """torch.nn.TransformerEncoderLayer (post-norm) given src_key_padding_mask, bool [B, S]
    (True: padding), which MultiheadAttention expands to the heads in torch.bmm's form."""

    def __init__(self):
        super().__init__(False)

    def forward(self, x, pad):
        return self.m(x, src_key_padding_mask=pad)


def export_opsets(m, out, name):
    """Writes NAME_opset13.onnx and NAME_opset17.onnx of `m` (one input drawn for both)."""
    x = torch.randn(BATCH, SEQ, D)
    for opset in (13, 17):
        path = os.path.join(out, f"{name}_opset{opset}.onnx")
        torch.onnx.export(m, (x,), path, opset_version=opset, input_names=["x"],
                          output_names=["y"], do_constant_folding=True)
        print(path)


def export_dynamic(m, args, names, dyn, out, name):
    """Writes OUT/NAME.onnx of `m` at opset 17 with these dynamic axes; returns the directory
    for torch's own output on other inputs, OUT/../expect/NAME_s7, made."""
    path = os.path.join(out, f"{name}.onnx")
    torch.onnx.export(m, args, path, opset_version=17, input_names=names, output_names=["y"],
                      do_constant_folding=True, dynamic_axes=dyn)
    print(path)
    expect = os.path.join(out, "..", "expect", f"{name}_s7")
    os.makedirs(expect, exist_ok=True)
    return expect

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
        export_opsets(m, out, name)
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
    # The attention sub-blocks (issue 41), last, so that the files above come out as before.
    for name, m in {"gpt2_attn": Gpt2Attn(), "llama_layer": LlamaLayer()}.items():
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5)
        m.eval()
        export_opsets(m, out, name)
    # Any sequence length (issue 41): the GPT-2 and Llama attention blocks and GPT-2 with
    # SDPA's decomposition, batch and seq symbolic (fpatc --dim batch=B --dim seq=S); made
    # last, so that the files above come out as before. The eager GPT-2's causal buffer
    # ([1, 1, 128, 128]) bounds its length to 128.
    for name, m in {"gpt2_attn_dyn_opset17": Gpt2Attn(), "llama_layer_dyn_opset17": LlamaLayer(),
                    "gpt2_sdpa_dyn_opset17": Gpt2AttnSdpa()}.items():
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5)
        m.eval()
        x = torch.randn(BATCH, SEQ, m.d if hasattr(m, "d") else D)
        path = os.path.join(out, f"{name}.onnx")
        torch.onnx.export(m, (x,), path, opset_version=17, input_names=["x"],
                          output_names=["y"], do_constant_folding=True,
                          dynamic_axes={"x": axes, "y": axes})
        print(path)
    # GPT-NeoX's attention (partial rotary, q, k and v sliced from one projection per head),
    # batch and seq symbolic; made last, so that the files above come out as before. Its
    # causal buffer ([1, 1, 128, 128]) bounds its length to 128.
    m = NeoxAttn()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.copy_(torch.rand_like(p) + 0.5)
    m.eval()
    x = torch.randn(BATCH, SEQ, D)
    path = os.path.join(out, "neox_attn_dyn_opset17.onnx")
    torch.onnx.export(m, (x,), path, opset_version=17, input_names=["x"], output_names=["y"],
                      do_constant_folding=True, dynamic_axes={"x": axes, "y": axes})
    print(path)

    # BERT (a padding mask given at run time), OPT (torch.bmm on [B*H, S, d], q scaled first,
    # scores clamped at finfo.min) and T5 (relative-position buckets, no scaling), batch and
    # seq symbolic; with torch's own output at seq 7 on f16-rounded inputs, which
    # fpatc --expect checks the import against. Made last, so the files above come out as before.
    torch.manual_seed(7)
    last = {"bert_layer_dyn_opset17": BertLayer(), "opt_layer_dyn_opset17": OptLayer(),
            "t5_attn_dyn_opset17": T5Attn()}
    # Falcon's multi-query attention (heads sliced and gathered from one projection) and an
    # explicit expand of one KV head, the same way; their own seed, so the files above come out
    # as before.
    # Then BERT as Hugging Face writes it, its attention_mask int64, and DistilBERT's attention
    # (the int64 mask compared with 0 and given to masked_fill), BLOOM's attention, GPT-2's
    # given a bool padding mask, Hugging Face's Llama masks before 4.38, and MPT's attention.
    last_seed = {"falcon_layer_dyn_opset17": 11, "mqa_attn_dyn_opset17": 13,
                 "split_heads_dyn_opset17": 17, "hf_bert_dyn_opset17": 19,
                 "distil_attn_dyn_opset17": 23, "bloom_attn_dyn_opset17": 29,
                 "gpt2_boolmask_dyn_opset17": 37, "hf_mask_attn_dyn_opset17": 41,
                 "mpt_attn_dyn_opset17": 47, "hf_causal_sum_dyn_opset17": 53,
                 "hf_causal_and_dyn_opset17": 59, "gptj_attn_dyn_opset17": 61,
                 "hf_sliding_dyn_opset17": 67, "hf_to4d_dyn_opset17": 71,
                 "hf_rotary_dyn_opset17": 73, "hf_posemb_dyn_opset17": 79,
                 "or_mask_dyn_opset17": 83, "qwen2_attn_dyn_opset17": 89,
                 "phi2_block_dyn_opset17": 97, "gemma_mlp_dyn_opset17": 101,
                 "bigcode_attn_dyn_opset17": 103, "bigcode_pad_dyn_opset17": 107,
                 "hf_bigcode_dyn_opset17": 109, "hf_bigcode_mha_dyn_opset17": 113}
    made = {"falcon_layer_dyn_opset17": FalconLayer, "mqa_attn_dyn_opset17": MqaAttn,
            "split_heads_dyn_opset17": SplitHeadsAttn, "hf_bert_dyn_opset17": HfBertLayer,
            "distil_attn_dyn_opset17": DistilAttn, "bloom_attn_dyn_opset17": BloomAttn,
            "gpt2_boolmask_dyn_opset17": Gpt2AttnBoolMask, "hf_mask_attn_dyn_opset17": HfMaskAttn,
            "mpt_attn_dyn_opset17": MptAttn,
            "hf_causal_sum_dyn_opset17": lambda: HfCausalMaskAttn("sum"),
            "hf_causal_and_dyn_opset17": lambda: HfCausalMaskAttn("and"),
            "gptj_attn_dyn_opset17": GptJAttn,
            "hf_sliding_dyn_opset17": lambda: HfCausalMaskAttn("sliding"),
            "hf_to4d_dyn_opset17": lambda: HfCausalMaskAttn("to4d"),
            "hf_rotary_dyn_opset17": HfRotaryAttn, "hf_posemb_dyn_opset17": HfPosEmbAttn,
            "or_mask_dyn_opset17": OrMaskAttn, "qwen2_attn_dyn_opset17": Qwen2Attn,
            "phi2_block_dyn_opset17": Phi2Block, "gemma_mlp_dyn_opset17": GemmaMlp,
            "bigcode_attn_dyn_opset17": BigCodeAttn, "bigcode_pad_dyn_opset17": BigCodePadAttn,
            "hf_bigcode_dyn_opset17": HfBigCodeAttn,
            "hf_bigcode_mha_dyn_opset17": HfBigCodeMhaAttn}
    for name, m in list(last.items()) + [(n, None) for n in last_seed]:
        if m is None:
            torch.manual_seed(last_seed[name])
            m = made[name]()
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5)
        m.eval()
        x = torch.randn(BATCH, SEQ, D)
        args, names = (x,), ["x"]
        i64 = isinstance(m, (HfBertLayer, DistilAttn, HfMaskAttn, HfCausalMaskAttn, OrMaskAttn,
                             HfBigCodeAttn))
        masked = isinstance(m, (BertLayer, DistilAttn, Gpt2AttnBoolMask, HfMaskAttn,
                                HfCausalMaskAttn, OrMaskAttn, BigCodePadAttn, HfBigCodeAttn))
        kind = torch.bool if isinstance(m, Gpt2AttnBoolMask) else torch.int64 if i64 else torch.float32
        if masked:
            mask = torch.ones(BATCH, SEQ, dtype=kind)
            mask[1, SEQ - 9:] = 0
            args, names = (x, mask), ["x", "m"]
        rotary = type(m) is HfPosEmbAttn
        if rotary:
            args, names = (x,) + rotary_tables(BATCH, SEQ, D // HEADS), ["x", "cos", "sin"]
        expect = export_dynamic(m, args, names, {n: axes for n in names + ["y"]}, out, name)
        ins = [torch.randn(BATCH, 7, D).half()]
        if masked:
            pad = torch.ones(BATCH, 7)
            pad[1, 4:] = 0
            ins.append(pad.to(kind) if kind != torch.float32 else pad.half())
        if rotary:
            ins += [t.half().contiguous() for t in rotary_tables(BATCH, 7, D // HEADS)]
        ext = {torch.int64: "i64", torch.bool: "bool", torch.float16: "f16"}
        for n, t in zip(names, ins):
            t.numpy().tofile(os.path.join(expect, f"{n}.{ext[t.dtype]}"))
        with torch.no_grad():
            m(*[t.float() if t.dtype == torch.float16 else t for t in ins]).numpy().astype(
                "float32").tofile(os.path.join(expect, "y.f32"))

    # torch.nn's own attention modules (batch_first), their own seeds, with torch's output at
    # length 7 (memory length 5); made last, so the files above come out as before.
    for name, seed, make in [("torch_mha_dyn_opset17", 109, TorchMha),
                             ("torch_encoder_dyn_opset17", 113, lambda: TorchEncoderLayer(False)),
                             ("torch_encoder_pre_dyn_opset17", 127, lambda: TorchEncoderLayer(True)),
                             ("torch_decoder_dyn_opset17", 131, TorchDecoderLayer),
                             ("torch_encoder_pad_dyn_opset17", 137, TorchEncoderPadded)]:
        torch.manual_seed(seed)
        m = make().eval()
        decoder, padded = isinstance(m, TorchDecoderLayer), isinstance(m, TorchEncoderPadded)
        args, names = (torch.randn(BATCH, SEQ, D),), ["x"]
        dyn = {"x": axes, "y": axes}
        if decoder:
            args += (torch.randn(BATCH, 30, D),)
            names.append("mem")
            dyn["mem"] = {0: "batch", 1: "mseq"}
        if padded:
            args += (torch.zeros(BATCH, SEQ, dtype=torch.bool),)
            names.append("pad")
            dyn["pad"] = axes
        expect = export_dynamic(m, args, names, dyn, out, name)
        ins = [torch.randn(BATCH, 7, D).half()] + ([torch.randn(BATCH, 5, D).half()] if decoder else [])
        if padded:
            pad = torch.zeros(BATCH, 7, dtype=torch.bool)
            pad[1, 4:] = True
            ins.append(pad)
        for n, t in zip(names, ins):
            t.numpy().tofile(os.path.join(expect, f"{n}.{'bool' if t.dtype == torch.bool else 'f16'}"))
        # Gradients on: torch 1.13's fast path of the eval-mode layers is not what was exported.
        x0 = ins[0].float().requires_grad_()
        m(x0, *[t.float() if t.dtype == torch.float16 else t for t in ins[1:]]).detach().numpy(
        ).astype("float32").tofile(os.path.join(expect, "y.f32"))


class FairseqAttention(nn.Module):
    """fairseq's layout: x [T, B, C] transposed to batch-first on entry (a pre-norm attention
    block with a fused projection split in three), transposed back on exit."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D)

    def forward(self, x):
        x = x.transpose(0, 1)
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).split(D, dim=-1)

        def heads(z):
            return z.view(b, t, HEADS, D // HEADS).transpose(1, 2)

        w = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(D // HEADS), -1)
        y = (w @ heads(v)).transpose(1, 2).reshape(b, t, D)
        return (x + self.o(y)).transpose(0, 1)


def export_seq_first(out):
    """torch.nn's attention modules sequence-first (their default), with torch's output at
    length 7 (memory length 5) on batch 2."""
    seq_axes = {0: "seq", 1: "batch"}
    for name, seed, kind in [("torch_mha_sf_dyn_opset17", 139, "mha"),
                             ("torch_encoder_sf_dyn_opset17", 149, "encoder"),
                             ("torch_decoder_sf_dyn_opset17", 151, "decoder"),
                             ("torch_transformer_sf_dyn_opset17", 157, "transformer"),
                             ("fairseq_attn_sf_dyn_opset17", 163, "fairseq"),
                             ("torch_encoder_res_sf_dyn_opset17", 167, "residual")]:
        torch.manual_seed(seed)
        m = (FairseqAttention() if kind == "fairseq" else TorchSeqFirst(kind)).eval()
        decoder = kind in ("decoder", "transformer")
        args, names = (torch.randn(SEQ, BATCH, D),), ["x"]
        dyn = {"x": seq_axes, "y": seq_axes}
        if decoder or kind == "residual":
            args += (torch.randn(30 if decoder else SEQ, BATCH, D),)
            names.append("mem")
            dyn["mem"] = {0: "mseq" if decoder else "seq", 1: "batch"}
        expect = export_dynamic(m, args, names, dyn, out, name)
        ins = [torch.randn(7, BATCH, D).half()] + ([torch.randn(5, BATCH, D).half()] if decoder else
                                                   [torch.randn(7, BATCH, D).half()]
                                                   if kind == "residual" else [])
        for n, t in zip(names, ins):
            t.numpy().tofile(os.path.join(expect, f"{n}.f16"))
        # Gradients on: torch 1.13's fast path of the eval-mode layers is not what was exported.
        x0 = ins[0].float().requires_grad_()
        m(x0, *[t.float() for t in ins[1:]]).detach().numpy().astype("float32").tofile(
            os.path.join(expect, "y.f32"))


class LlamaKvAttn(nn.Module):
    """One step of Llama's attention with a key/value cache, as Hugging Face's eager code wrote
    it with tuple caches (past_key_value, before 4.36): past_k and past_v [B, Hkv, P, d] given,
    the new tokens' positions P .. P + S - 1 (rotary from inv_freq), the caches concatenated
    along the sequence and returned (present), _make_causal_mask with zeros over the past."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.norm = RmsNorm()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, KV_HEADS * dh, bias=False)
        self.v = nn.Linear(D, KV_HEADS * dh, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)))

    def forward(self, x, past_k, past_v):
        return self.step(x, past_k, past_v)

    def step(self, x, past_k, past_v, attention_mask=None):
        b, s, _ = x.shape
        p, dh = past_k.shape[2], D // HEADS
        n = self.norm(x)
        q = self.q(n).view(b, s, HEADS, dh).transpose(1, 2)
        k = self.k(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        v = self.v(n).view(b, s, KV_HEADS, dh).transpose(1, 2)
        t = torch.arange(p, p + s, dtype=torch.float32)
        emb = torch.cat((torch.outer(t, self.inv_freq),) * 2, dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q = q * cos + rotate_half(q) * sin
        k = torch.cat([past_k, k * cos + rotate_half(k) * sin], dim=2)
        v = torch.cat([past_v, v], dim=2)
        present_k, present_v = k, v
        total, rep = p + s, HEADS // KV_HEADS
        k = k[:, :, None].expand(b, KV_HEADS, rep, total, dh).reshape(b, HEADS, total, dh)
        v = v[:, :, None].expand(b, KV_HEADS, rep, total, dh).reshape(b, HEADS, total, dh)
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh)
        mask = torch.full((s, s), torch.finfo(w.dtype).min)
        cond = torch.arange(s)
        mask = mask.masked_fill(cond < (cond + 1).view(s, 1), 0)
        mask = torch.cat([torch.zeros(s, p), mask], dim=-1)[None, None]
        if attention_mask is not None:  # finfo.min where padded too
            inv = 1.0 - attention_mask[:, None, None, :].expand(b, 1, s, total).to(w.dtype)
            mask = mask.expand(b, 1, s, total).masked_fill(inv.to(torch.bool), torch.finfo(w.dtype).min)
        w = nn.functional.softmax((w + mask).float(), dim=-1).to(q.dtype)
        o = torch.matmul(w, v).transpose(1, 2).reshape(b, s, D)
        return x + self.o(o), present_k, present_v


class Gpt2KvAttn(Gpt2Attn):
    """GPT-2's eager attention with layer_past: the cache's keys and values [B, H, P, d] joined
    before the new ones, the bool causal buffer sliced to rows P .. P + S - 1 and P + S keys."""

    def forward(self, x, past_k, past_v):
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q = self.heads(q)
        k = torch.cat((past_k, self.heads(k)), dim=-2)
        v = torch.cat((past_v, self.heads(v)), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / (v.size(-1) ** 0.5)
        s, total = q.size(-2), k.size(-2)
        causal = self.bias[:, :, total - s:total, :total]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        o = torch.matmul(nn.functional.softmax(w, dim=-1), v).permute(0, 2, 1, 3).contiguous()
        return x + self.c_proj(o.view(o.size()[:-2] + (D,))), k, v


class CrossKvAttn(nn.Module):
    """A decoder's cross-attention with its cache, as Whisper and BART run it after the first
    step: the encoder's keys and values [B, H, M, d] given whole (past_key_value[2:4]), q
    from the new tokens (scaled first), no mask."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D)
        self.o = nn.Linear(D, D)

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        dh = D // HEADS
        q = (self.q(x) * dh ** -0.5).view(b, s, HEADS, dh).transpose(1, 2)
        w = torch.softmax(torch.matmul(q, past_k.transpose(2, 3)), dim=-1)
        o = torch.matmul(w, past_v).transpose(1, 2).reshape(b, s, D)
        return x + self.o(o)


class NeoxKvAttn(NeoxAttn):
    """GPT-NeoX's attention with layer_past: the partial rotary at positions P .. P + S - 1,
    the caches joined before the new heads, the bool causal buffer sliced at the offset."""

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        p, dh = past_k.shape[2], D // HEADS
        qkv = self.qkv(x).view(b, s, HEADS, 3 * dh)
        q = qkv[..., :dh].permute(0, 2, 1, 3)
        k = qkv[..., dh:2 * dh].permute(0, 2, 1, 3)
        v = qkv[..., 2 * dh:].permute(0, 2, 1, 3)
        f = torch.outer(torch.arange(p, p + s, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        qr, kr = q[..., :self.rd], k[..., :self.rd]
        q = torch.cat((qr * cos + rotate_half(qr) * sin, q[..., self.rd:]), dim=-1)
        k = torch.cat((kr * cos + rotate_half(kr) * sin, k[..., self.rd:]), dim=-1)
        k, v = torch.cat((past_k, k), dim=-2), torch.cat((past_v, v), dim=-2)
        t = p + s
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = torch.where(self.bias[:, :, t - s:t, :t], w, torch.tensor(torch.finfo(w.dtype).min))
        o = torch.matmul(nn.functional.softmax(w, dim=-1), v).permute(0, 2, 1, 3).reshape(b, s, D)
        return x + self.dense(o), k, v


class GptJKvAttn(GptJAttn):
    """GPT-J's attention with layer_past: the interleaved partial rotary at positions P ..
    P + S - 1 (the table gathered there), the caches joined before the new heads."""

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        p, dh = past_k.shape[2], D // HEADS
        sh = lambda t: t.view(b, s, HEADS, dh)
        q, k, v = sh(self.q(x)), sh(self.k(x)), sh(self.v(x))
        sincos = self.embed_positions[torch.arange(p, p + s)[None].expand(b, s)]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        q = self.rotary(q, sin, cos).permute(0, 2, 1, 3)
        k = torch.cat((past_k, self.rotary(k, sin, cos).permute(0, 2, 1, 3)), dim=-2)
        v = torch.cat((past_v, v.permute(0, 2, 1, 3)), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
        w = torch.where(torch.ones(s, p + s, dtype=torch.bool).tril(p), w,
                        torch.tensor(torch.finfo(w.dtype).min))
        c = torch.matmul(nn.functional.softmax(w, dim=-1), v)
        return x + self.o(c.permute(0, 2, 1, 3).reshape(b, s, D)), k, v


class LlamaKvPadAttn(LlamaKvAttn):
    """LlamaKvAttn with the padding mask a decode step is exported with (attention_mask
    [B, P + S], int64, 0 where a sequence is padded): made 4-D as transformers' 4.36
    _prepare_4d_causal_attention_mask does, finfo.min where padded or in the future."""

    def forward(self, x, past_k, past_v, attention_mask):
        return self.step(x, past_k, past_v, attention_mask)


class BigCodeKvAttn(BigCodeAttn):
    """GPTBigCode's attention with layer_past: its cache [B, P, 2d] (the one key and value
    head side by side, token-major) joined with the new tokens' along dim -2 and returned whole
    (present), split into K and V; the bool causal mask's rows P .. P + S - 1."""

    def forward(self, x, past):
        b, s, _ = x.shape
        p, dh = past.shape[1], D // HEADS
        q, kv = self.c_attn(self.ln(x)).split((D, 2 * dh), dim=2)
        kv = torch.cat((past, kv), dim=-2)
        k, v = kv.split((dh, dh), dim=-1)
        t = p + s
        scores = torch.empty(b, s * HEADS, t)
        w = torch.baddbmm(scores, q.reshape(b, s * HEADS, dh), k.transpose(1, 2), beta=0,
                          alpha=1.0 / math.sqrt(dh)).view(b, s, HEADS, t)
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool))[p:t][None, :, None, :]
        w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min))
        w = nn.functional.softmax(w, dim=-1).view(b, s * HEADS, t)
        return x + self.c_proj(torch.bmm(w, v).view(b, s, D)), kv


class OptKvAttn(nn.Module):
    """OPT's (and BART's, Whisper's) decoder self-attention with a cache: q scaled first, the
    caches [B, H, P, d] joined along dim 2, then all three reshaped to torch.bmm's [B*H, T, d]
    (proj_shape); the causal mask with zeros over the past, added in [B, H, S, T]."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.ln = nn.LayerNorm(D)

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        p, dh = past_k.shape[2], D // HEADS
        n = self.ln(x)
        sh = lambda t: t.view(b, -1, HEADS, dh).transpose(1, 2).contiguous()
        q = sh(self.q(n) * dh ** -0.5).view(b * HEADS, -1, dh)
        k = torch.cat([past_k, sh(self.k(n))], dim=2)
        v = torch.cat([past_v, sh(self.v(n))], dim=2)
        kk, vv = k.reshape(b * HEADS, -1, dh), v.reshape(b * HEADS, -1, dh)
        total = kk.size(1)
        mask = torch.full((s, s), torch.finfo(x.dtype).min)
        c = torch.arange(s)
        mask = mask.masked_fill(c < (c + 1).view(s, 1), 0)
        mask = torch.cat([torch.zeros(s, p), mask], dim=-1)
        w = torch.bmm(q, kk.transpose(1, 2)).view(b, HEADS, s, total) + mask[None, None]
        w = nn.functional.softmax(w.view(b * HEADS, s, total), dim=-1)
        o = torch.bmm(w, vv).view(b, HEADS, s, dh).transpose(1, 2).reshape(b, s, D)
        return x + self.o(o), k, v


class FalconKvAttn(nn.Module):
    """Falcon-7B's multi-query attention with its cache as Hugging Face wrote it before the
    Cache classes: q, k and v from one projection ([B, S, H + 2, d]), the caches torch.bmm's
    form [B*Hkv, P, d] (Hkv = 1) joined along dim 1, scores masked_fill with -1e9."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.qkv = nn.Linear(D, D + 2 * dh, bias=False)
        self.o = nn.Linear(D, D, bias=False)

    def forward(self, x, past_k, past_v):
        b, s, _ = x.shape
        p, dh = past_k.shape[1], D // HEADS
        f = self.qkv(x).view(b, s, HEADS + 2, dh)
        q = f[:, :, :-2].transpose(1, 2).reshape(b * HEADS, s, dh)
        k = torch.cat((past_k, f[:, :, [-2]].transpose(1, 2).reshape(b, s, dh)), dim=1)
        v = torch.cat((past_v, f[:, :, [-1]].transpose(1, 2).reshape(b, s, dh)), dim=1)
        w = (q.view(b, HEADS, s, dh) @ k.view(b, 1, -1, dh).transpose(-1, -2)) / math.sqrt(dh)
        keep = torch.ones(s, p + s, dtype=torch.bool).tril(diagonal=p)
        w = w.masked_fill(~keep, -1e9).softmax(dim=-1)
        o = (w @ v.view(b, 1, -1, dh)).transpose(1, 2).reshape(b, s, D)
        return x + self.o(o), k, v


def export_kv_cache(out, only=None):
    """Attention steps with key/value caches (past_k, past_v [B, Hkv, P, d], or Falcon's
    [B*Hkv, P, d], in; y, present_k, present_v out; a cross-attention's y alone), batch, seq and
    past symbolic, with torch's outputs at length 7 after 5 cached tokens."""
    for name, seed, make, kv in [("llama_kv_dyn_opset17", 173, LlamaKvAttn, KV_HEADS),
                                 ("gpt2_kv_dyn_opset17", 179, Gpt2KvAttn, HEADS),
                                 ("cross_kv_dyn_opset17", 181, CrossKvAttn, HEADS),
                                 ("neox_kv_dyn_opset17", 191, NeoxKvAttn, HEADS),
                                 ("gptj_kv_dyn_opset17", 193, GptJKvAttn, HEADS),
                                 ("opt_kv_dyn_opset17", 197, OptKvAttn, HEADS),
                                 ("falcon_kv_dyn_opset17", 199, FalconKvAttn, 1),
                                 ("llama_kvpad_dyn_opset17", 211, LlamaKvPadAttn, KV_HEADS),
                                 ("bigcode_kv_dyn_opset17", 223, BigCodeKvAttn, 1)]:
        if only and name not in only:
            continue
        torch.manual_seed(seed)
        m = make().eval()
        with torch.no_grad():
            for p in m.parameters():
                if p.dim() == 1:
                    p.copy_(torch.rand_like(p) + 0.5)
        dh = D // HEADS
        cross = make is CrossKvAttn  # the encoder's cache, read whole: y alone
        flat = make is FalconKvAttn  # [B*Hkv, P, d]
        pad = make is LlamaKvPadAttn  # and attention_mask [B, P + S]
        joint = make is BigCodeKvAttn  # one cache [B, P, 2d]: past in, present out
        names = ["x", "past_k", "past_v"] + (["attention_mask"] if pad else [])
        outs = ["y"] if cross else ["y", "present_k", "present_v"]
        if joint:
            names, outs = ["x", "past"], ["y", "present"]
        cache = {0: "batch", 1: "past"} if flat else {0: "batch", 2: "past"}
        present = {0: "batch", 1: "total"} if flat else {0: "batch", 2: "total"}
        dyn = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}, "past_k": cache,
               "past_v": cache, "present_k": present, "present_v": present,
               "attention_mask": {0: "batch", 1: "total"}, "past": {0: "batch", 1: "past"},
               "present": {0: "batch", 1: "total"}}
        past = (lambda n: (BATCH * kv, n, dh)) if flat else (lambda n: (BATCH, kv, n, dh))
        if joint:
            past = lambda n: (BATCH, n, 2 * dh)
        args = (torch.randn(BATCH, 3, D), torch.randn(*past(9)), torch.randn(*past(9)))
        args = args[:len(names)]
        if pad:
            args += (torch.ones(BATCH, 12, dtype=torch.int64),)
        path = os.path.join(out, f"{name}.onnx")
        torch.onnx.export(m, args, path, opset_version=17, input_names=names, output_names=outs,
                          do_constant_folding=True, dynamic_axes=dyn)
        print(path)
        expect = os.path.join(out, "..", "expect", f"{name}_s7")
        os.makedirs(expect, exist_ok=True)
        ins = [torch.randn(BATCH, 7, D).half(), torch.randn(*past(5)).half(),
               torch.randn(*past(5)).half()][:len(names)]
        if pad:  # the second sequence left-padded by 3
            ins.append(torch.ones(BATCH, 12, dtype=torch.int64))
            ins[-1][1, :3] = 0
        for n, t in zip(names, ins):
            t.numpy().tofile(os.path.join(expect, n + (".i64" if n == "attention_mask" else ".f16")))
        with torch.no_grad():
            got = m(*[t.float() if t.is_floating_point() else t for t in ins])
            for n, t in zip(outs, [got] if cross else got):
                t.numpy().astype("float32").tofile(os.path.join(expect, f"{n}.f32"))


if __name__ == "__main__":
    main()
    export_seq_first(sys.argv[1] if len(sys.argv) > 1 else ".")
    export_kv_cache(sys.argv[1] if len(sys.argv) > 1 else ".")
