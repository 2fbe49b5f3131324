#include "fpat/ir/Reference.h"

#include "fpat/support/Blas.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <thread>

namespace fpat::ir {

double geluTanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}
double geluErf(double x) {
  return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
}
double silu(double x) {
  return x / (1.0 + std::exp(-x));
}
double relu(double x) {
  return x > 0 ? x : 0.0;
}

const ActivationLibrary& ActivationLibrary::builtin() {
  static const ActivationLibrary lib = [] {
    ActivationLibrary l;
    l.add("gelu", [](double x, const auto&) { return geluTanh(x); });
    l.add("gelu_erf", [](double x, const auto&) { return geluErf(x); });
    l.add("silu", [](double x, const auto&) { return silu(x); });
    l.add("relu", [](double x, const auto&) { return relu(x); });
    return l;
  }();
  return lib;
}

const ActivationFn* ActivationLibrary::find(const std::string& name) const {
  auto it = fns_.find(name);
  return it == fns_.end() ? nullptr : &it->second;
}

ActivationSet ActivationLibrary::names() const {
  ActivationSet s;
  for (auto& [name, fn] : fns_)
    s.add(name);
  return s;
}

namespace {

/// Runs fn(begin, end) over [0, n) split across the machine's cores. Each index is computed
/// by exactly one thread in the same way, so results do not depend on the thread count.
/// Runs fn over row ranges on the machine's cores; `workPerRow` (multiply-adds) keeps small
/// problems on one thread, where starting threads would cost more than the work.
void parallelRows(size_t n, size_t workPerRow, const std::function<void(size_t, size_t)>& fn) {
  size_t threads = std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, std::max<size_t>(1, n / 8));
  if (n * workPerRow < (size_t{1} << 20))
    threads = 1;
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back(fn, n * t / threads, n * (t + 1) / threads);
  for (std::thread& th : pool)
    th.join();
}

} // namespace

static float store(double v, DType t) {
  return roundTo(v, t);
}

Tensor randomTensor(const TensorDesc& desc, uint64_t seed, double lo, double hi) {
  // splitmix-seeded mt19937_64 with our own scaling keeps values identical across
  // standard libraries (uniform_real_distribution is implementation-defined). Blocks of 64K
  // elements have generators of their own, so large tensors fill in parallel and the values
  // do not depend on the thread count.
  constexpr size_t kBlock = size_t{1} << 16;
  Tensor t{desc, std::vector<float>(static_cast<size_t>(desc.numel()))};
  const size_t blocks = (t.data.size() + kBlock - 1) / kBlock;
  parallelRows(blocks, kBlock, [&](size_t first, size_t last) {
    for (size_t b = first; b < last; ++b) {
      std::mt19937_64 rng((seed + 0x9E3779B97F4A7C15ull * b) * 0x9E3779B97F4A7C15ull +
                          0x632BE59BD9B4E019ull);
      const size_t end = std::min(t.data.size(), (b + 1) * kBlock);
      for (size_t i = b * kBlock; i < end; ++i) {
        const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
        t.data[i] = store(lo + (hi - lo) * u, desc.dtype);
      }
    }
  });
  return t;
}

/// A padding mask: along the last axis, ones and then 0 to n - 1 zeros (each row keeps its
/// first position: a row of only masked keys is no input a model is given).
Tensor randomMask(const TensorDesc& desc, uint64_t seed) {
  Tensor t{desc, std::vector<float>(static_cast<size_t>(desc.numel()), 1.0f)};
  const int64_t n = desc.rank() ? desc.shape.back() : 1;
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  for (size_t row = 0; row < t.data.size() / static_cast<size_t>(n); ++row) {
    const int64_t zeros = static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
    for (int64_t j = n - zeros; j < n; ++j)
      t.data[row * static_cast<size_t>(n) + static_cast<size_t>(j)] = 0.0f;
  }
  return t;
}

