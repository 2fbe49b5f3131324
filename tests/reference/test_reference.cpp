// The CPU reference interpreter against hand-computed values and identities.
#define BOOST_TEST_MODULE reference
#include "fpat/ir/Builder.h"
#include "fpat/ir/Reference.h"
#include "fpat/ir/Rows.h"

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>
#include <set>

using namespace fpat::ir;

namespace {
Tensor make(std::vector<int64_t> shape, std::vector<float> data, DType dt = DType::F32) {
  return Tensor{{std::move(shape), dt}, std::move(data)};
}
} // namespace

BOOST_AUTO_TEST_CASE(activations_match_hand_computed_values) {
  BOOST_TEST(relu(-3.0) == 0.0);
  BOOST_TEST(relu(2.5) == 2.5);
  BOOST_TEST(silu(0.0) == 0.0);
  BOOST_TEST(std::abs(silu(1.0) - 0.7310585786300049) < 1e-15);
  BOOST_TEST(std::abs(geluErf(1.0) - 0.8413447460685429) < 1e-15);
  BOOST_TEST(std::abs(geluTanh(1.0) - 0.8411919906082768) < 1e-15);
  // The tanh approximation stays within 5e-4 of exact GeLU (the seed reported 4.73e-4).
  double worst = 0;
  for (double x = -6; x <= 6; x += 1.0 / 64)
    worst = std::max(worst, std::abs(geluTanh(x) - geluErf(x)));
  BOOST_TEST(worst < 5e-4);
  BOOST_TEST(worst > 1e-4);
}

BOOST_AUTO_TEST_CASE(small_graph_by_hand) {
  // y = relu([[1,2],[3,4]] * [[1,-1],[0,1]] + [0.5, -10])
  GraphBuilder b("hand", ActivationSet::builtin());
  Value x = b.input("x", {2, 2}, DType::F32);
  Value w = b.input("w", {2, 2}, DType::F32);
  Value c = b.input("c", {2}, DType::F32);
  Value y = b.activation(b.bias(b.gemm(x, w), c), "relu", "y");
  b.output(y);
  Graph g = b.build();
  auto vals = evaluate(g, {{"x", make({2, 2}, {1, 2, 3, 4})},
                           {"w", make({2, 2}, {1, -1, 0, 1})},
                           {"c", make({2}, {0.5f, -10})}});
  // x*w = [[1, 1], [3, 1]]; + c = [[1.5, -9], [3.5, -9]]; relu -> [[1.5, 0], [3.5, 0]]
  BOOST_TEST(vals[y.v].data == (std::vector<float>{1.5f, 0, 3.5f, 0}));
}

BOOST_AUTO_TEST_CASE(gemm_matches_naive_triple_loop_both_layouts) {
  const int64_t m = 17, k = 100, n = 33;
  GraphBuilder b("mm");
  Value a = b.input("a", {m, k}, DType::F32);
  Value w = b.input("w", {k, n}, DType::F32);
  Value wt = b.input("wt", {n, k}, DType::F32);
  Value c = b.gemm(a, w, false, "c");
  Value ct = b.gemm(a, wt, true, "ct");
  b.output(c).output(ct);
  Graph g = b.build();
  auto in = randomInputs(g, 7);
  auto vals = evaluate(g, in);
  const auto &A = in["a"].data, &W = in["w"].data, &WT = in["wt"].data;
  double worst = 0, worstT = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, st = 0;
      for (int64_t p = 0; p < k; ++p) {
        s += double(A[i * k + p]) * W[p * n + j];
        st += double(A[i * k + p]) * WT[j * k + p];
      }
      worst = std::max(worst, std::abs(vals[c.v].data[i * n + j] - s));
      worstT = std::max(worstT, std::abs(vals[ct.v].data[i * n + j] - st));
    }
  BOOST_TEST(worst < 1e-5); // only the final rounding to f32 differs
  BOOST_TEST(worstT < 1e-5);
}

