#!/usr/bin/env python3
"""Writes the ONNX files of fpat's import tests into OUTDIR (Debian's python3-onnx only):
small well-formed models the exporter tests do not cover, and malformed ones, each of which
fpatc must reject with a clear error (never a crash).

    python3 tests/onnx/make_models.py OUTDIR
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
rng = np.random.default_rng(0)


def weight(name, *shape):
    return numpy_helper.from_array(
        (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), name)


def save(name, nodes, inputs, outputs, inits, opset=13):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, os.path.join(OUT, name + ".onnx"))
    return model


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


os.makedirs(OUT, exist_ok=True)

# nn.Linear on 2-D input: Gemm with transB = 1 (weights [N, K]), then ReLU; a symbolic batch.
save("linear_relu_dynamic",
     [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
      helper.make_node("Relu", ["h"], ["y"], name="act")],
     [f32("x", ["batch", 48])], [f32("y", ["batch", 40])],
     [weight("W", 40, 48), weight("b", 40)])

# Transpose of an activation feeding MatMul's B, and a Reshape that keeps the last dimension.
save("transpose_reshape",
     [helper.make_node("Transpose", ["w"], ["wt"], name="t", perm=[1, 0]),
      helper.make_node("MatMul", ["x", "wt"], ["h"], name="mm"),
      helper.make_node("Constant", [], ["shape"], name="c",
                       value=numpy_helper.from_array(np.array([2, 30, 24], np.int64))),
      helper.make_node("Reshape", ["h", "shape"], ["y"], name="r")],
     [f32("x", [60, 32]), f32("w", [24, 32])], [f32("y", [2, 30, 24])], [])

# Hugging Face's hand-written activations between two batched nn.Linear layers (MatMul + Add),
# each node as torch.onnx.export writes the Python expression in transformers/activations.py.
def c(name, v):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(v, np.float32)))


hf_acts = {
    # 0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0))))
    "gelu_new": [c("k05", 0.5), c("k3", 3.0), c("kc", 0.044715), c("ks", np.sqrt(2 / np.pi)),
                 c("k1", 1.0),
                 helper.make_node("Mul", ["h", "k05"], ["a"], name="act/Mul"),
                 helper.make_node("Pow", ["h", "k3"], ["p"], name="act/Pow"),
                 helper.make_node("Mul", ["p", "kc"], ["q"], name="act/Mul_1"),
                 helper.make_node("Add", ["h", "q"], ["r"], name="act/Add"),
                 helper.make_node("Mul", ["r", "ks"], ["s"], name="act/Mul_2"),
                 helper.make_node("Tanh", ["s"], ["t"], name="act/Tanh"),
                 helper.make_node("Add", ["t", "k1"], ["u"], name="act/Add_1"),
                 helper.make_node("Mul", ["a", "u"], ["g"], name="act/Mul_3")],
    # 0.5 * x * (1.0 + tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
    "gelu_fast": [c("k05", 0.5), c("ks", 0.7978845608), c("kc", 0.044715), c("k1", 1.0),
                  helper.make_node("Mul", ["h", "k05"], ["a"], name="act/Mul"),
                  helper.make_node("Mul", ["h", "ks"], ["b"], name="act/Mul_1"),
                  helper.make_node("Mul", ["h", "kc"], ["cc"], name="act/Mul_2"),
                  helper.make_node("Mul", ["cc", "h"], ["d"], name="act/Mul_3"),
                  helper.make_node("Add", ["d", "k1"], ["e"], name="act/Add"),
                  helper.make_node("Mul", ["b", "e"], ["f"], name="act/Mul_4"),
                  helper.make_node("Tanh", ["f"], ["t"], name="act/Tanh"),
                  helper.make_node("Add", ["t", "k1"], ["u"], name="act/Add_1"),
                  helper.make_node("Mul", ["a", "u"], ["g"], name="act/Mul_5")],
    # x * sigmoid(1.702 * x)
    "quick_gelu": [c("kq", 1.702),
                   helper.make_node("Mul", ["h", "kq"], ["a"], name="act/Mul"),
                   helper.make_node("Sigmoid", ["a"], ["sg"], name="act/Sigmoid"),
                   helper.make_node("Mul", ["h", "sg"], ["g"], name="act/Mul_1")],
}
for act, nodes in hf_acts.items():
    save("hf_" + act,
         [helper.make_node("MatMul", ["x", "W1"], ["m1"], name="fc1/MatMul"),
          helper.make_node("Add", ["b1", "m1"], ["h"], name="fc1/Add")] + nodes +
         [helper.make_node("MatMul", ["g", "W2"], ["m2"], name="fc2/MatMul"),
          helper.make_node("Add", ["b2", "m2"], ["y"], name="fc2/Add")],
         [f32("x", [2, 5, 32])], [f32("y", [2, 5, 32])],
         [weight("W1", 32, 64), weight("b1", 64), weight("W2", 64, 32), weight("b2", 32)])

# Names that are not value names ("input:0", "out/y"): fpat renames the values, and --inputs
# and --outputs files still go by the model's names (a file for --inputs made here).
save("renamed_io",
     [helper.make_node("Relu", ["input:0"], ["out/y"], name="act")],
     [f32("input:0", [4, 8])], [f32("out/y", [4, 8])], [])
os.makedirs(os.path.join(OUT, "renamed_io_inputs"), exist_ok=True)
np.arange(-16, 16, dtype=np.float16).reshape(4, 8).tofile(
    os.path.join(OUT, "renamed_io_inputs", "input:0.f16"))

# Opset 6's legacy broadcasting: Add(broadcast = 1) of a B that matches A's last dimensions is
# NumPy's broadcasting; at another axis it is not, and is refused (it was computed the NumPy
# way: silently wrong). The expected numbers are worked out by hand in tests/CMakeLists.txt.
save("legacy_broadcast_cols",
     [helper.make_node("Add", ["x", "B"], ["y"], name="add", broadcast=1)],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.arange(8, dtype=np.float32) * 100, "B")], opset=6)
os.makedirs(os.path.join(OUT, "legacy_inputs"), exist_ok=True)
np.arange(-16, 16, dtype=np.float16).reshape(4, 8).tofile(
    os.path.join(OUT, "legacy_inputs", "x.f16"))
save("legacy_broadcast_rows",
     [helper.make_node("Add", ["x", "B"], ["y"], name="add", broadcast=1, axis=0)],
     [f32("x", [4, 4])], [f32("y", [4, 4])],
     [numpy_helper.from_array(np.arange(4, dtype=np.float32), "B")], opset=6)

# Weight-only arithmetic folded at import: Gemm's alpha and beta onto W and C, and an unfolded
# export's Mul(W, 0.5) before MatMul. x (legacy_inputs/x.f16) is -16..15; the expected numbers
# are worked out by hand in tests/CMakeLists.txt.
save("gemm_alpha_beta",
     [helper.make_node("Gemm", ["x", "W", "C"], ["y"], name="fc", alpha=0.5, beta=2.0)],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.ones((8, 8), np.float32), "W"),
      numpy_helper.from_array(np.arange(8, dtype=np.float32), "C")])
save("weight_scaled",
     [helper.make_node("Mul", ["W", "half"], ["Wh"], name="scale"),
      helper.make_node("MatMul", ["x", "Wh"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.ones((8, 8), np.float32), "W"),
      numpy_helper.from_array(np.array(0.5, np.float32), "half")])

# Shape arithmetic as exporters write it around view/reshape, folded at import: x's Shape,
# Slice, integer Div (truncated: 8 / 3 = 2) and Mul, Unsqueeze, Concat -> a Reshape target of
# [4, 8]; a weight's Gather and Slice (its last row, an INT64_MAX end) Expanded to [4, 8];
# Range cast to float; ConstantOfShape. x (legacy_inputs/x.f16) is -16..15 and B = 0..47
# ([2, 3, 8]): y = x + (40 + j) + j + 0.5 = x + 40.5 + 2j; the numbers are worked out by hand
# in tests/CMakeLists.txt.
def i64(name, v):
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(np.array(v, np.int64)))


save("shape_arith",
     [helper.make_node("Shape", ["x"], ["s"], name="shape"),
      i64("zero", [0]), i64("minus1", [-1]), i64("one", 1), i64("three", 3), i64("four", 4),
      i64("idx1", 1), i64("end", [np.iinfo(np.int64).max]), i64("axis0", [0]),
      helper.make_node("Slice", ["s", "zero", "minus1"], ["rows"], name="rows"),
      helper.make_node("Gather", ["s", "one"], ["cols"], name="cols"),
      helper.make_node("Div", ["cols", "three"], ["two"], name="div"),
      helper.make_node("Mul", ["two", "four"], ["eight"], name="mul"),
      helper.make_node("Unsqueeze", ["eight", "axis0"], ["eight1"], name="unsq"),
      helper.make_node("Concat", ["rows", "eight1"], ["target"], name="concat", axis=0),
      helper.make_node("Gather", ["B", "idx1"], ["g"], name="gather_w", axis=0),
      helper.make_node("Slice", ["g", "minus1", "end", "axis0"], ["last"], name="last_row"),
      helper.make_node("Expand", ["last", "target"], ["e"], name="expand"),
      helper.make_node("Range", ["zero0", "eight", "one"], ["r"], name="range"),
      helper.make_node("Cast", ["r"], ["rf"], name="cast", to=TensorProto.FLOAT),
      helper.make_node("ConstantOfShape", ["target"], ["halves"], name="fill",
                       value=numpy_helper.from_array(np.array([0.5], np.float32))),
      helper.make_node("Add", ["x", "e"], ["y0"], name="add0"),
      helper.make_node("Add", ["y0", "rf"], ["y1"], name="add1"),
      helper.make_node("Add", ["y1", "halves"], ["y2"], name="add2"),
      helper.make_node("Reshape", ["y2", "target"], ["y"], name="reshape")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.arange(48, dtype=np.float32).reshape(2, 3, 8), "B"),
      numpy_helper.from_array(np.array(0, np.int64), "zero0")])

# A Gather from a value computed at run time (an embedding lookup): refused, located.
save("gather_runtime",
     [helper.make_node("Relu", ["x"], ["h"], name="act"),
      helper.make_node("Gather", ["h", "idx"], ["y"], name="lookup", axis=0)],
     [f32("x", [4, 8])], [f32("y", [2, 8])],
     [numpy_helper.from_array(np.array([0, 2], np.int64), "idx")])

# A weight with a NaN, and one value beyond f16's range (inf once rounded): the import says so.
nan_w = np.ones((8, 8), np.float32)
nan_w[2, 3] = np.nan
nan_w[4, 4] = 1e6
save("nan_weight", [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [numpy_helper.from_array(nan_w, "W")])

# --- malformed and unsupported ------------------------------------------------------------
good = onnx.load(os.path.join(os.path.dirname(__file__), "models", "gpt2_mlp_opset13.onnx"))
data = good.SerializeToString()
with open(os.path.join(OUT, "truncated.onnx"), "wb") as f:
    f.write(data[: len(data) // 3])
with open(os.path.join(OUT, "not_a_model.onnx"), "wb") as f:
    f.write(b"graph g { this is text, not protobuf }\n")

save("int_input",
     [helper.make_node("Relu", ["ids"], ["y"], name="act")],
     [helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 8])], [f32("y", [4, 8])], [])

# An int64 attention mask compared with 2 (a mask holds 0s and 1s), and one used as a choice
# of Where rather than its condition.
i64 = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.INT64, shape)
save("mask_compared_with_2",
     [helper.make_node("Equal", ["m", "two"], ["eq"], name="cmp"),
      helper.make_node("Cast", ["eq"], ["f"], name="cast", to=TensorProto.FLOAT),
      helper.make_node("Add", ["x", "f"], ["y"], name="add")],
     [f32("x", [4, 8]), i64("m", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.array(2, dtype=np.int64), "two")])
save("mask_expanded_reshaped",
     [helper.make_node("Unsqueeze", ["m", "ax"], ["u"], name="unsq"),
      helper.make_node("Expand", ["u", "to"], ["e"], name="exp"),
      helper.make_node("Reshape", ["e", "flat_shape"], ["r"], name="flat"),
      helper.make_node("Cast", ["r"], ["f"], name="cast", to=TensorProto.FLOAT),
      helper.make_node("Add", ["x", "f"], ["y"], name="add")],
     [f32("x", [12, 8]), i64("m", [4, 8])], [f32("y", [12, 8])],
     [numpy_helper.from_array(np.array([1], dtype=np.int64), "ax"),
      numpy_helper.from_array(np.array([4, 3, 8], dtype=np.int64), "to"),
      numpy_helper.from_array(np.array([12, 8], dtype=np.int64), "flat_shape")])
# Clip with its bounds the wrong way round; a slice of an activation's rows (fpat slices columns).
save("clip_reversed",
     [helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="clamp")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "lo"),
      numpy_helper.from_array(np.array(1.0, dtype=np.float32), "hi")])
save("slice_rows",
     [helper.make_node("Relu", ["x"], ["r"], name="act"),
      helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["y"], name="rows")],
     [f32("x", [4, 8])], [f32("y", [2, 8])],
     [numpy_helper.from_array(np.array([0], dtype=np.int64), "starts"),
      numpy_helper.from_array(np.array([2], dtype=np.int64), "ends"),
      numpy_helper.from_array(np.array([0], dtype=np.int64), "axes")])
save("mask_as_a_choice",
     [helper.make_node("Cast", ["m"], ["c"], name="cond", to=TensorProto.BOOL),
      helper.make_node("Where", ["c", "x", "m"], ["y"], name="pick")],
     [f32("x", [4, 8]), i64("m", [4, 8])], [f32("y", [4, 8])], [])
# A value of a mask moved off the elements it reads (a transpose of mask plus constant): the
# mask can no longer be broadcast to it.
save("mask_rearranged",
     [helper.make_node("Cast", ["m"], ["f"], name="cast", to=TensorProto.FLOAT),
      helper.make_node("Add", ["f", "c"], ["s"], name="shift"),
      helper.make_node("Transpose", ["s"], ["t"], name="turn", perm=[1, 0]),
      helper.make_node("Add", ["x", "t"], ["y"], name="use")],
     [f32("x", [8, 4]), i64("m", [4, 8])], [f32("y", [8, 4])],
     [numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(4, 8), "c")])
save("missing_initializer",
     [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [])

save("cycle",
     [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
      helper.make_node("Relu", ["a"], ["b"], name="second")],
     [f32("x", [4, 8])], [f32("a", [4, 8])], [])

save("unsupported_ops",
     [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
      helper.make_node("Hardmax", ["h"], ["s"], name="attn/Hardmax"),
      helper.make_node("Hardmax", ["s"], ["t"], name="attn/Hardmax_1"),
      helper.make_node("TopK", ["t", "k"], ["y", "i"], name="topk")],
     [f32("x", [4, 8])], [f32("y", [4, 2])],
     [weight("W", 8, 8), numpy_helper.from_array(np.array([2], np.int64), "k")])

# An eager attention's pieces with initializers of types fpat does not read (uint8, int8):
# every problem is reported, not only the first initializer's.
save("mask_and_softmax",
     [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
      helper.make_node("Where", ["mask", "h", "neg"], ["m"], name="attn/Where"),
      helper.make_node("Softmax", ["m"], ["y"], name="attn/Softmax")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [weight("W", 8, 8), numpy_helper.from_array(np.tril(np.ones((4, 8), np.uint8)), "mask"),
      numpy_helper.from_array(np.array([-100], np.int8), "neg")])

# A bool mask applied with Where to a value computed at run time: not folded (the masked
# scores are attention's, issue 41), a clear error.
save("where_runtime",
     [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
      helper.make_node("Where", ["mask", "h", "neg"], ["y"], name="attn/Where")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [weight("W", 8, 8), numpy_helper.from_array(np.tril(np.ones((4, 8), bool)), "mask"),
      numpy_helper.from_array(np.array(-100, np.float32), "neg")])

# The same Where as a mask: the other choice is float32's most negative value (Hugging Face's
# finfo.min), so it imports as the addition of a 0 / min bias; a softmax reads it as masked.
save("where_mask",
     [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
      helper.make_node("Where", ["mask", "h", "neg"], ["m"], name="attn/Where"),
      helper.make_node("Softmax", ["m"], ["y"], name="attn/Softmax")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [weight("W", 8, 8), numpy_helper.from_array(np.tril(np.ones((4, 8), bool)), "mask"),
      numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "neg")])

# Softmax over the last axis: opset 13's default axis (-1), and opset 11's (1, the last axis of
# a 2-D input); over another axis it is an error.
save("softmax_rows", [helper.make_node("Softmax", ["x"], ["y"], name="attn/Softmax")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [])
save("softmax_legacy", [helper.make_node("Softmax", ["x"], ["y"], name="attn/Softmax")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [], opset=11)
save("softmax_axis0", [helper.make_node("Softmax", ["x"], ["y"], name="attn/Softmax", axis=0)],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [])
save("softmax_legacy_3d", [helper.make_node("Softmax", ["x"], ["y"], name="attn/Softmax")],
     [f32("x", [2, 4, 8])], [f32("y", [2, 4, 8])], [], opset=11)

# What exporters compute from constants around attention, folded at import: a causal mask
# (Trilu, comparisons, a bool initializer, Where between 0 and -100) and a RoPE-like table
# (Einsum "i,j->ij", Cos, Sin). y = x + mask + e with e[i][j] = i + 1 (tests/CMakeLists.txt
# works out the numbers).
def c(name, array):
    return numpy_helper.from_array(np.array(array), name)


save("const_masks",
     [helper.make_node("Trilu", ["ones"], ["tri"], name="tri", upper=0),
      helper.make_node("Less", ["tri", "half"], ["below"], name="less"),
      helper.make_node("Not", ["below"], ["lower"], name="not"),
      helper.make_node("Greater", ["tri", "half"], ["g"], name="greater"),
      helper.make_node("GreaterOrEqual", ["tri", "one"], ["ge"], name="ge"),
      helper.make_node("Equal", ["g", "ge"], ["same"], name="equal"),
      helper.make_node("Or", ["yes", "yes"], ["yes2"], name="or"),
      helper.make_node("And", ["lower", "same"], ["l2"], name="and1"),
      helper.make_node("And", ["l2", "yes2"], ["keep"], name="and2"),
      helper.make_node("Where", ["keep", "zero", "neg"], ["mask"], name="where"),
      helper.make_node("Einsum", ["pos", "ones8"], ["outer"], name="einsum", equation="i,j->ij"),
      helper.make_node("Cos", ["zeros"], ["cos"], name="cos"),
      helper.make_node("Sin", ["zeros"], ["sin"], name="sin"),
      helper.make_node("Mul", ["outer", "cos"], ["e0"], name="mulcos"),
      helper.make_node("Add", ["e0", "sin"], ["e"], name="addsin"),
      helper.make_node("Add", ["x", "mask"], ["xm"], name="addmask"),
      helper.make_node("Add", ["xm", "e"], ["y"], name="adde")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [c("ones", np.ones((4, 8), np.float32)), c("half", np.float32(0.5)),
      c("one", np.float32(1)), c("yes", np.ones((4, 8), bool)), c("zero", np.float32(0)),
      c("neg", np.float32(-100)), c("pos", np.arange(1, 5, dtype=np.float32)),
      c("ones8", np.ones(8, np.float32)), c("zeros", np.zeros((4, 8), np.float32))], opset=14)

# Tile and Split of constants (BLOOM's ALiBi slopes tiled over the batch; torch 1.13's
# repeat_interleave splits its repeats): tile[i][j] = j; rows of s[i][j] = 100 i split 1 + 3 and
# joined the other way round, rot[i][j] = 100 ((i + 1) % 4). y = x + tile + rot.
save("const_tiles",
     [helper.make_node("Tile", ["row", "reps"], ["tile"], name="tile"),
      helper.make_node("Split", ["s", "parts"], ["s0", "s1"], name="split", axis=0),
      helper.make_node("Concat", ["s1", "s0"], ["rot"], name="concat", axis=0),
      helper.make_node("Add", ["x", "tile"], ["xt"], name="addtile"),
      helper.make_node("Add", ["xt", "rot"], ["y"], name="addrot")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [c("row", np.arange(8, dtype=np.float32)[None]), c("reps", np.array([4, 1], np.int64)),
      c("s", np.repeat(100 * np.arange(4, dtype=np.float32)[:, None], 8, 1)),
      c("parts", np.array([1, 3], np.int64))])

short = numpy_helper.from_array(np.zeros((8, 8), np.float32), "W")
short.raw_data = short.raw_data[:100]
save("short_initializer",
     [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [short])

save("symbolic_dim",
     [helper.make_node("Relu", ["x"], ["y"], name="act")],
     [f32("x", ["seq", 8])], [f32("y", ["seq", 8])], [])

# External data (the weights of models over 2 GB): W = 0.5 and b = 0..7 in one file beside
# the model, b at an offset. x (legacy_inputs/x.f16) is -16..15: y = x W + b has min -50 + 0,
# max 46 + 7, mean -2 + 3.5 (worked out by hand in tests/CMakeLists.txt). Then the ways such
# a file can be wrong: missing, outside the model's folder, too short.
def external(name, array, location, offset=None, length=None):
    t = numpy_helper.from_array(array, name)
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    if offset is not None:
        t.external_data.add(key="offset", value=str(offset))
    if length is not None:
        t.external_data.add(key="length", value=str(length))
    return t


w_half = np.full((8, 8), 0.5, np.float32)
b_range = np.arange(8, dtype=np.float32)
with open(os.path.join(OUT, "external_weights.bin"), "wb") as f:
    f.write(w_half.tobytes() + b"\0" * 64 + b_range.tobytes())
linear = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
          helper.make_node("Add", ["h", "b"], ["y"], name="bias")]
save("external_weights", linear, [f32("x", [4, 8])], [f32("y", [4, 8])],
     [external("W", w_half, "external_weights.bin", 0, 256),
      external("b", b_range, "external_weights.bin", 256 + 64)])
save("external_data",
     [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])],
     [external("W", np.zeros((8, 8), np.float32), "weights.bin")])
save("external_escape", linear, [f32("x", [4, 8])], [f32("y", [4, 8])],
     [external("W", w_half, "../external_weights.bin"), external("b", b_range, "/etc/passwd")])
save("external_short", linear, [f32("x", [4, 8])], [f32("y", [4, 8])],
     [external("W", w_half, "external_weights.bin", 300),
      external("b", b_range, "external_weights.bin", 0, 31)])

save("batched_matmul",
     [helper.make_node("MatMul", ["q", "k"], ["y"], name="scores")],
     [f32("q", [2, 4, 8]), f32("k", [2, 8, 4])], [f32("y", [2, 4, 4])], [])

save("wrong_shape",
     [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
     [f32("x", [4, 8])], [f32("y", [4, 8])], [weight("W", 6, 8)])

save("no_outputs", [helper.make_node("Relu", ["x"], ["y"], name="act")], [f32("x", [4, 8])], [],
     [])

# RoPE on heads, as issue 41's importer takes it and where it stops. x [6, 8] (B 2, S 3) through
# W into heads [2, 3, 2, 4]: rotate_half applied in token order (before the transpose some
# models write), with [1, 3, 1, 4] tables, merged back: imports, raises to rope, and matches
# the f32 model. Then what is refused, with the node: a table computed at run time, a strided
# slice of the heads (the interleaved form's), a slice across heads.
def i64(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


heads_nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
               helper.make_node("Reshape", ["h", "split"], ["t"], name="rope/Reshape")]
heads_inits = [weight("W", 8, 8), i64("split", [2, 3, 2, 4])]
ang = np.arange(3, dtype=np.float32)[:, None] * np.array([1.0, 0.1], np.float32)[None, :]
ang = np.concatenate([ang, ang], axis=1).reshape(1, 3, 1, 4)
save("rope_tokens",
     heads_nodes + [
         helper.make_node("Mul", ["t", "cos"], ["a"], name="rope/Mul"),
         helper.make_node("Slice", ["t", "s2", "e4", "ax"], ["hi"], name="rope/Slice_hi"),
         helper.make_node("Slice", ["t", "s0", "e2", "ax"], ["lo"], name="rope/Slice_lo"),
         helper.make_node("Neg", ["hi"], ["nhi"], name="rope/Neg"),
         helper.make_node("Concat", ["nhi", "lo"], ["rot"], name="rope/Concat", axis=-1),
         helper.make_node("Mul", ["rot", "sin"], ["b"], name="rope/Mul_1"),
         helper.make_node("Add", ["a", "b"], ["r"], name="rope/Add"),
         helper.make_node("Reshape", ["r", "merge"], ["y"], name="rope/merge")],
     [f32("x", [6, 8])], [f32("y", [6, 8])],
     heads_inits + [numpy_helper.from_array(np.cos(ang), "cos"),
                    numpy_helper.from_array(np.sin(ang), "sin"),
                    i64("s0", [0]), i64("s2", [2]), i64("e2", [2]), i64("e4", [4]), i64("ax", [3]),
                    i64("merge", [6, 8])])
save("rope_runtime_table",
     heads_nodes + [helper.make_node("Mul", ["t", "c"], ["a"], name="rope/Mul"),
                    helper.make_node("Reshape", ["a", "merge"], ["y"], name="rope/merge")],
     [f32("x", [6, 8]), f32("c", [1, 3, 1, 4])], [f32("y", [6, 8])],
     heads_inits + [i64("merge", [6, 8])])
save("rope_strided_slice",
     heads_nodes + [helper.make_node("Slice", ["t", "s0", "e4", "ax", "st"], ["y"],
                                     name="rope/Slice_even")],
     [f32("x", [6, 8])], [f32("y", [2, 3, 2, 2])],
     heads_inits + [i64("s0", [0]), i64("e4", [4]), i64("ax", [3]), i64("st", [2])])
save("rope_slice_heads",
     heads_nodes + [helper.make_node("Slice", ["t", "s0", "e1", "ax"], ["y"],
                                     name="rope/Slice_head")],
     [f32("x", [6, 8])], [f32("y", [2, 1, 2, 4])],
     heads_inits + [i64("s0", [0]), i64("e1", [1]), i64("ax", [1])])
# Heads computed on as the output: in token order ([B, S, H, d]) they are the output's own
# layout; transposed to [B, H, S, d] they are refused where the output is.
save("heads_output", heads_nodes + [helper.make_node("Sigmoid", ["t"], ["y"], name="rope/Sigmoid")],
     [f32("x", [6, 8])], [f32("y", [2, 3, 2, 4])], heads_inits)
save("heads_output_transposed",
     heads_nodes + [helper.make_node("Transpose", ["t"], ["tt"], name="rope/Transpose",
                                     perm=[0, 2, 1, 3]),
                    helper.make_node("Sigmoid", ["tt"], ["y"], name="rope/Sigmoid")],
     [f32("x", [6, 8])], [f32("y", [2, 2, 3, 4])], heads_inits)

# Every other element of each head (x[..., ::2]) used as data, not in rotate_every_two; last,
# so that the weights drawn above come out as before.
save("every_other_element",
     [helper.make_node("MatMul", ["x", "W"], ["h"], name="proj"),
      helper.make_node("Reshape", ["h", "heads"], ["t"], name="split"),
      helper.make_node("Slice", ["t", "s0", "s1", "ax", "st"], ["e"], name="evens"),
      helper.make_node("Reshape", ["e", "flat"], ["y"], name="merge")],
     [f32("x", [1, 4, 8])], [f32("y", [1, 4, 4])],
     [weight("W", 8, 8), numpy_helper.from_array(np.array([1, 4, 2, 4], dtype=np.int64), "heads"),
      numpy_helper.from_array(np.array([0], dtype=np.int64), "s0"),
      numpy_helper.from_array(np.array([4], dtype=np.int64), "s1"),
      numpy_helper.from_array(np.array([3], dtype=np.int64), "ax"),
      numpy_helper.from_array(np.array([2], dtype=np.int64), "st"),
      numpy_helper.from_array(np.array([1, 4, 4], dtype=np.int64), "flat")])

# ONNX's Attention (opset 23), as torch's dynamo exporter writes scaled_dot_product_attention:
# Q, K, V rank 3 with head counts as attributes (GQA, is_causal), or the heads [B, H, S, d] of
# projections with a bool padding mask and a scale; with inputs and the output numpy computes
# from the operator's definition (OUT/NAME_io). And two it must refuse: a KV cache, softcap.
# Last, so that the weights drawn above come out as before.
def sdpa(q, k, v, bias, scale):  # [B, H, Sq, d], [B, Hkv, Sk, d]: the operator's reference
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def attention23(name, heads4, with_mask, extra=None, scaled_q=False):
    B, S, E, H, HKV, d = 2, 7, 64, 4, 2, 16
    ws = [weight(n, E, c) for n, c in (("Wq", H * d), ("Wk", HKV * d), ("Wv", HKV * d))]
    wo = weight("Wo", H * d, E)
    nodes = [helper.make_node("MatMul", ["x", w.name], [w.name[1] + "p"], name=w.name[1] + "_proj")
             for w in ws]
    inits = ws + [wo]
    ins = ["qp", "kp", "vp"]
    if heads4:
        for t, h in (("q", H), ("k", HKV), ("v", HKV)):
            inits.append(numpy_helper.from_array(np.array([B, S, h, d], np.int64), t + "_shape"))
            nodes += [helper.make_node("Reshape", [t + "p", t + "_shape"], [t + "r"]),
                      helper.make_node("Transpose", [t + "r"], [t + "h"], perm=[0, 2, 1, 3])]
        ins = ["qh", "kh", "vh"]
    if scaled_q:  # heads computed on before attention (as RoPE's tables are applied)
        table = (rng.random((1, 1, S, d)) + 0.5).astype(np.float32)
        inits.append(numpy_helper.from_array(table, "table"))
        nodes.append(helper.make_node("Mul", ["qh", "table"], ["qs"], name="q_table"))
        ins[0] = "qs"
    attrs = {} if heads4 else {"q_num_heads": H, "kv_num_heads": HKV}
    attrs.update({"scale": 0.3} if with_mask else {"is_causal": 1})
    attrs.update(extra or {})
    graph_ins = [f32("x", [B, S, E])]
    if with_mask:
        ins.append("m")
        graph_ins.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [B, 1, 1, S]))
    outs = ["o", "present_k"] if heads4 else ["o"]
    nodes.append(helper.make_node("Attention", ins, outs, name="sdpa", **attrs))
    if heads4:
        inits.append(numpy_helper.from_array(np.array([B, S, H * d], np.int64), "o_shape"))
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ot", "o_shape"], ["o3"])]
    nodes.append(helper.make_node("MatMul", ["o3" if heads4 else "o", "Wo"], ["y"], name="o_proj"))
    save(name, nodes, graph_ins, [f32("y", [B, S, E])], inits, opset=23)
    io = os.path.join(OUT, name + "_io")
    os.makedirs(io, exist_ok=True)
    x = rng.standard_normal((B, S, E)).astype(np.float16)
    x.tofile(os.path.join(io, "x.f16"))
    xd = x.astype(np.float64)
    q, k, v = [(xd @ numpy_helper.to_array(w).astype(np.float64)).reshape(B, S, -1, d)
               .transpose(0, 2, 1, 3) for w in ws]
    if scaled_q:
        q = q * table
    if with_mask:
        m = np.ones((B, 1, 1, S), bool)
        m[1, 0, 0, 4:] = False  # the second sequence is 4 tokens long
        m.tofile(os.path.join(io, "m.bool"))
        bias, scale = np.where(m, 0.0, -np.inf), 0.3
    else:
        bias, scale = np.triu(np.full((S, S), -np.inf), 1), 1 / np.sqrt(d)
    o = sdpa(q, k, v, bias, scale).transpose(0, 2, 1, 3).reshape(B, S, H * d)
    (o @ numpy_helper.to_array(wo).astype(np.float64)).astype(np.float32).tofile(
        os.path.join(io, "y.f32"))


attention23("attention23_gqa_causal", heads4=False, with_mask=False)
attention23("attention23_heads_mask", heads4=True, with_mask=True)
attention23("attention23_heads_table", heads4=True, with_mask=False, scaled_q=True)
attention23("attention23_softcap", heads4=False, with_mask=False, extra={"softcap": 30.0})
save("attention23_cache",
     [helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "k2", "v2"],
                       name="cached", q_num_heads=2, kv_num_heads=2, is_causal=1)],
     [f32("q", [1, 1, 32]), f32("k", [1, 1, 32]), f32("v", [1, 1, 32]),
      f32("pk", [1, 2, 5, 16]), f32("pv", [1, 2, 5, 16])], [f32("y", [1, 1, 32])], [], opset=23)


# A step with a key/value cache through ONNX's Attention: past_key and past_value [B, Hkv, P, d]
# given, present_key and present_value returned, the causal mask (bottom-right: the new tokens
# see the past) given as a bool attn_mask; all three outputs against numpy.
def attention23_kv():
    B, S, P, E, H, HKV, d = 2, 3, 5, 64, 4, 2, 16
    ws = [weight(n, E, c) for n, c in (("Wq", H * d), ("Wk", HKV * d), ("Wv", HKV * d))]
    mask = np.tril(np.ones((S, P + S), bool), P)
    nodes = [helper.make_node("MatMul", ["x", w.name], [w.name[1] + "p"], name=w.name[1] + "_proj")
             for w in ws]
    nodes.append(helper.make_node("Attention", ["qp", "kp", "vp", "mask", "pk", "pv"],
                                  ["y", "present_k", "present_v"], name="cached", q_num_heads=H,
                                  kv_num_heads=HKV))
    save("attention23_kv", nodes,
         [f32("x", [B, S, E]), f32("pk", [B, HKV, P, d]), f32("pv", [B, HKV, P, d])],
         [f32("y", [B, S, H * d]), f32("present_k", [B, HKV, P + S, d]),
          f32("present_v", [B, HKV, P + S, d])], ws + [numpy_helper.from_array(mask, "mask")],
         opset=23)
    io = os.path.join(OUT, "attention23_kv_io")
    os.makedirs(io, exist_ok=True)
    x = rng.standard_normal((B, S, E)).astype(np.float16)
    pk = rng.standard_normal((B, HKV, P, d)).astype(np.float16)
    pv = rng.standard_normal((B, HKV, P, d)).astype(np.float16)
    for n, t in (("x", x), ("pk", pk), ("pv", pv)):
        t.tofile(os.path.join(io, n + ".f16"))
    xd = x.astype(np.float64)
    q, k, v = [(xd @ numpy_helper.to_array(w).astype(np.float64)).reshape(B, S, -1, d)
               .transpose(0, 2, 1, 3) for w in ws]
    k = np.concatenate([pk.astype(np.float64), k], axis=2)
    v = np.concatenate([pv.astype(np.float64), v], axis=2)
    o = sdpa(q, k, v, np.where(mask, 0.0, -np.inf), 1 / np.sqrt(d))
    for n, t in (("y", o.transpose(0, 2, 1, 3).reshape(B, S, H * d)), ("present_k", k),
                 ("present_v", v)):
        t.astype(np.float32).tofile(os.path.join(io, n + ".f32"))


attention23_kv()


# A cache joined with new heads and then used as data (not as attention's K or V), and one
# joined along the head dimension: refused, with what is supported.
def kv_misused(name, axis, use):
    B, S, P, E, HKV, d = 2, 3, 5, 32, 2, 16
    w = weight("Wk", E, HKV * d)
    nodes = [helper.make_node("MatMul", ["x", "Wk"], ["kp"], name="k_proj"),
             helper.make_node("Reshape", ["kp", "k_shape"], ["kr"], name="k_view"),
             helper.make_node("Transpose", ["kr"], ["kh"], name="k_heads", perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["pk", "kh"], ["kc"], name="append", axis=axis),
             helper.make_node(use, ["kc"], ["y"], name="use")]
    save(name, nodes, [f32("x", [B, S, E]), f32("pk", [B, HKV, P, d])],
         [f32("y", None)], [w, numpy_helper.from_array(np.array([B, S, HKV, d], np.int64),
                                                       "k_shape")])


# Positions given at run time (Hugging Face's position_ids, int64) in a product with the
# rotary frequencies: refused (integer inputs are masks of 0s and 1s).
save("position_ids_product",
     [helper.make_node("Cast", ["pos"], ["posf"], name="cast", to=TensorProto.FLOAT),
      helper.make_node("MatMul", ["posf", "inv_freq"], ["y"], name="freqs")],
     [helper.make_tensor_value_info("pos", TensorProto.INT64, [6, 1])], [f32("y", [6, 8])],
     [numpy_helper.from_array(rng.random((1, 8)).astype(np.float32), "inv_freq")])
kv_misused("kv_cache_as_data", 2, "Relu")
kv_misused("kv_cache_other_axis", 1, "Identity")


# Caches in torch.bmm's form [B*Hkv, P, d] (Falcon's): one read as data before it is joined with
# the new keys, and BLOOM's keys [B*H, d, P], joined along their last axis: refused.
def kv_flat_misused(name):
    B, S, P, E, HKV, d = 2, 3, 5, 32, 2, 16
    bloom = name == "kv_cache_keys_transposed"
    nodes = [helper.make_node("MatMul", ["x", "Wk"], ["kp"], name="k_proj"),
             helper.make_node("Reshape", ["kp", "k_shape"], ["kr"], name="k_view"),
             helper.make_node("Transpose", ["kr"], ["kt"], name="k_heads",
                              perm=[0, 2, 3, 1] if bloom else [0, 2, 1, 3]),
             helper.make_node("Reshape", ["kt", "flat_shape"], ["kh"], name="k_flat")]
    outs = [f32("y", None)]
    if not bloom:
        nodes.insert(0, helper.make_node("Relu", ["pk"], ["early"], name="early_use"))
        outs.append(f32("early", None))
    nodes.append(helper.make_node("Concat", ["pk", "kh"], ["y"], name="append",
                                  axis=2 if bloom else 1))
    flat = [B * HKV, d, S] if bloom else [B * HKV, S, d]
    save(name, nodes, [f32("x", [B, S, E]), f32("pk", [B * HKV, d, P] if bloom else [B * HKV, P, d])],
         outs, [weight("Wk", E, HKV * d),
                numpy_helper.from_array(np.array([B, S, HKV, d], np.int64), "k_shape"),
                numpy_helper.from_array(np.array(flat, np.int64), "flat_shape")])


kv_flat_misused("kv_cache_flat_read_first")
kv_flat_misused("kv_cache_keys_transposed")

# GPT-2's causal buffer of n_positions rows sliced past its end (a sequence longer than the
# model's positions), then a Slice more, then added to the scores: the error names the Slice.
buf = numpy_helper.from_array(np.zeros((1, 1, 4, 4), np.float32), "bias_buf")
save("slice_past_the_end",
     [helper.make_node("Slice", ["bias_buf", "st", "en", "ax"], ["rows"], name="rows_of_buf"),
      helper.make_node("Slice", ["rows", "st0", "en0", "ax3"], ["cols"], name="cols_of_buf"),
      helper.make_node("Add", ["x", "cols"], ["y"], name="masked")],
     [f32("x", [1, 1, 2, 4])], [f32("y", None)],
     [buf, numpy_helper.from_array(np.array([6], np.int64), "st"),
      numpy_helper.from_array(np.array([8], np.int64), "en"),
      numpy_helper.from_array(np.array([2], np.int64), "ax"),
      numpy_helper.from_array(np.array([0], np.int64), "st0"),
      numpy_helper.from_array(np.array([4], np.int64), "en0"),
      numpy_helper.from_array(np.array([3], np.int64), "ax3")])

# RMSNormalization (opset 23, the dynamo exporter's RMSNorm) before a projection, against
# numpy's evaluation of the operator; and over an axis other than the last, refused.
def rms23(name, axis):
    B, S, E, N = 2, 5, 32, 48
    g = numpy_helper.from_array((rng.random(E) + 0.5).astype(np.float32), "g")
    w = weight("W", E, N)
    save(name, [helper.make_node("RMSNormalization", ["x", "g"], ["n"], name="norm",
                                 epsilon=1e-6, axis=axis),
                helper.make_node("MatMul", ["n", "W"], ["y"], name="proj")],
         [f32("x", [B, S, E])], [f32("y", [B, S, N])], [g, w], opset=23)
    io = os.path.join(OUT, name + "_io")
    os.makedirs(io, exist_ok=True)
    x = rng.standard_normal((B, S, E)).astype(np.float16)
    x.tofile(os.path.join(io, "x.f16"))
    xd = x.astype(np.float64)
    nd = xd / np.sqrt((xd * xd).mean(-1, keepdims=True) + 1e-6) * numpy_helper.to_array(g)
    (nd @ numpy_helper.to_array(w).astype(np.float64)).astype(np.float32).tofile(
        os.path.join(io, "y.f32"))


rms23("rmsnorm23", -1)
rms23("rmsnorm23_axis1", 1)
save("attention23_present3d",
     [helper.make_node("Attention", ["q", "k", "v"], ["y", "pk"], name="with_present",
                       q_num_heads=2, kv_num_heads=2)],
     [f32("q", [1, 3, 32]), f32("k", [1, 3, 32]), f32("v", [1, 3, 32])],
     [f32("y", [1, 3, 32])], [], opset=23)