std::map<std::string, Tensor> randomInputs(const Graph& g, uint64_t seed) {
  std::map<std::string, Tensor> in;
  uint64_t k = 0;
  for (Vertex v : g.vertices()) {
    const Op& op = g.op(v);
    if (op.kind != OpKind::Input)
      continue;
    if (op.data) { // a weight with its values
      in[op.name] = Tensor{op.type, *op.data};
      continue;
    }
    // Weights (B operands of a gemm) get variance 1/K, as in Xavier/LeCun initialisation,
    // so activations keep their scale through stacked gemms and stay far from f16 overflow.
    double range = 1.0;
    for (Vertex u : g.users(v)) {
      auto ins = g.operands(u);
      if (g.op(u).kind == OpKind::Gemm && ins.size() == 2 && ins[1] == v && ins[0] != v) {
        const TensorDesc& a = g.op(ins[0]).type;
        if (a.rank() == 2)
          range = std::min(range, std::sqrt(3.0 / static_cast<double>(a.shape[1])));
      }
    }
    in[op.name] = op.mask ? randomMask(op.type, seed + 1000003 * ++k)
                          : randomTensor(op.type, seed + 1000003 * ++k, -range, range);
  }
  return in;
}

namespace {

/// A[m, k] * B in double (B is [k, n], or [n, k] when transB). Large products go to OpenBLAS
/// where the system has it (the inputs are f16 or f32 values, exact in double, so nothing is
/// rounded on the way); otherwise, and for small ones, row-parallel loops.
std::vector<double> product(const Tensor& a, const Tensor& b, bool transB, size_t m, size_t n,
                            size_t k) {
  std::vector<double> acc(m * n, 0.0);
  if (m * n * k >= (size_t{1} << 21)) {
    // B goes to double a panel at a time (a few MB reused, not a copy of a whole weight):
    // rows of B [k, n] accumulate into C; rows of B^T [n, k] fill columns of C.
    const std::vector<double> da(a.data.begin(), a.data.begin() + static_cast<long>(m * k));
    const size_t width = transB ? k : n, total = transB ? n : k;
    const size_t step = std::max<size_t>(1, (size_t{1} << 21) / width);
    std::vector<double> panel(std::min(step, total) * width);
    bool ok = true;
    for (size_t r = 0; r < total && ok; r += step) {
      const size_t rows = std::min(step, total - r);
      std::copy(b.data.begin() + static_cast<long>(r * width),
                b.data.begin() + static_cast<long>((r + rows) * width), panel.begin());
      ok = transB ? blas::dgemmInto(true, m, rows, k, da.data(), k, panel.data(), k, acc.data() + r,
                                    n, 0.0)
                  : blas::dgemmInto(false, m, n, rows, da.data() + r, k, panel.data(), n,
                                    acc.data(), n, r == 0 ? 0.0 : 1.0);
    }
    if (ok)
      return acc;
    std::fill(acc.begin(), acc.end(), 0.0);
  }
  parallelRows(m, n * k, [&](size_t rowBegin, size_t rowEnd) {
    std::vector<double> arow(k);
    for (size_t i = rowBegin; i < rowEnd; ++i) {
      double* row = &acc[i * n];
      for (size_t p = 0; p < k; ++p)
        arow[p] = a.data[i * k + p];
      if (transB) {
        for (size_t j = 0; j < n; ++j) {
          const float* brow = &b.data[j * k];
          double s = 0;
          for (size_t p = 0; p < k; ++p)
            s += arow[p] * brow[p];
          row[j] = s;
        }
      } else {
        for (size_t p = 0; p < k; ++p) {
          const double av = arow[p];
          const float* brow = &b.data[p * n];
          for (size_t j = 0; j < n; ++j)
            row[j] += av * brow[j];
        }
      }
    }
  });
  return acc;
}

void gemm(const Tensor& a, const Tensor& b, bool transB, Tensor& c) {
  const size_t m = static_cast<size_t>(c.desc.shape[0]);
  const size_t n = static_cast<size_t>(c.desc.shape[1]);
  const size_t k = static_cast<size_t>(a.desc.shape[1]);
  const std::vector<double> acc = product(a, b, transB, m, n, k);
  parallelRows(m, n, [&](size_t rowBegin, size_t rowEnd) {
    for (size_t i = rowBegin * n; i < rowEnd * n; ++i)
      c.data[i] = store(acc[i], c.desc.dtype);
  });
}

void norm(const Tensor& x, const Tensor& gamma, const Tensor* beta, double eps, bool rms,
          Tensor& y) {
  const size_t m = static_cast<size_t>(x.desc.shape[0]);
  const size_t n = static_cast<size_t>(x.desc.shape[1]);
  for (size_t i = 0; i < m; ++i) {
    const float* row = &x.data[i * n];
    double mean = 0;
    if (!rms) {
      for (size_t j = 0; j < n; ++j)
        mean += row[j];
      mean /= static_cast<double>(n);
    }
    double var = 0;
    for (size_t j = 0; j < n; ++j)
      var += (row[j] - mean) * (row[j] - mean);
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (size_t j = 0; j < n; ++j) {
      double v = (row[j] - mean) * inv * gamma.data[j];
      if (beta)
        v += beta->data[j];
      y.data[i * n + j] = store(v, y.desc.dtype);
    }
  }
}

/// The element strides of `d` read as a tensor of `out`'s shape under NumPy broadcasting
/// (0 along the dimensions it broadcasts), one per dimension of `out`.
std::vector<int64_t> broadcastStrides(const TensorDesc& d, const TensorDesc& out) {
  std::vector<int64_t> st(out.shape.size(), 0);
  int64_t step = 1;
  for (size_t i = 0; i < d.shape.size(); ++i) {
    const size_t di = d.shape.size() - 1 - i, oi = out.shape.size() - 1 - i;
    st[oi] = d.shape[di] == 1 ? 0 : step;
    step *= d.shape[di];
  }
  return st;
}

/// The flat index into a broadcast operand of element `flat` of `out`.
int64_t broadcastIndex(int64_t flat, const std::vector<int64_t>& shape,
                       const std::vector<int64_t>& strides) {
  int64_t idx = 0;
  for (size_t i = shape.size(); i-- > 0;) {
    idx += (flat % shape[i]) * strides[i];
    flat /= shape[i];
  }
  return idx;
}

/// out = a op b with NumPy broadcasting, in double, rounded once.
void binary(OpKind k, const Tensor& a, const Tensor& b, Tensor& out) {
  const std::vector<int64_t> sa = broadcastStrides(a.desc, out.desc);
  const std::vector<int64_t> sb = broadcastStrides(b.desc, out.desc);
  const int64_t total = out.desc.numel();
  for (int64_t i = 0; i < total; ++i) {
    const double x = a.data[static_cast<size_t>(broadcastIndex(i, out.desc.shape, sa))];
    const double y = b.data[static_cast<size_t>(broadcastIndex(i, out.desc.shape, sb))];
    const double r = applyBinary(k, x, y);
    out.data[static_cast<size_t>(i)] = store(r, out.desc.dtype);
  }
}

/// x * cos + rotate(x) * sin in double, cos and sin broadcast to x; rotate takes each
/// last-dimension row (x1, x2) to (-x2, x1) (rotate_half), or each pair (x[2i], x[2i+1]) to
/// (-x[2i+1], x[2i]) (interleaved: GPT-J's rotate_every_two).
/// Rows of x seen as [lead, rows / lead] written transposed: row (i, j) to row (j, i).
void transposeRows(const Tensor& x, int64_t lead, Tensor& out) {
  const size_t w = static_cast<size_t>(x.desc.shape.back());
  const size_t a = static_cast<size_t>(lead), c = x.data.size() / w / a;
  for (size_t i = 0; i < a; ++i)
    for (size_t j = 0; j < c; ++j)
      std::copy_n(x.data.begin() + static_cast<long>((i * c + j) * w), w,
                  out.data.begin() + static_cast<long>((j * a + i) * w));
}

void rope(const Tensor& x, const Tensor& c, const Tensor& s, bool interleaved, Tensor& out) {
  const std::vector<int64_t> sc = broadcastStrides(c.desc, x.desc);
  const std::vector<int64_t> ss = broadcastStrides(s.desc, x.desc);
  const int64_t total = x.desc.numel(), d = x.desc.shape.back(), half = d / 2;
  for (int64_t i = 0; i < total; ++i) {
    const int64_t col = i % d;
    const int64_t other = interleaved  ? (col % 2 ? i - 1 : i + 1)
                          : col < half ? i + half
                                       : i - half;
    const bool negate = interleaved ? col % 2 == 0 : col < half;
    const double rot = (negate ? -1.0 : 1.0) * double(x.data[static_cast<size_t>(other)]);
    const double v = double(x.data[static_cast<size_t>(i)]) *
                         c.data[static_cast<size_t>(broadcastIndex(i, x.desc.shape, sc))] +
                     rot * s.data[static_cast<size_t>(broadcastIndex(i, x.desc.shape, ss))];
    out.data[static_cast<size_t>(i)] = store(v, out.desc.dtype);
  }
}

/// kv_append: each (batch, KV head)'s P cached rows, then its S new ones (token-major).
void kvAppend(const Op& op, const Tensor& cache, const Tensor& fresh, Tensor& out) {
  const KvAppendDims k = kvAppendDims(op, cache.desc.shape, out.desc.shape);
  const int64_t B = k.batch, H = k.kvHeads, P = k.past, d = k.headDim, S = k.fresh, L = P + S;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < L; ++j) {
        const float* src = j < P ? &cache.data[static_cast<size_t>(((b * H + h) * P + j) * d)]
                                 : &fresh.data[static_cast<size_t>(((b * S + j - P) * H + h) * d)];
        float* dst = &out.data[static_cast<size_t>(((b * H + h) * L + j) * d)];
        for (int64_t e = 0; e < d; ++e)
          dst[e] = store(src[e], out.desc.dtype);
      }
}