BOOST_AUTO_TEST_CASE(f16_results_are_rounded_to_half) {
  GraphBuilder b("h");
  Value x = b.input("x", {1, 3});
  Value y = b.add(x, x, "y");
  b.output(y);
  Graph g = b.build();
  // 1 + 2^-11 is not representable in f16; x + x = 2 + 2^-10 rounds to even = 2.
  auto vals = evaluate(g, {{"x", make({1, 3}, {0.1f, 1.0f, 1000.0f}, DType::F16)}});
  BOOST_TEST(vals[y.v].data[1] == 2.0f);
  BOOST_TEST(vals[y.v].data[2] == 2000.0f);
  BOOST_TEST(vals[y.v].data[0] == roundToHalf(2.0 * 0.1f));
  auto in = randomInputs(g, 3);
  for (float v : in["x"].data)
    BOOST_TEST(v == roundToHalf(v));
}

BOOST_AUTO_TEST_CASE(layernorm_rows_have_zero_mean_and_unit_variance) {
  const int64_t m = 5, n = 64;
  GraphBuilder b("ln");
  Value x = b.input("x", {m, n}, DType::F32);
  Value gamma = b.input("g", {n}, DType::F32);
  Value beta = b.input("b", {n}, DType::F32);
  Value y = b.layernorm(x, gamma, beta, 1e-12, "y");
  b.output(y);
  Graph g = b.build();
  auto in = randomInputs(g, 11);
  in["g"] = make({n}, std::vector<float>(n, 1.0f));
  in["b"] = make({n}, std::vector<float>(n, 0.0f));
  auto vals = evaluate(g, in);
  for (int64_t i = 0; i < m; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < n; ++j)
      mean += vals[y.v].data[i * n + j];
    mean /= n;
    for (int64_t j = 0; j < n; ++j)
      var += std::pow(vals[y.v].data[i * n + j] - mean, 2);
    var /= n;
    BOOST_TEST(std::abs(mean) < 1e-6);
    BOOST_TEST(std::abs(var - 1.0) < 1e-5);
  }
  // gamma and beta scale and shift each column.
  in["g"] = make({n}, std::vector<float>(n, 2.0f));
  in["b"] = make({n}, std::vector<float>(n, 3.0f));
  auto scaled = evaluate(g, in);
  for (size_t i = 0; i < scaled[y.v].data.size(); ++i)
    BOOST_TEST(std::abs(scaled[y.v].data[i] - (2 * vals[y.v].data[i] + 3)) < 1e-5);
}

BOOST_AUTO_TEST_CASE(rmsnorm_of_a_constant_row) {
  // rmsnorm(c, c, ..., c) = c / sqrt(c^2 + eps) * gamma = sign(c) * gamma (eps -> 0)
  GraphBuilder b("rms");
  Value x = b.input("x", {2, 8}, DType::F32);
  Value gamma = b.input("g", {8}, DType::F32);
  Value y = b.rmsnorm(x, gamma, 1e-6, "y");
  b.output(y);
  Graph g = b.build();
  std::vector<float> xs(16, 3.0f);
  std::fill(xs.begin() + 8, xs.end(), -0.5f);
  std::vector<float> gs = {1, 2, 3, 4, 5, 6, 7, 8};
  auto vals = evaluate(g, {{"x", make({2, 8}, xs)}, {"g", make({8}, gs)}});
  for (int j = 0; j < 8; ++j) {
    BOOST_TEST(std::abs(vals[y.v].data[j] - 3.0 / std::sqrt(9.0 + 1e-6) * gs[j]) < 1e-6);
    BOOST_TEST(std::abs(vals[y.v].data[8 + j] + 0.5 / std::sqrt(0.25 + 1e-6) * gs[j]) < 1e-6);
  }
}