/// The sizes of an attention op from its operands' types (valid graphs only).
AttnShape attnShapeOf(const Op& op, const std::vector<const Tensor*>& ins) {
  std::vector<OperandInfo> infos;
  for (const Tensor* t : ins)
    infos.push_back({"", t->desc});
  std::string why;
  int bad = -1;
  auto s = attnShape(op, infos, why, bad);
  if (!s)
    throw ReferenceError(why);
  return *s;
}

/// Key or value j of batch b in KV head hk: token-major rows, or a cache [B, Hkv, Sk, d].
const float* kvRow(const AttnShape& s, const Tensor& t, int64_t b, int64_t j, int64_t hk) {
  const int64_t d = s.headDim;
  return &t.data[static_cast<size_t>(s.kvHeadMajor ? ((b * s.kvHeads + hk) * s.sk + j) * d
                                                   : (b * s.sk + j) * s.kvHeads * d + hk * d)];
}

/// Row r = (b, h, i) of the scores: query row b * Sq + i, head h, dotted in double with every
/// key row of batch b in KV head h / (H / Hkv), into dots[0, Sk).
void scoreRow(const AttnShape& s, const Tensor& q, const Tensor& k, int64_t r, double* dots) {
  const int64_t d = s.headDim, group = s.heads / s.kvHeads;
  const int64_t i = r % s.sq, h = r / s.sq % s.heads, b = r / s.sq / s.heads;
  const float* qr = &q.data[static_cast<size_t>((b * s.sq + i) * s.heads * d + h * d)];
  for (int64_t j = 0; j < s.sk; ++j) {
    const float* kr = kvRow(s, k, b, j, h / group);
    double acc = 0;
    for (int64_t c = 0; c < d; ++c)
      acc += double(qr[c]) * kr[c];
    dots[j] = acc;
  }
}

/// attn_qk: the scores of every row (b, h, i), rounded once.
void attnQk(const Op& op, const Tensor& q, const Tensor& k, Tensor& out) {
  const AttnShape s = attnShapeOf(op, {&q, &k});
  parallelRows(static_cast<size_t>(s.batch * s.heads * s.sq), static_cast<size_t>(s.sk * s.headDim),
               [&](size_t first, size_t last) {
                 std::vector<double> row(static_cast<size_t>(s.sk));
                 for (size_t r = first; r < last; ++r) {
                   scoreRow(s, q, k, static_cast<int64_t>(r), row.data());
                   for (size_t j = 0; j < row.size(); ++j)
                     out.data[r * row.size() + j] = store(row[j], out.desc.dtype);
                 }
               });
}

/// Row r = (b, h, i) of P times V's rows of batch b in KV head h / (H / Hkv), into the
/// token-major output row b * Sq + i, columns of head h; `p` is that row of Sk weights.
void accumulatePv(const AttnShape& s, int64_t r, const double* p, const Tensor& v,
                  std::vector<double>& acc) {
  const int64_t d = s.headDim, group = s.heads / s.kvHeads;
  const int64_t h = r / s.sq % s.heads, b = r / s.sq / s.heads;
  std::fill(acc.begin(), acc.end(), 0.0);
  for (int64_t j = 0; j < s.sk; ++j) {
    const float* vr = kvRow(s, v, b, j, h / group);
    for (int64_t c = 0; c < d; ++c)
      acc[static_cast<size_t>(c)] += p[j] * vr[c];
  }
}