BOOST_AUTO_TEST_CASE(softmax_rows_by_hand) {
  // Row 0: 0, ln 2, ln 3, ln 4 -> 1:2:3:4 / 10. Row 1: the same shifted by 1000, which exp()
  // alone would overflow: the maximum comes off first. Row 2: all -inf -> NaN (as torch).
  GraphBuilder b("softmax");
  Value x = b.input("x", {3, 4}, DType::F32);
  Value y = b.softmax(x, "y");
  b.output(y);
  Graph g = b.build();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> xs = {0, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  for (int j = 0; j < 4; ++j)
    xs.push_back(xs[static_cast<size_t>(j)] + 1000.0f);
  xs.insert(xs.end(), {-inf, -inf, -inf, -inf});
  auto vals = evaluate(g, {{"x", make({3, 4}, xs)}});
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j)
      BOOST_TEST(std::abs(vals[y.v].data[static_cast<size_t>(r * 4 + j)] - (j + 1) / 10.0) < 1e-4,
                 "row " << r << " column " << j);
  for (int j = 8; j < 12; ++j)
    BOOST_TEST(std::isnan(vals[y.v].data[static_cast<size_t>(j)]));
  // Rows are independent: the reference may sample them.
  BOOST_TEST(sampleRows(g, 2).has_value());
}

BOOST_AUTO_TEST_CASE(attention_by_hand) {
  // One batch, one head, d = 2, two keys: q = (1, 0), k = (ln 3, 0), (0, 0): scores ln 3 and 0,
  // softmax 3/4 and 1/4 of the values (4, 8) and (0, 4): (3, 7). With a causal mask over two
  // queries the first sees only key 0: its values (4, 8).
  GraphBuilder b("attn");
  Value q = b.input("q", {2, 2}, DType::F32), k = b.input("k", {2, 2}, DType::F32),
        v = b.input("v", {2, 2}, DType::F32);
  const float inf = std::numeric_limits<float>::infinity();
  Value mask = b.weight("mask", {1, 1, 2, 2}, DType::F32, {0, -inf, 0, 0});
  Value one = b.constant(1.0, {}, DType::F32);
  Value y = b.attention(q, k, v, mask, one, 1, 2, "y");
  Value s = b.attnQk(q, k, 1, 2, "s");
  Value z = b.attnPv(b.softmax(b.add(s, mask)), v, 1, 2, "z");
  b.output(y).output(z);
  Graph g = b.build();
  BOOST_TEST(g.op(s.v).type.shape == (std::vector<int64_t>{1, 1, 2, 2}));
  auto in = randomInputs(g, 1); // the mask's values, and q, k, v replaced:
  in["q"] = make({2, 2}, {1, 0, 1, 0});
  in["k"] = make({2, 2}, {std::log(3.0f), 0, 0, 0});
  in["v"] = make({2, 2}, {4, 8, 0, 4});
  auto vals = evaluate(g, in);
  const std::vector<float> want = {4, 8, 3, 7};
  for (size_t i = 0; i < 4; ++i) {
    BOOST_TEST(std::abs(vals[y.v].data[i] - want[i]) < 1e-5, "attention element " << i);
    BOOST_TEST(std::abs(vals[z.v].data[i] - want[i]) < 1e-5, "decomposition element " << i);
  }
  // A query row reads every key row of its batch: no row sampling through attention.
  BOOST_TEST(!sampleRows(g, 1).has_value());
}

BOOST_AUTO_TEST_CASE(attention_gqa_is_repeated_kv_heads) {
  // Hkv = 2 shared by 8 query heads equals each KV head repeated 4 times (repeat_kv), for two
  // batches of 3 queries and 5 keys, with a [B, 1, 1, Sk] padding bias.
  const int64_t B = 2, Sq = 3, Sk = 5, H = 8, Hkv = 2, d = 4;
  GraphBuilder b("gqa");
  Value q = b.input("q", {B * Sq, H * d}, DType::F32);
  Value k = b.input("k", {B * Sk, Hkv * d}, DType::F32),
        v = b.input("v", {B * Sk, Hkv * d}, DType::F32);
  Value kr = b.input("kr", {B * Sk, H * d}, DType::F32),
        vr = b.input("vr", {B * Sk, H * d}, DType::F32);
  Value pad = b.input("pad", {B, 1, 1, Sk}, DType::F32);
  Value scale = b.constant(0.5, {}, DType::F32);
  Value y = b.attention(q, k, v, pad, scale, B, d, "y");
  Value yr = b.attention(q, kr, vr, pad, scale, B, d, "yr");
  b.output(y).output(yr);
  Graph g = b.build();
  auto in = randomInputs(g, 3);
  for (const char* n : {"k", "v"}) {
    Tensor rep{{{B * Sk, H * d}, DType::F32}, {}};
    const Tensor& src = in.at(n);
    for (int64_t r = 0; r < B * Sk; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < d; ++c)
          rep.data.push_back(src.data[static_cast<size_t>(r * Hkv * d + h / (H / Hkv) * d + c)]);
    in[std::string(n) + "r"] = rep;
  }
  auto vals = evaluate(g, in);
  for (size_t i = 0; i < vals[y.v].data.size(); ++i)
    BOOST_TEST(vals[y.v].data[i] == vals[yr.v].data[i], "element " << i);
}