void storeHeadRow(const AttnShape& s, int64_t r, const std::vector<double>& acc, Tensor& out) {
  const int64_t i = r % s.sq, h = r / s.sq % s.heads, b = r / s.sq / s.heads;
  float* o = &out.data[static_cast<size_t>((b * s.sq + i) * s.heads * s.headDim + h * s.headDim)];
  for (int64_t c = 0; c < s.headDim; ++c)
    o[c] = store(acc[static_cast<size_t>(c)], out.desc.dtype);
}

void attnPv(const Op& op, const Tensor& p, const Tensor& v, Tensor& out) {
  const AttnShape s = attnShapeOf(op, {&p, &v});
  parallelRows(static_cast<size_t>(s.batch * s.heads * s.sq), static_cast<size_t>(s.sk * s.headDim),
               [&](size_t first, size_t last) {
                 std::vector<double> row(static_cast<size_t>(s.sk));
                 std::vector<double> acc(static_cast<size_t>(s.headDim));
                 for (size_t r = first; r < last; ++r) {
                   for (int64_t j = 0; j < s.sk; ++j)
                     row[static_cast<size_t>(j)] =
                         p.data[r * static_cast<size_t>(s.sk) + static_cast<size_t>(j)];
                   accumulatePv(s, static_cast<int64_t>(r), row.data(), v, acc);
                   storeHeadRow(s, static_cast<int64_t>(r), acc, out);
                 }
               });
}

/// Row r = (b, h, i) of attention into `acc`: softmax(scale * q k^T + bias) v in double (the
/// exact softmax: the row's maximum subtracted; a row of -inf gives NaN, as the decomposition
/// it replaces). `row` holds Sk scratch values.
void attentionRow(const AttnShape& s, const std::vector<const Tensor*>& in,
                  const std::vector<int64_t>& scoreShape, const std::vector<int64_t>& bst,
                  int64_t r, std::vector<double>& row, std::vector<double>& acc) {
  const Tensor &q = *in[0], &k = *in[1], &v = *in[2], &bias = *in[3];
  const double scale = in[4]->data.at(0);
  scoreRow(s, q, k, r, row.data());
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < s.sk; ++j) {
    const int64_t flat = r * s.sk + j;
    double& x = row[static_cast<size_t>(j)];
    x = scale * x + bias.data[static_cast<size_t>(broadcastIndex(flat, scoreShape, bst))];
    mx = std::max(mx, x);
  }
  double sum = 0;
  for (double& x : row)
    sum += x = std::exp(x - mx);
  for (double& x : row)
    x /= sum;
  accumulatePv(s, r, row.data(), v, acc);
}

/// attention: every row (b, h, i), rounded once.
void attention(const Op& op, const std::vector<const Tensor*>& in, Tensor& out) {
  const AttnShape s = attnShapeOf(op, {in[0], in[1], in[2]});
  const TensorDesc scores{{s.batch, s.heads, s.sq, s.sk}, in[0]->desc.dtype};
  const std::vector<int64_t> bst = broadcastStrides(in[3]->desc, scores);
  parallelRows(static_cast<size_t>(s.batch * s.heads * s.sq),
               static_cast<size_t>(2 * s.sk * s.headDim), [&](size_t first, size_t last) {
                 std::vector<double> row(static_cast<size_t>(s.sk));
                 std::vector<double> acc(static_cast<size_t>(s.headDim));
                 for (size_t r = first; r < last; ++r) {
                   attentionRow(s, in, scores.shape, bst, static_cast<int64_t>(r), row, acc);
                   storeHeadRow(s, static_cast<int64_t>(r), acc, out);
                 }
               });
}

} // namespace

Tensor attentionRows(const Op& op, const std::vector<const Tensor*>& in,
                     const std::vector<int64_t>& rows) {
  if (in.size() != 5)
    throw ReferenceError("attention has 5 operands, not " + std::to_string(in.size()));
  const AttnShape s = attnShapeOf(op, {in[0], in[1], in[2]});
  const TensorDesc scores{{s.batch, s.heads, s.sq, s.sk}, in[0]->desc.dtype};
  const std::vector<int64_t> bst = broadcastStrides(in[3]->desc, scores);
  const int64_t width = s.heads * s.headDim;
  Tensor out{{{static_cast<int64_t>(rows.size()), width}, op.type.dtype},
             std::vector<float>(rows.size() * static_cast<size_t>(width))};
  std::vector<double> row(static_cast<size_t>(s.sk)), acc(static_cast<size_t>(s.headDim));
  for (size_t n = 0; n < rows.size(); ++n) {
    if (rows[n] < 0 || rows[n] >= s.batch * s.sq)
      throw ReferenceError("row " + std::to_string(rows[n]) + " of an attention of " +
                           std::to_string(s.batch * s.sq) + " query rows");
    const int64_t b = rows[n] / s.sq, i = rows[n] % s.sq;
    for (int64_t h = 0; h < s.heads; ++h) {
      attentionRow(s, in, scores.shape, bst, (b * s.heads + h) * s.sq + i, row, acc);
      for (int64_t c = 0; c < s.headDim; ++c)
        out.data[n * static_cast<size_t>(width) + static_cast<size_t>(h * s.headDim + c)] =
            store(acc[static_cast<size_t>(c)], out.desc.dtype);
    }
  }
  return out;
}