BOOST_AUTO_TEST_CASE(attention_shapes_are_checked) {
  GraphBuilder b("bad");
  Value q = b.input("q", {6, 32}), k = b.input("k", {10, 24});
  BOOST_CHECK_EXCEPTION(b.attnQk(q, k, 2, 16), BuildError, [](const BuildError& e) {
    return std::string(e.what()).find("[B*Sk, Hkv*d] with d = 16") != std::string::npos;
  });
  Value k2 = b.input("k2", {10, 16});
  BOOST_CHECK_EXCEPTION(b.attnQk(q, k2, 4, 16), BuildError, [](const BuildError& e) {
    return std::string(e.what()).find("with B = 4") != std::string::npos;
  });
  Value s = b.attnQk(q, k2, 2, 16);
  Value bias = b.input("bias", {3, 5});
  Value big = b.input("big", {2, 1, 4, 5});
  Value scale = b.constant(1.0);
  BOOST_CHECK_NO_THROW(b.attention(q, k2, k2, bias, scale, 2, 16));
  BOOST_CHECK_EXCEPTION(
      b.attention(q, k2, k2, big, scale, 2, 16), BuildError, [](const BuildError& e) {
        return std::string(e.what()).find("does not broadcast") != std::string::npos;
      });
  BOOST_CHECK_EXCEPTION(
      b.attention(q, k2, k2, bias, bias, 2, 16), BuildError, [](const BuildError& e) {
        return std::string(e.what()).find("must be a scalar") != std::string::npos;
      });
  BOOST_TEST(b.type(s).shape == (std::vector<int64_t>{2, 2, 3, 5}));
}

BOOST_AUTO_TEST_CASE(rope_heads_and_concat_by_hand) {
  // x = one token, one head of d = 4: (1, 2, 3, 4); rotate_half = (-3, -4, 1, 2). With cos 0.5
  // and sin 2 everywhere: (0.5 - 6, 1 - 8, 1.5 + 2, 2 + 4) = (-5.5, -7, 3.5, 6). heads and
  // merge_heads keep the elements; concat puts rows side by side.
  GraphBuilder b("rope");
  Value x = b.input("x", {1, 4}, DType::F32);
  Value h = b.heads(x, 1, 4, "h");
  Value c = b.constant(0.5, {}, DType::F32), sn = b.constant(2.0, {}, DType::F32);
  Value y = b.mergeHeads(b.rope(h, c, sn), "y");
  Value z = b.concat(x, y, "z");
  b.output(z);
  Graph g = b.build();
  BOOST_TEST(g.op(h.v).type.shape == (std::vector<int64_t>{1, 1, 1, 4}));
  auto vals = evaluate(g, {{"x", make({1, 4}, {1, 2, 3, 4})}});
  const std::vector<float> want = {1, 2, 3, 4, -5.5f, -7, 3.5f, 6};
  for (size_t i = 0; i < want.size(); ++i)
    BOOST_TEST(vals[z.v].data[i] == want[i], "element " << i);
  // Interleaved (GPT-J's rotate_every_two): pairs (1, 2), (3, 4) rotate to (-2, 1, -4, 3):
  // (0.5 - 4, 1 + 2, 1.5 - 8, 2 + 6) = (-3.5, 3, -6.5, 8).
  GraphBuilder bp("pairs");
  Value xp = bp.input("x", {1, 4}, DType::F32);
  Value hp = bp.heads(xp, 1, 4, "h");
  Value yp = bp.mergeHeads(bp.rope(hp, bp.constant(0.5, {}, DType::F32),
                                   bp.constant(2.0, {}, DType::F32), "r", /*interleaved=*/true),
                           "y");
  bp.output(yp);
  Graph gp = bp.build();
  auto pv = evaluate(gp, {{"x", make({1, 4}, {1, 2, 3, 4})}});
  const std::vector<float> wantPairs = {-3.5f, 3, -6.5f, 8};
  for (size_t i = 0; i < wantPairs.size(); ++i)
    BOOST_TEST(pv[yp.v].data[i] == wantPairs[i], "interleaved, element " << i);
  GraphBuilder bad("odd");
  Value o = bad.input("o", {2, 3});
  BOOST_CHECK_EXCEPTION(
      bad.rope(o, bad.constant(1.0), bad.constant(1.0)), BuildError, [](const BuildError& e) {
        return std::string(e.what()).find("even last dimension") != std::string::npos;
      });
}

BOOST_AUTO_TEST_CASE(token_rows_reordered_by_hand) {
  // x: 3 positions of 2 sequences, sequence-first (rows s0b0, s0b1, s1b0, ...), rows of 2 whose
  // first element numbers the row. batch_first gives s0b0, s1b0, s2b0, s0b1, s1b1, s2b1;
  // seq_first takes them back.
  GraphBuilder b("rows");
  Value x = b.input("x", {6, 2}, DType::F32);
  Value bf = b.batchFirst(x, 2, "bf");
  Value sf = b.seqFirst(bf, 2, "sf");
  b.output(bf).output(sf);
  Graph g = b.build();
  const std::vector<float> xs = {0, 10, 1, 11, 2, 12, 3, 13, 4, 14, 5, 15};
  auto vals = evaluate(g, {{"x", make({6, 2}, xs)}});
  const std::vector<float> want = {0, 10, 2, 12, 4, 14, 1, 11, 3, 13, 5, 15};
  BOOST_TEST(vals[bf.v].data == want, boost::test_tools::per_element());
  BOOST_TEST(vals[sf.v].data == xs, boost::test_tools::per_element());
  GraphBuilder bad("bad");
  Value o = bad.input("o", {6, 2});
  for (int64_t batch : {0, 4})
    BOOST_CHECK_EXCEPTION(bad.batchFirst(o, batch), BuildError, [&](const BuildError& e) {
      const std::string m = e.what();
      return m.find(batch ? "does not divide operand 0's 6 rows" : "needs batch = B") !=
             std::string::npos;
    });
  BOOST_CHECK_EXCEPTION(
      bad.seqFirst(bad.input("r3", {2, 3, 2}), 2), BuildError, [](const BuildError& e) {
        return std::string(e.what()).find("matrix of token rows") != std::string::npos;
      });
}