namespace {

/// A fused op's meaning, by kernel family: the main computation kept in double, then the
/// epilogue chain, then one rounding, as a fused kernel keeps its accumulator in registers.
/// norm_gemm rounds the normalised rows to the dtype first: that kernel feeds them to the
/// tensor cores in f16. The dual families compute a second GEMM on the same A (acc2).
void evalFused(const Op& op, const std::vector<Vertex>& ops, const std::vector<const Tensor*>& vals,
               const ActivationLibrary& acts, Tensor& out) {
  const auto& f = op.fused;
  auto in = [&](size_t i) -> const Tensor& {
    if (i >= ops.size())
      throw ReferenceError("fused op %" + op.name + " has no operand " + std::to_string(i));
    return *vals[ops[i]];
  };
  const KernelFamily* family = findFamily(f.family);
  if (!family)
    throw ReferenceError("the reference has no semantics for kernel family '" + f.family +
                         "' (fused op %" + op.name + ")");
  const size_t m = static_cast<size_t>(out.desc.shape[0]);
  const size_t n = static_cast<size_t>(out.desc.shape[1]);
  const size_t k = static_cast<size_t>(in(0).desc.shape[1]);
  std::vector<double> acc, acc2;
  family->accumulate(
      op, in, MainShape{static_cast<int64_t>(m), static_cast<int64_t>(n), static_cast<int64_t>(k)},
      acc, acc2);
  // The epilogue, node by node over each row, in double like the unfused ops it replaces
  // (without their intermediate roundings); a rope reads its column's partner in the row.
  const std::vector<EpilogueNode>& nodes = f.epilogue.nodes;
  std::vector<const ActivationFn*> fns(nodes.size(), nullptr);
  for (size_t e = 0; e < nodes.size(); ++e)
    if (nodes[e].kind == EpiKind::Activation && !(fns[e] = acts.find(nodes[e].fn)))
      throw ReferenceError("the reference has no activation '" + nodes[e].fn + "'");
  if (!nodes.empty())
    parallelRows(m, n * nodes.size() * 4, [&](size_t rowBegin, size_t rowEnd) {
      std::vector<double> val(nodes.size() * n);
      for (size_t i = rowBegin; i < rowEnd; ++i) {
        for (size_t x = 0; x < nodes.size(); ++x) {
          const EpilogueNode& e = nodes[x];
          double* v = &val[x * n];
          const double* l = e.lhs >= 0 ? &val[static_cast<size_t>(e.lhs) * n] : nullptr;
          const double* r = e.rhs >= 0 ? &val[static_cast<size_t>(e.rhs) * n] : nullptr;
          for (size_t j = 0; j < n; ++j)
            switch (e.kind) {
            case EpiKind::Acc:
              v[j] = e.operand == 1 ? acc2.at(i * n + j) : acc[i * n + j];
              break;
            case EpiKind::Operand: {
              const Tensor& t = in(static_cast<size_t>(e.operand));
              v[j] = t.desc.rank() == 1 ? t.data[j] : t.data[i * n + j];
              break;
            }
            case EpiKind::BiasAdd:
            case EpiKind::Add:
              v[j] = l[j] + r[j];
              break;
            case EpiKind::Mul:
              v[j] = l[j] * r[j];
              break;
            case EpiKind::Activation:
              v[j] = (*fns[x])(l[j], e.params);
              break;
            case EpiKind::Rope: {
              const auto b = static_cast<size_t>(e.params.at("begin"));
              const auto end = static_cast<size_t>(e.params.at("end"));
              if (j < b || j >= end) {
                v[j] = l[j];
                break;
              }
              const Tensor& cs = in(static_cast<size_t>(e.operand));
              const Tensor& sn = in(static_cast<size_t>(e.operand2));
              const auto rows = static_cast<size_t>(cs.desc.shape[0]);
              const auto d = static_cast<size_t>(cs.desc.shape[1]);
              const size_t head = e.params.count("head")
                                      ? static_cast<size_t>(e.params.at("head"))
                                      : d; // the first d columns of each head rotate
              const size_t jh = (j - b) % head;
              if (jh >= d) {
                v[j] = l[j];
                break;
              }
              const size_t t = (i % rows) * d + jh;
              // (x, y) -> (x c - y s, y c' + x s'), pairs of columns from begin on
              const double rot = jh % 2 == 0 ? -l[j + 1] : l[j - 1];
              v[j] = l[j] * cs.data[t] + rot * sn.data[t];
              break;
            }
            }
        }
        for (size_t j = 0; j < n; ++j)
          acc[i * n + j] = val[(nodes.size() - 1) * n + j];
      }
    });
  for (size_t i = 0; i < acc.size(); ++i)
    out.data[i] = store(acc[i], out.desc.dtype);
}

} // namespace

std::vector<Tensor> evaluate(const Graph& g, const std::map<std::string, Tensor>& inputs,
                             const ActivationLibrary& acts, const EvalProgress& progress,
                             const std::map<std::string, Tensor>* overrides) {
  auto order = topologicalOrder(g);
  if (!order)
    throw ReferenceError("graph " + g.name() + " has a cycle");
  std::vector<Tensor> vals(g.size());
  // Where each value is: inputs stay in the caller's maps (weights are hundreds of MB), only
  // graph outputs among them are copied into the result.
  std::vector<const Tensor*> at(g.size(), nullptr);
  for (Vertex v : *order) {
    const auto t0 = std::chrono::steady_clock::now();
    const Op& op = g.op(v);
    std::vector<Vertex> ops = g.operands(v);
    auto in = [&](size_t i) -> const Tensor& { return *at[ops.at(i)]; };
    if (op.kind == OpKind::Input) {
      auto it = overrides ? overrides->find(op.name) : inputs.end();
      if (!overrides || it == overrides->end())
        it = inputs.find(op.name);
      if (it == inputs.end())
        throw ReferenceError("no value given for input %" + op.name);
      if (it->second.desc != op.type ||
          it->second.data.size() != static_cast<size_t>(op.type.numel()))
        throw ReferenceError("input %" + op.name + " is " + it->second.desc.str() + "; expected " +
                             op.type.str());
      at[v] = &it->second;
      if (g.isOutput(v))
        vals[v] = it->second;
      continue;
    }
    Tensor out{op.type, std::vector<float>(static_cast<size_t>(op.type.numel()))};
    const DType dt = op.type.dtype;
    switch (op.kind) {
    case OpKind::Input:
      break;
    case OpKind::Gemm:
      gemm(in(0), in(1), op.transposeB, out);
      break;
    case OpKind::BiasAdd: {
      const size_t n = static_cast<size_t>(op.type.shape[1]);
      for (size_t i = 0; i < out.data.size(); ++i)
        out.data[i] = store(double(in(0).data[i]) + double(in(1).data[i % n]), dt);
      break;
    }
    case OpKind::Activation: {
      const ActivationFn* fn = acts.find(op.fn);
      if (!fn)
        throw ReferenceError("the reference has no activation '" + op.fn + "'");
      for (size_t i = 0; i < out.data.size(); ++i)
        out.data[i] = store((*fn)(in(0).data[i], op.params), dt);
      break;
    }
    case OpKind::Add:
    case OpKind::Mul:
    case OpKind::Sub:
    case OpKind::Div:
    case OpKind::Pow:
    case OpKind::Max:
    case OpKind::Min:
      binary(op.kind, in(0), in(1), out);
      break;
    case OpKind::Constant:
      std::fill(out.data.begin(), out.data.end(), store(op.value, dt));
      break;
    case OpKind::ReduceMean: {
      const size_t n = static_cast<size_t>(in(0).desc.shape.back());
      for (size_t r = 0; r < out.data.size(); ++r) {
        double s = 0;
        for (size_t j = 0; j < n; ++j)
          s += in(0).data[r * n + j];
        out.data[r] = store(s / static_cast<double>(n), dt);
      }
      break;
    }
    case OpKind::Softmax: {
      // In double, the row's maximum subtracted first (a row of -inf gives NaN, as in torch).
      const size_t n = static_cast<size_t>(in(0).desc.shape.back());
      std::vector<double> e(n);
      for (size_t r = 0; n > 0 && r < out.data.size() / n; ++r) {
        const float* x = in(0).data.data() + r * n;
        const double mx = *std::max_element(x, x + n);
        double s = 0;
        for (size_t j = 0; j < n; ++j)
          s += e[j] = std::exp(static_cast<double>(x[j]) - mx);
        for (size_t j = 0; j < n; ++j)
          out.data[r * n + j] = store(e[j] / s, dt);
      }
      break;
    }
    case OpKind::Slice: {
      const size_t n = static_cast<size_t>(in(0).desc.shape.back());
      const size_t w = static_cast<size_t>(op.end - op.begin);
      for (size_t r = 0; r < out.data.size() / w; ++r)
        std::copy_n(in(0).data.begin() + static_cast<long>(r * n + static_cast<size_t>(op.begin)),
                    w, out.data.begin() + static_cast<long>(r * w));
      break;
    }
    case OpKind::Heads:
    case OpKind::MergeHeads: // the same elements in the same order
      out.data = in(0).data;
      for (float& x : out.data)
        x = store(x, dt);
      break;
    case OpKind::Concat: {
      const size_t wa = static_cast<size_t>(in(0).desc.shape.back());
      const size_t wb = static_cast<size_t>(in(1).desc.shape.back());
      for (size_t r = 0; r < out.data.size() / (wa + wb); ++r) {
        std::copy_n(in(0).data.begin() + static_cast<long>(r * wa), wa,
                    out.data.begin() + static_cast<long>(r * (wa + wb)));
        std::copy_n(in(1).data.begin() + static_cast<long>(r * wb), wb,
                    out.data.begin() + static_cast<long>(r * (wa + wb) + wa));
      }
      break;
    }
    case OpKind::BatchFirst: // [S, B] rows to [B, S]
      transposeRows(in(0), in(0).desc.shape[0] / op.batch, out);
      break;
    case OpKind::SeqFirst: // [B, S] rows to [S, B]
      transposeRows(in(0), op.batch, out);
      break;
    case OpKind::Rope:
      rope(in(0), in(1), in(2), op.interleaved, out);
      break;
    case OpKind::KvAppend:
      kvAppend(op, in(0), in(1), out);
      break;
    case OpKind::AttnQk:
      attnQk(op, in(0), in(1), out);
      break;
    case OpKind::AttnPv:
      attnPv(op, in(0), in(1), out);
      break;
    case OpKind::Attention:
      attention(op, {&in(0), &in(1), &in(2), &in(3), &in(4)}, out);
      break;
    case OpKind::LayerNorm:
      norm(in(0), in(1), &in(2), op.eps, /*rms=*/false, out);
      break;
    case OpKind::RmsNorm:
      norm(in(0), in(1), nullptr, op.eps, /*rms=*/true, out);
      break;
    case OpKind::Fused:
      evalFused(op, ops, at, acts, out);
      break;
    }
    vals[v] = std::move(out);
    at[v] = &vals[v];
    if (progress)
      progress(v, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return vals;
}

TensorStats stats(const Tensor& t) {
  TensorStats s;
  s.min = std::numeric_limits<double>::infinity();
  s.max = -s.min;
  double sum = 0, sq = 0;
  size_t n = 0;
  for (float x : t.data) {
    if (!std::isfinite(x)) {
      ++s.nonFinite;
      continue;
    }
    s.min = std::min(s.min, double(x));
    s.max = std::max(s.max, double(x));
    sum += x;
    sq += double(x) * x;
    ++n;
  }
  if (n) {
    s.mean = sum / static_cast<double>(n);
    s.rms = std::sqrt(sq / static_cast<double>(n));
  } else {
    s.min = s.max = 0;
  }
  return s;
}

namespace detail {

std::vector<double> gemmProduct(const Tensor& a, const Tensor& b, bool transB, size_t m, size_t n,
                                size_t k) {
  return product(a, b, transB, m, n, k);
}

void normRows(const Tensor& x, const Tensor& gamma, const Tensor* beta, double eps, bool rms,
              Tensor& y) {
  norm(x, gamma, beta, eps, rms, y);
}

} // namespace detail

} // namespace fpat::ir