BOOST_AUTO_TEST_CASE(kv_caches_appended_and_read_head_major) {
  // A cache [B 2, Hkv 2, P 3, d 2] whose elements number themselves, two new tokens a batch
  // (token-major [B*S, Hkv*d], elements 100 + their index): each (batch, head) gets its three
  // cached rows, then its two new ones.
  GraphBuilder b("kv");
  Value past = b.input("past", {2, 2, 3, 2}, DType::F32);
  Value fresh = b.input("new", {4, 4}, DType::F32);
  Value c = b.kvAppend(past, fresh, "c");
  b.output(c);
  Graph g = b.build();
  BOOST_TEST(g.op(c.v).type.shape == (std::vector<int64_t>{2, 2, 5, 2}));
  std::vector<float> ps(24), ns(16);
  for (size_t i = 0; i < ps.size(); ++i)
    ps[i] = static_cast<float>(i);
  for (size_t i = 0; i < ns.size(); ++i)
    ns[i] = 100.0f + static_cast<float>(i);
  auto vals = evaluate(g, {{"past", make({2, 2, 3, 2}, ps)}, {"new", make({4, 4}, ns)}});
  // (b, h) = (0, 0): past rows 0-2, then new tokens 0 and 1, head 0 (elements 100, 101 and
  // 104, 105); (0, 1): past rows 3-5, then head 1 of those tokens (102, 103, 106, 107); ...
  const std::vector<float> want = {
      0,  1,  2,  3,  4,  5,  100, 101, 104, 105, 6,  7,  8,  9,  10, 11, 102, 103, 106, 107,
      12, 13, 14, 15, 16, 17, 108, 109, 112, 113, 18, 19, 20, 21, 22, 23, 110, 111, 114, 115};
  BOOST_TEST(vals[c.v].data == want, boost::test_tools::per_element());

  // A token-major cache (GPTBigCode's [B, P, E] as [B*P, E], batch = 2): each batch's three
  // cached rows, then its two new ones.
  GraphBuilder r("kv_rows");
  Value rp = r.input("past", {6, 4}, DType::F32);
  Value rn = r.input("new", {4, 4}, DType::F32);
  Value rc = r.kvAppendRows(rp, rn, 2, "c");
  r.output(rc);
  Graph gr = r.build();
  BOOST_TEST(gr.op(rc.v).type.shape == (std::vector<int64_t>{10, 4}));
  auto rv = evaluate(gr, {{"past", make({6, 4}, ps)}, {"new", make({4, 4}, ns)}});
  std::vector<float> wantRows;
  for (int64_t bb = 0; bb < 2; ++bb) {
    for (int64_t i = 0; i < 12; ++i)
      wantRows.push_back(ps[static_cast<size_t>(bb * 12 + i)]);
    for (int64_t i = 0; i < 8; ++i)
      wantRows.push_back(ns[static_cast<size_t>(bb * 8 + i)]);
  }
  BOOST_TEST(rv[rc.v].data == wantRows, boost::test_tools::per_element());

  // Attention over a cache equals attention over the same keys and values token-major, for
  // every attention op (GQA: 4 query heads on 2 KV heads), to the last bit.
  GraphBuilder a("kv_attn");
  const int64_t B = 2, S = 3, P = 5, L = P + S, H = 4, Hkv = 2, d = 8;
  Value q = a.input("q", {B * S, H * d}, DType::F32);
  Value kc = a.input("k_cache", {B, Hkv, L, d}, DType::F32);
  Value vc = a.input("v_cache", {B, Hkv, L, d}, DType::F32);
  Value kt = a.input("k_rows", {B * L, Hkv * d}, DType::F32);
  Value vt = a.input("v_rows", {B * L, Hkv * d}, DType::F32);
  Value bias = a.constant(0.0, {}, DType::F32), scale = a.constant(0.3, {}, DType::F32);
  a.output(a.attention(q, kc, vc, bias, scale, B, d, "o_cache"))
      .output(a.attention(q, kt, vt, bias, scale, B, d, "o_rows"))
      .output(a.attnPv(a.softmax(a.attnQk(q, kc, B, d)), vc, B, d, "pv_cache"))
      .output(a.attnPv(a.softmax(a.attnQk(q, kt, B, d)), vt, B, d, "pv_rows"));
  Graph ga = a.build();
  auto in = randomInputs(ga, 3);
  for (const char* n : {"k", "v"}) { // the rows' values, moved into the cache's order
    const Tensor& rows = in.at(std::string(n) + "_rows");
    Tensor& cache = in.at(std::string(n) + "_cache");
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t j = 0; j < L; ++j)
          for (int64_t e = 0; e < d; ++e)
            cache.data[static_cast<size_t>(((bb * Hkv + h) * L + j) * d + e)] =
                rows.data[static_cast<size_t>((bb * L + j) * Hkv * d + h * d + e)];
  }
  auto out = evaluate(ga, in);
  const std::vector<Vertex>& o = ga.outputs();
  BOOST_TEST(out[o[0]].data == out[o[1]].data, boost::test_tools::per_element());
  BOOST_TEST(out[o[2]].data == out[o[3]].data, boost::test_tools::per_element());

  GraphBuilder bad("bad");
  Value cache = bad.input("cache", {2, 2, 3, 8});
  int named = 0;
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{5, 16}, {4, 12}, {2, 1, 3, 8}})
    BOOST_CHECK_EXCEPTION(bad.kvAppend(cache, bad.input("n" + std::to_string(named++), shape)),
                          BuildError, [](const BuildError& e) {
                            return std::string(e.what()).find("must be the new tokens' [B*S, "
                                                              "Hkv*d] = [2*S, 16]") !=
                                   std::string::npos;
                          });
  BOOST_CHECK_EXCEPTION(bad.kvAppend(bad.input("flat", {12, 8}), bad.input("m", {2, 16})),
                        BuildError, [](const BuildError& e) {
                          return std::string(e.what()).find("must be a cache [B, Hkv, P, d]") !=
                                 std::string::npos;
                        });
  // A cache whose batch or head dimension does not fit the attention.
  Value q2 = bad.input("q2", {2, 32});
  BOOST_CHECK_EXCEPTION(
      bad.attention(q2, bad.input("kc", {3, 2, 5, 8}), bad.input("vc", {3, 2, 5, 8}),
                    bad.constant(0.0), bad.constant(1.0), 2, 8),
      BuildError, [](const BuildError& e) {
        return std::string(e.what()).find("must be a cache [B, Hkv, Sk, d] with B = 2, d = 8") !=
               std::string::npos;
      });
}

BOOST_AUTO_TEST_CASE(random_inputs_are_deterministic_and_weights_scaled) {
  GraphBuilder b("r");
  Value x = b.input("x", {4, 300});
  Value w = b.input("w", {300, 4});
  b.output(b.gemm(x, w));
  Graph g = b.build();
  auto a = randomInputs(g, 5), c = randomInputs(g, 5), d = randomInputs(g, 6);
  BOOST_TEST(a["x"].data == c["x"].data);
  BOOST_TEST(a["x"].data != d["x"].data);
  double limit = std::sqrt(3.0 / 300) + 1e-3;
  for (float v : a["w"].data)
    BOOST_TEST(std::abs(v) <= limit);
}

BOOST_AUTO_TEST_CASE(random_masks_are_padding_masks) {
  // Each row along the last axis: ones, then fewer zeros than the row is long; rows differ.
  GraphBuilder b("m");
  Value m = b.input("m", {64, 9});
  b.output(m);
  Graph g = b.build();
  g.op(*g.find("m")).mask = true;
  auto a = randomInputs(g, 5), c = randomInputs(g, 5);
  BOOST_TEST(a["m"].data == c["m"].data);
  std::set<int> zeroCounts;
  for (size_t r = 0; r < 64; ++r) {
    int zeros = 0;
    for (size_t j = 0; j < 9; ++j) {
      const float v = a["m"].data[r * 9 + j];
      BOOST_TEST((v == 0.0f || v == 1.0f));
      if (v == 0.0f)
        ++zeros;
      else
        BOOST_TEST(zeros == 0, "row " << r << ": a one after a zero");
    }
    BOOST_TEST(zeros < 9);
    zeroCounts.insert(zeros);
  }
  BOOST_TEST(zeroCounts.size() > 4u); // not one fixed pattern
}

BOOST_AUTO_TEST_CASE(missing_or_misshapen_inputs_are_errors) {
  GraphBuilder b("e");
  Value x = b.input("x", {2, 2});
  b.output(b.activation(x, "silu"));
  Graph g = b.build();
  BOOST_CHECK_THROW(evaluate(g, {}), ReferenceError);
  BOOST_CHECK_THROW(evaluate(g, {{"x", make({2, 3}, std::vector<float>(6), DType::F16)}}),
                    ReferenceError);
}

BOOST_AUTO_TEST_CASE(user_activations_are_evaluated) {
  ActivationLibrary lib = ActivationLibrary::builtin();
  lib.add("leaky", [](double x, const std::map<std::string, double>& p) {
    return x > 0 ? x : p.at("alpha") * x;
  });
  ActivationSet names = lib.names();
  GraphBuilder b("u", names);
  Value x = b.input("x", {1, 2}, DType::F32);
  Value y = b.activation(x, "leaky", "y");
  b.output(y);
  Graph g = b.build();
  g.op(y.v).params["alpha"] = 0.25;
  auto vals = evaluate(g, {{"x", make({1, 2}, {-4, 4})}}, lib);
  BOOST_TEST(vals[y.v].data == (std::vector<float>{-1, 4}));
}

BOOST_AUTO_TEST_CASE(large_gemms_match_a_plain_double_loop) {
  // Products this large go to OpenBLAS where the system has it (in panels of B), else to the
  // reference's own loops; either way the result must be the double-precision product rounded
  // once. Both layouts of B, and M, N, K that are not multiples of anything.
  for (bool transB : {false, true})
    BOOST_TEST_CONTEXT("transB " << transB) {
      const int64_t m = 37, n = 301, k = 211;
      GraphBuilder b("big");
      Value x = b.input("x", {m, k});
      Value w = transB ? b.input("w", {n, k}) : b.input("w", {k, n});
      Value y = b.gemm(x, w, transB, "y");
      b.output(y);
      Graph g = b.build();
      auto in = randomInputs(g, 9);
      const auto got = evaluate(g, in)[y.v];
      double worst = 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += double(in["x"].data[i * k + p]) * in["w"].data[transB ? j * k + p : p * n + j];
          const double want = halfBitsToFloat(doubleToHalfBits(s));
          worst = std::max(worst, std::abs(want - got.data[i * n + j]));
        }
      BOOST_TEST(worst == 0.0);
    }
}

BOOST_AUTO_TEST_CASE(sampled_rows_equal_the_full_reference) {
  // A Llama MLP (norm, two GEMMs, SiLU * up, GEMM, residual) is row-wise: its sampled rows,
  // computed alone, are exactly those rows of the full evaluation.
  GraphBuilder b("mlp");
  Value x = b.input("x", {50, 24}), gn = b.input("g", {24});
  Value wg = b.input("wg", {40, 24}), wu = b.input("wu", {40, 24}), wd = b.input("wd", {24, 40});
  Value n = b.rmsnorm(x, gn, 1e-6, "n");
  Value h = b.mul(b.activation(b.gemm(n, wg, true), "silu"), b.gemm(n, wu, true), "h");
  Value y = b.add(x, b.gemm(h, wd, true), "y");
  b.output(y);
  Graph g = b.build();
  auto in = randomInputs(g, 4);
  auto full = evaluate(g, in)[y.v];
  std::string why;
  auto s = sampleRows(g, 7, &why);
  BOOST_TEST_REQUIRE(s.has_value(), why);
  BOOST_TEST(s->rows == 50);
  BOOST_TEST((s->picked == std::vector<int64_t>{0, 8, 16, 24, 32, 40, 49}));
  const auto rows = sliceInputs(g, *s, in);
  auto part = evaluate(s->graph, in, ActivationLibrary::builtin(), {}, &rows)[y.v];
  BOOST_TEST(part.data == sliceRows(full, s->picked).data);
  // Asking for more rows than there are is every row.
  BOOST_TEST(sampleRows(g, 1000)->picked.size() == 50u);
}

BOOST_AUTO_TEST_CASE(graphs_that_mix_rows_and_weights_are_not_sampled) {
  // x is both the GEMM's A (rows) and its B (read whole): no row of the output depends on one
  // row of x only.
  GraphBuilder b("gram");
  Value x = b.input("x", {16, 16});
  b.output(b.gemm(x, x, false, "y"));
  std::string why;
  BOOST_TEST(!sampleRows(b.build(), 4, &why).has_value());
  BOOST_TEST(why == "%x is used both row by row and whole");
}
