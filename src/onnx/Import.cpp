#include "fpat/onnx/Import.h"

#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <onnx/onnx.pb.h>
#include <set>
#include <sys/mman.h>
#include <sys/stat.h>
#include <tuple>
#include <unistd.h>

namespace fpat::onnx {

namespace {

using ::onnx::AttributeProto;
using ::onnx::NodeProto;
using ::onnx::TensorProto;

constexpr int64_t kMaxElements = int64_t{1} << 40; // the text form's limit, too

/// A value while importing: its ONNX shape, and either a vertex of the IR graph or (for
/// initializers and Constant outputs not yet used as tensors) its data.
struct Val {
  std::vector<int64_t> shape;
  std::optional<ir::Vertex> v;
  bool isConst = false;
  std::vector<double> data; // isConst: integer tensors and attribute values, row-major
  std::shared_ptr<std::vector<float>> fdata; // isConst: float tensors (weights), row-major
  bool integer = false;                      // isConst: an integer tensor (shapes, axes)
  // isConst: every element is data[0] (a large ConstantOfShape: torch.empty's values that
  // baddbmm multiplies by 0), kept as one value through Add, Sub, Mul and Div; any other op
  // gets it expanded (expandUniform).
  bool uniform = false;
  std::string name;         // ONNX name
  std::string transposedOf; // the transpose of this (non-constant) value: MatMul's B only
  // A run-time integer or bool input (or a move of it, or a comparison with 0 or 1), imported
  // as a float mask of 0s and 1s: only moved, expanded, compared, negated or cast until a Cast
  // to float makes it data or a Where picks with it.
  bool intInput = false;
  // An Expand of such a mask, left unexpanded: `shape` is still the mask's own (also once
  // cast to float), and only elementwise ops, which broadcast it, may use it.
  bool lazyExpand = false;
  // A float value of only 0s and 1s made from a mask (cast to float, 1 - it): cast back to an
  // integer or bool type it is a mask again.
  bool binary01 = false;
  std::vector<int64_t> expandedTo; // lazyExpand: the shape the model sees
  // A head view: `v` is a token-major activation [B*S, Hkv*d] that the model sees, through
  // Reshape and Transpose, as [B, S, H, d] (Tokens), [B, H, S, d] (Heads) or [B, H, d, S]
  // (HeadsT, keys transposed for Q K^T); `shape` is that ONNX shape. H = Hkv * repeat where
  // repeat_kv (Unsqueeze, Expand, Reshape) shared each stored head among `repeat` heads;
  // Repeat5 is its middle, [B, Hkv, repeat, S, d].
  // Dense4: `v` is a rank-4 IR tensor [B, S, H, d] in token order (the `heads` op of the
  // token-major activation) that the model sees in `order` (Tokens or Heads): what elementwise
  // ops, slices and concatenations on heads (RoPE) compute on. d is its last dimension.
  enum class View : uint8_t { None, Tokens, Heads, HeadsT, Repeat5, Dense4 };
  View view = View::None;
  View order = View::None; // Dense4: the ONNX order of `shape`
  int64_t batch = 0, seq = 0, heads = 0, headDim = 0, repeat = 1;
  // Heads or HeadsT with batch and heads merged into one leading dimension: [B*H, S, d] or
  // [B*H, d, S] (torch.bmm's form: OPT, BART, Whisper). The same elements as the 4-D view.
  bool flatBH = false;
  // An activation token-major in the IR ([B*S, E], rows in batch, then sequence order) that
  // the model sees sequence-first, [S, B, E] or [S*B, E] (nn.MultiheadAttention's batch_first
  // transposes): row-wise ops only (convert checks). A Tokens view of it: [S, B*H, d].
  bool seqFirst = false;
  // A value the model sees in torch.bmm's form, [B*H, 1, Sk], of a rank-4 IR tensor [B, 1, 1,
  // Sk] broadcast over the H heads (nn.MultiheadAttention's key_padding_mask, expanded to the
  // heads and reshaped): H. Moved, cast, scaled by scalars and added to scores of that form
  // only.
  int64_t bmmHeads = 0;
  // Tokens with the sequence and heads merged: [B, S*H, d] (GPTBigCode's multi-query query,
  // each token's heads as rows of their own). The same elements as [B, S, H, d].
  bool flatSH = false;
  // Scores [B, H, Sq, Sk] in the IR that the model sees query-major, as [B, Sq, H, Sk] or
  // [B, Sq*H, Sk] (GPTBigCode's Q K^T of such a query): elementwise ops with constants (put in
  // the IR's order), masks, softmax, reshapes between the two forms and P V only.
  bool queryMajor = false;
  // Tokens whose ONNX shape is [B, S, H, parts, d] (BLOOM's fused q, k, v heads): the
  // projection's columns were reordered to (part, head, d) when it was viewed so, `heads` is
  // parts * H and part p is heads p H .. (p + 1) H - 1. Only a Gather of one part uses it.
  int64_t parts = 1;
  // The other form of a head value, once made: a Tokens or Heads view's Dense4 vertex; a
  // Dense4 value's token-major vertex (merge_heads).
  std::optional<ir::Vertex> other;
  // A value computed from one run-time mask of 0s and 1s and constants alone (transformers >=
  // 4.38 builds its attention mask so: the causal constant plus the padding mask compared with
  // 0, And-ed, filled by Where, scattered into a constant): held as constants of `shape`, `lo`
  // where the mask is 0 and `hi` where it is 1, and `at`, the element of the mask each element
  // reads (-1: none). Ops on such values and constants fold on all three; any other use makes
  // it a tensor of the mask (materialize).
  struct OfMask {
    std::string mask; // the mask's value (an integer input, moved, or one cast to float)
    std::shared_ptr<const Val> lo, hi, at;
  };
  std::shared_ptr<const OfMask> ofMask;
  // A tensor materialize made of a value of a mask: that value, so that it can be made again in
  // another order (query-major scores: permuted to the IR's [B, H, Sq, Sk]).
  std::shared_ptr<const OfMask> madeFrom;
  // A key or value cache with the new tokens' appended (Concat of a graph input [B, Hkv, P, d]
  // and heads along the sequence axis): a Heads, HeadsT or Repeat5 view whose `v` is the
  // kv_append op's head-major [B, Hkv, P+S, d] itself, not a token-major activation. Moved
  // (Transpose, repeat_kv), read by attention's products, given as an output: nothing else.
  bool headMajor = false;
  // Every other element of a head value's last axis (x[..., p::2]), maybe negated, maybe with a
  // trailing axis of 1 (stacked), then two such joined along it (joined: `v` holds the result,
  // `shape` is [..., d / 2, 2]): GPT-J's rotate_every_two, stack(-x[..., 1::2], x[..., ::2],
  // -1).flatten(-2), in the making. `of` names x; no other op may read it.
  struct EveryOther {
    std::string of;
    int parity = 0;
    bool negated = false, stacked = false, joined = false;
  };
  std::optional<EveryOther> everyOther;
};

struct UnsupportedError {
  std::string message;
};

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s)
    n *= d;
  return n;
}

/// Steps `idx` to the next index of `shape`, row-major (past the last: all zero).
void nextIndex(std::vector<int64_t>& idx, const std::vector<int64_t>& shape) {
  for (size_t k = idx.size(); k-- > 0;)
    if (++idx[k] < shape[k])
      return;
    else
      idx[k] = 0;
}

/// Element i and the element count of a constant, wherever it is held.
double at(const Val& v, size_t i) {
  return v.data.empty() && v.fdata ? static_cast<double>((*v.fdata)[i]) : v.data[i];
}
size_t count(const Val& v) {
  return v.data.empty() && v.fdata ? v.fdata->size() : v.data.size();
}

std::string shapeStr(const std::vector<int64_t>& s) {
  std::string o = "[";
  for (size_t i = 0; i < s.size(); ++i)
    o += (i ? ", " : "") + std::to_string(s[i]);
  return o + "]";
}

/// The IR shape of an ONNX shape: leading dimensions folded into rows, except in rank 4,
/// which the IR has for attention's scores and masks ([B, H, Sq, Sk]).
std::vector<int64_t> flatten(const std::vector<int64_t>& s) {
  if (s.size() <= 2 || s.size() == 4)
    return s;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i)
    rows *= s[i];
  return {rows, s.back()};
}

std::string sanitize(const std::string& onnxName) {
  std::string o;
  for (char c : onnxName) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    o += c == '/' ? '.' : ok ? c : '_';
  }
  while (!o.empty() && o.front() == '.')
    o.erase(o.begin());
  return o.empty() ? "v" : o;
}

std::string dataTypeName(int t) {
  switch (t) {
  case TensorProto::FLOAT:
    return "float";
  case TensorProto::FLOAT16:
    return "float16";
  case TensorProto::BFLOAT16:
    return "bfloat16";
  case TensorProto::DOUBLE:
    return "double";
  case TensorProto::INT64:
    return "int64";
  case TensorProto::INT32:
    return "int32";
  case TensorProto::BOOL:
    return "bool";
  case TensorProto::STRING:
    return "string";
  case TensorProto::INT8:
    return "int8";
  case TensorProto::UINT8:
    return "uint8";
  case TensorProto::INT16:
    return "int16";
  case TensorProto::UINT16:
    return "uint16";
  case TensorProto::UINT32:
    return "uint32";
  case TensorProto::UINT64:
    return "uint64";
  case TensorProto::COMPLEX64:
    return "complex64";
  case TensorProto::COMPLEX128:
    return "complex128";
  default: // float8 kinds and what later versions of ONNX add
    return "number " + std::to_string(t) + " (TensorProto.DataType)";
  }
}

bool isFloatType(int t) {
  return t == TensorProto::FLOAT || t == TensorProto::FLOAT16 || t == TensorProto::DOUBLE ||
         t == TensorProto::BFLOAT16;
}

/// A model's external data files (ONNX's data_location = EXTERNAL: the weights of models over
/// protobuf's 2 GB), each mapped into memory once, read where a tensor's entry says.
class ExternalData {
public:
  explicit ExternalData(std::string dir) : dir_(std::move(dir)) {}
  ExternalData(const ExternalData&) = delete;
  ExternalData& operator=(const ExternalData&) = delete;
  ~ExternalData() {
    for (auto& [name, f] : files_)
      if (f.data)
        munmap(f.data, f.size);
  }

  /// The `bytes` bytes of tensor `t`'s external data, or an error message.
  std::string read(const TensorProto& t, size_t bytes, const char*& out) {
    std::string location;
    double offset = 0, length = -1;
    for (const auto& e : t.external_data()) {
      if (e.key() == "location")
        location = e.value();
      else if (e.key() == "offset" || e.key() == "length") {
        char* end = nullptr;
        const double v = std::strtod(e.value().c_str(), &end);
        if (e.value().empty() || *end || !(v >= 0 && v < 9.0e18))
          return "its external data's " + e.key() + " '" + e.value() + "' is not a byte count";
        (e.key() == "offset" ? offset : length) = v;
      }
    }
    if (location.empty())
      return "its data is stored outside the model file, but no location says where";
    const std::filesystem::path rel(location);
    if (rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const auto& part) { return part == ".."; }))
      return "its external data file '" + location +
             "' is not a path inside the model's folder (absolute, or through '..')";
    if (dir_.empty())
      return "its data is stored outside the model file ('" + location +
             "'), which needs the model's folder: give the model as a file, not on standard "
             "input";
    if (length >= 0 && static_cast<size_t>(length) != bytes)
      return "its external data is " + std::to_string(static_cast<size_t>(length)) +
             " bytes long; " + std::to_string(bytes) + " are needed";
    auto [it, fresh] = files_.try_emplace(location);
    Mapped& f = it->second;
    if (fresh)
      f = map((std::filesystem::path(dir_) / rel).string());
    if (!f.error.empty())
      return "its external data file '" + location + "' " + f.error;
    const auto off = static_cast<size_t>(offset);
    if (off > f.size || f.size - off < bytes)
      return "its external data file '" + location + "' holds " + std::to_string(f.size) +
             " bytes; the tensor needs bytes " + std::to_string(off) + " to " +
             std::to_string(off + bytes);
    out = static_cast<const char*>(f.data) + off;
    return "";
  }

private:
  struct Mapped {
    void* data = nullptr;
    size_t size = 0;
    std::string error;
  };
  static Mapped map(const std::string& path) {
    Mapped m;
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      m.error = std::string("cannot be opened: ") + std::strerror(errno);
      return m;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      m.error = "is not a regular file";
    } else if (st.st_size > 0) {
      m.size = static_cast<size_t>(st.st_size);
      m.data = mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m.data == MAP_FAILED) {
        m.data = nullptr;
        m.size = 0;
        m.error = std::string("cannot be mapped: ") + std::strerror(errno);
      }
    }
    close(fd);
    return m;
  }
  std::string dir_;
  std::map<std::string, Mapped> files_;
};

/// The values of a TensorProto, or an error message. External data is read through `ext`
/// (none: an error).
std::string decodeTensor(const TensorProto& t, Val& out, ExternalData* ext = nullptr) {
  out.shape.clear();
  for (int64_t d : t.dims()) {
    if (d < 0 || d > kMaxElements)
      return "dimension " + std::to_string(d) + " is out of range";
    out.shape.push_back(d);
    if (numel(out.shape) > kMaxElements)
      return "more than 2^40 elements";
  }
  const bool external = t.data_location() == TensorProto::EXTERNAL;
  if (external && !ext)
    return "its data is stored outside the model file (external data), which is read only "
           "for the initializers of a model given as a file";
  const int64_t n = numel(out.shape);
  const int type = t.data_type();
  out.isConst = true;
  out.integer =
      type == TensorProto::INT64 || type == TensorProto::INT32 || type == TensorProto::BOOL;
  size_t elemSize = 0;
  switch (type) {
  case TensorProto::BOOL: // masks: integers 0 and 1, folded at import
    elemSize = 1;
    break;
  case TensorProto::FLOAT:
  case TensorProto::INT32:
    elemSize = 4;
    break;
  case TensorProto::FLOAT16:
  case TensorProto::BFLOAT16:
    elemSize = 2;
    break;
  case TensorProto::DOUBLE:
  case TensorProto::INT64:
    elemSize = 8;
    break;
  default:
    return std::string("its element type is ") + dataTypeName(type) +
           "; fpat imports float, float16, bfloat16, double, int32, int64 and bool tensors";
  }
  // Integers (shapes, axes) as doubles; floats, however large, as f32 once (weights are
  // hundreds of MB: no wider or second copy).
  std::vector<double>* ints = nullptr;
  float* floats = nullptr;
  if (out.integer) {
    out.data.assign(static_cast<size_t>(n), 0.0);
    ints = &out.data;
  } else {
    out.fdata = std::make_shared<std::vector<float>>();
    out.fdata->reserve(static_cast<size_t>(n));
    adviseHugePages(out.fdata->data(), static_cast<size_t>(n) * sizeof(float));
  }
  auto sized = [&] { // the element-by-element paths write into a sized vector
    if (out.fdata && out.fdata->size() != static_cast<size_t>(n)) {
      out.fdata->resize(static_cast<size_t>(n));
      floats = out.fdata->data();
    }
  };
  auto put = [&](size_t i, double v) {
    if (ints)
      (*ints)[i] = v;
    else
      floats[i] = static_cast<float>(v);
  };
  auto fromHalfBits = [&](uint16_t h) -> double {
    if (type == TensorProto::FLOAT16)
      return ir::halfBitsToFloat(h);
    return ir::bf16BitsToFloat(h);
  };
  if (t.has_raw_data() || external) {
    const size_t bytes = static_cast<size_t>(n) * elemSize;
    const char* raw = nullptr;
    if (external) {
      if (std::string why = ext->read(t, bytes, raw); !why.empty())
        return why;
    } else if (t.raw_data().size() != bytes) {
      return "it holds " + std::to_string(t.raw_data().size()) + " bytes; " + dataTypeName(type) +
             shapeStr(out.shape) + " needs " + std::to_string(bytes);
    } else {
      raw = t.raw_data().data();
    }
    if (type == TensorProto::FLOAT) { // the common case: copied as it is, no zero fill first
      const auto* f = reinterpret_cast<const float*>(raw);
      out.fdata->insert(out.fdata->end(), f, f + n);
      return "";
    }
    sized();
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const char* p = raw + i * elemSize;
      switch (type) {
      case TensorProto::BOOL:
        put(i, *p != 0 ? 1.0 : 0.0);
        break;
      case TensorProto::INT32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        put(i, x);
        break;
      }
      case TensorProto::FLOAT16:
      case TensorProto::BFLOAT16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        put(i, fromHalfBits(h));
        break;
      }
      case TensorProto::DOUBLE: {
        double d;
        std::memcpy(&d, p, 8);
        put(i, d);
        break;
      }
      default: {
        int64_t x;
        std::memcpy(&x, p, 8);
        put(i, static_cast<double>(x));
        break;
      }
      }
    }
    return "";
  }
  // Typed fields.
  sized();
  auto fill = [&](const auto& field, const char* what) -> std::string {
    if (static_cast<int64_t>(field.size()) != n)
      return "it holds " + std::to_string(field.size()) + " values in " + what + "; " +
             shapeStr(out.shape) + " needs " + std::to_string(n);
    for (int64_t i = 0; i < n; ++i)
      put(static_cast<size_t>(i), static_cast<double>(field.Get(static_cast<int>(i))));
    return "";
  };
  switch (type) {
  case TensorProto::FLOAT:
    return fill(t.float_data(), "float_data");
  case TensorProto::DOUBLE:
    return fill(t.double_data(), "double_data");
  case TensorProto::INT64:
    return fill(t.int64_data(), "int64_data");
  case TensorProto::INT32:
  case TensorProto::BOOL: // bools in int32_data too
    return fill(t.int32_data(), "int32_data");
  default: { // float16 / bfloat16 bits in int32_data
    if (static_cast<int64_t>(t.int32_data_size()) != n)
      return "it holds " + std::to_string(t.int32_data_size()) + " values in int32_data; " +
             shapeStr(out.shape) + " needs " + std::to_string(n);
    for (int64_t i = 0; i < n; ++i)
      put(static_cast<size_t>(i),
          fromHalfBits(static_cast<uint16_t>(t.int32_data(static_cast<int>(i)))));
    return "";
  }
  }
}

class Importer {
public:
  /// The op types a converter exists for, in name order.
  static std::vector<std::string> opTypes() {
    std::vector<std::string> out;
    for (const auto& entry : converters())
      out.push_back(entry.first);
    return out;
  }

  /// `seqFirst`: graph inputs [S, B, E] to take sequence-first (found by an earlier run).
  Importer(const ImportOptions& o, const ir::ActivationSet& acts, ImportResult& r,
           const std::set<std::string>& seqFirst)
      : opts_(o), acts_(acts), r_(r), external_(o.modelDir), seqFirstIn_(seqFirst) {}

  /// Graph inputs that this run found the model reads sequence-first: its attention takes their
  /// axis 1 as the batch (a rerun taking them so may import the model).
  const std::set<std::string>& seqFirstFound() const { return seqFirstFound_; }

  void run(const ::onnx::ModelProto& m) {
    for (const auto& os : m.opset_import())
      if (os.domain().empty() || os.domain() == "ai.onnx")
        r_.opset = os.version();
    if (!m.has_graph() || (m.graph().node_size() == 0 && m.graph().output_size() == 0)) {
      problem("", "", "the file holds no graph (is it an ONNX model?)");
      return;
    }
    const ::onnx::GraphProto& g = m.graph();
    g_.setName(sanitize(g.name().empty() ? "model" : g.name()));
    dtype_ = modelType(g);
    r_.storedAs = dtype_.value_or(ir::DType::F32);
    if (opts_.precision)
      dtype_ = opts_.precision;
    if (!dtype_)
      dtype_ = ir::DType::F32;
    // Initializers first: graph inputs of the same name (older exporters list them as both)
    // take the initializer's value.
    for (const TensorProto& t : g.initializer()) {
      Val v;
      v.name = t.name();
      if (std::string why = decodeTensor(t, v, &external_); !why.empty()) {
        problem("", "", "initializer '" + t.name() + "': " + why);
        continue;
      }
      if (t.name().empty() || vals_.count(t.name())) {
        problem("", "",
                "initializer '" + t.name() + "' is " +
                    (t.name().empty() ? "unnamed" : "defined twice"));
        continue;
      }
      vals_[t.name()] = std::move(v);
    }
    for (const auto& in : g.input()) {
      if (vals_.count(in.name()))
        continue;
      input(in);
    }
    if (!r_.problems.empty()) {
      reportUnsupported(g);
      return;
    }
    nodes(g);
    if (!r_.problems.empty())
      return;
    for (const auto& out : g.output()) {
      auto it = vals_.find(out.name());
      if (it == vals_.end()) {
        problem("", "", "graph output '" + out.name() + "' is not computed by any node");
        continue;
      }
      try {
        if (it->second.everyOther)
          throw UnsupportedError{everyOtherRefusal(it->second)};
        if (it->second.ofMask) {
          NodeProto out0;
          out0.set_name(out.name());
          materialize(it->second, out0);
        }
        ir::Vertex v = tensor(it->second);
        if (it->second.seqFirst && it->second.shape.size() == 3 && it->second.shape[0] > 1 &&
            it->second.shape[1] > 1) {
          // [S, B, E] as the model gives it: rows (s, b) from the IR's (b, s). The output's
          // name goes to the op that computes it in the model's order.
          if (g_.op(v).name == out.name())
            g_.op(v).name = uniqueName(out.name() + ".batch_first");
          ir::Op t;
          t.kind = ir::OpKind::SeqFirst;
          t.name = uniqueName(out.name() + ".seq_first");
          t.batch = it->second.shape[1];
          t.type = g_.op(v).type;
          t.origin = "graph output '" + out.name() + "', sequence-first";
          v = g_.addOp(std::move(t), {v});
        } else if (it->second.seqFirst && it->second.shape.size() != 3) {
          throw UnsupportedError{"it is sequence-first with its rows flattened (" +
                                 shapeStr(it->second.shape) +
                                 "); fpat gives sequence-first outputs as [S, B, E]"};
        }
        if (g_.isOutput(v)) {
          problem("", "", "graph output '" + out.name() + "' is listed twice");
          continue;
        }
        g_.addOutput(v);
        // An output that is a view of an op's result (MultiheadAttention's y, the projection
        // transposed back to batch-first) is named as the model names it, where it can be.
        if (g_.op(v).name != out.name() && g_.op(v).kind != ir::OpKind::Input &&
            !g_.find(out.name()))
          g_.op(v).name = out.name();
        if (g_.op(v).name != out.name())
          r_.sourceNames[g_.op(v).name] = out.name();
        if (it->second.shape.size() > 2)
          r_.notes.push_back("output '" + out.name() + "' " + shapeStr(it->second.shape) +
                             " is computed as " + g_.op(v).type.shapeStr() +
                             " (leading dimensions folded into rows; same memory layout)");
      } catch (const UnsupportedError& e) {
        problem("", "", "graph output '" + out.name() + "': " + e.message);
      }
    }
    if (g_.outputs().empty() && r_.problems.empty())
      problem("", "", "the graph has no outputs");
    if (!r_.problems.empty())
      return;
    auto problems = ir::validate(g_, acts_);
    for (const std::string& p : problems)
      problem("", "", "the imported graph is invalid: " + p);
    if (problems.empty())
      r_.graph = std::move(g_);
  }

private:
  void problem(const std::string& node, const std::string& op, std::string msg) {
    r_.problems.push_back({node, op, std::move(msg)});
  }

  /// The element type of the model's float inputs and initializers, if they agree.
  std::optional<ir::DType> modelType(const ::onnx::GraphProto& g) {
    std::optional<ir::DType> t;
    auto see = [&](int type) {
      if (type == TensorProto::FLOAT16)
        t = t.value_or(ir::DType::F16);
      else if (type == TensorProto::BFLOAT16)
        t = t.value_or(ir::DType::BF16);
      else if (type == TensorProto::FLOAT || type == TensorProto::DOUBLE)
        t = ir::DType::F32;
    };
    for (const auto& in : g.input())
      see(in.type().tensor_type().elem_type());
    for (const TensorProto& i : g.initializer())
      see(i.data_type());
    return t;
  }

  std::string uniqueName(const std::string& onnxName) {
    std::string base = sanitize(onnxName), n = base;
    for (int k = 1; used_.count(n); ++k)
      n = base + "." + std::to_string(k);
    used_.insert(n);
    return n;
  }

  void input(const ::onnx::ValueInfoProto& in) {
    const std::string where = "graph input '" + in.name() + "'";
    if (!in.type().has_tensor_type()) {
      problem("", "", where + " is not a tensor");
      return;
    }
    const auto& tt = in.type().tensor_type();
    // An integer or bool input runs as a float one of 0s and 1s: an attention mask, which the
    // model casts to float (exact in f16 and bf16). Token ids reach a Gather of embeddings,
    // which is refused there.
    const int et = tt.elem_type();
    const bool mask =
        et == TensorProto::INT64 || et == TensorProto::INT32 || et == TensorProto::BOOL;
    if (!isFloatType(et) && !mask) {
      problem("", "",
              where + " has element type " + dataTypeName(et) +
                  "; fpat runs float models, with integer or bool inputs as masks of 0s and 1s");
      return;
    }
    Val v;
    v.name = in.name();
    if (!tt.has_shape()) {
      problem("", "", where + " has no shape");
      return;
    }
    for (const auto& d : tt.shape().dim()) {
      if (d.has_dim_value() && d.dim_value() > 0 && d.dim_value() <= kMaxElements) {
        v.shape.push_back(d.dim_value());
        continue;
      }
      if (d.has_dim_param()) {
        auto it = opts_.dims.find(d.dim_param());
        if (it != opts_.dims.end()) {
          v.shape.push_back(it->second);
          continue;
        }
        problem("", "",
                where + " has the symbolic dimension '" + d.dim_param() +
                    "'; give its size, e.g. --dim " + d.dim_param() + "=128");
        return;
      }
      problem("", "", where + " has a dimension of unknown or invalid size");
      return;
    }
    if (v.shape.empty() || numel(v.shape) > kMaxElements) {
      problem("", "", where + " must have rank 1 or more and at most 2^40 elements");
      return;
    }
    ir::Op op;
    op.kind = ir::OpKind::Input;
    op.name = uniqueName(in.name());
    if (op.name != in.name())
      r_.sourceNames[op.name] = in.name();
    op.type = {flatten(v.shape), *dtype_};
    op.mask = mask;
    op.origin = "graph input '" + in.name() + "'";
    v.v = g_.addOp(std::move(op), {});
    v.intInput = mask;
    if (seqFirstIn_.count(in.name())) {
      // [S, B, E] in the caller's order, rows (s, b): the IR's activations are batch-first,
      // rows (b, s), which a batch_first op makes (no op where S or B is 1: the same rows).
      v.seqFirst = true;
      const int64_t seq = v.shape[0], batch = v.shape[1];
      if (seq > 1 && batch > 1) {
        ir::Op t;
        t.kind = ir::OpKind::BatchFirst;
        t.name = uniqueName(in.name() + ".batch_first");
        t.batch = batch;
        t.type = g_.op(*v.v).type;
        t.origin = "graph input '" + in.name() + "', taken sequence-first";
        v.v = g_.addOp(std::move(t), {*v.v});
      }
      r_.notes.push_back("graph input '" + in.name() + "' " + shapeStr(v.shape) +
                         " is sequence-first (the model takes axis 1 as the batch)" +
                         (seq > 1 && batch > 1 ? ": a batch_first op reorders its rows" : ""));
    }
    vals_[in.name()] = std::move(v);
  }

  /// The graph inputs whose rows reach `v` through ops that keep rows (row-wise ops, products
  /// with weights), as a sequence-first input would reach a head split: not through attention.
  std::set<std::string> rowSources(ir::Vertex v) const {
    std::set<std::string> found;
    std::set<ir::Vertex> seen;
    std::vector<ir::Vertex> todo{v};
    const ir::TensorDesc& t = g_.op(v).type;
    if (t.rank() != 2)
      return found;
    const int64_t rows = t.shape[0];
    while (!todo.empty()) {
      const ir::Vertex w = todo.back();
      todo.pop_back();
      if (!seen.insert(w).second)
        continue;
      const ir::Op& op = g_.op(w);
      if (op.type.rank() != 2 || op.type.shape[0] != rows)
        continue;
      if (op.kind == ir::OpKind::Input) {
        if (!op.weight && !op.mask)
          for (const auto& [name, val] : vals_)
            if (val.v == w && !val.seqFirst)
              found.insert(name);
        continue;
      }
      const bool rowWise = op.kind == ir::OpKind::Gemm || op.kind == ir::OpKind::BiasAdd ||
                           op.kind == ir::OpKind::LayerNorm || op.kind == ir::OpKind::RmsNorm ||
                           op.kind == ir::OpKind::Activation || op.kind == ir::OpKind::Slice ||
                           op.kind == ir::OpKind::Concat || ir::isBinaryElementwise(op.kind);
      if (!rowWise)
        continue;
      for (ir::Vertex o : g_.operands(w))
        todo.push_back(o);
    }
    return found;
  }

  /// The IR vertex of a value, materialising a constant: one element becomes a `constant`,
  /// anything larger a weight holding the values.
  ir::Vertex tensor(Val& v) {
    expandUniform(v);
    if (v.view == Val::View::Dense4 && v.order == Val::View::Tokens)
      return *v.v; // heads computed on in token order: the tensor [B, S, H, d] itself
    if (v.headMajor && v.view == Val::View::Heads && v.repeat == 1)
      return *v.v; // a cache [B, Hkv, S, d] (or, flat, [B*Hkv, S, d]): kv_append's result
    if (v.headMajor)
      throw UnsupportedError{cacheRefusal(v)};
    if (v.view != Val::View::None)
      throw UnsupportedError{"'" + v.name + "' " + shapeStr(v.shape) +
                             " is an activation split into heads, which fpat supports in "
                             "attention's products (MatMul), Transpose, Reshape, Cast, "
                             "elementwise ops with constants or other heads, and Slice and "
                             "Concat along the last axis or the heads' axis"};
    if (!v.transposedOf.empty())
      throw UnsupportedError{"'" + v.name +
                             "' is a transposed activation, supported only as MatMul's B"};
    if (v.queryMajor)
      throw UnsupportedError{"'" + v.name + "' " + shapeStr(v.shape) +
                             " are attention scores ordered by query, then head, which fpat "
                             "supports in elementwise ops with constants, Where as a mask, "
                             "Softmax, Reshape and the product with V"};
    if (v.v)
      return *v.v;
    if (v.integer)
      throw UnsupportedError{"'" + v.name + "' is an integer tensor, used as data"};
    ir::Op op;
    op.name = uniqueName(v.name);
    if (count(v) == 1) {
      op.kind = ir::OpKind::Constant;
      op.value = at(v, 0);
      op.type = {{}, *dtype_};
      op.origin = "constant '" + v.name + "'";
    } else {
      if (v.shape.empty() || count(v) == 0)
        throw UnsupportedError{"'" + v.name + "' is an empty tensor"};
      op.kind = ir::OpKind::Input;
      op.weight = true;
      op.type = {flatten(v.shape), *dtype_};
      if (v.fdata && *dtype_ == ir::DType::F32) {
        op.data = v.fdata; // shared, not copied
      } else {
        auto data = std::make_shared<std::vector<float>>(count(v));
        for (size_t i = 0; i < data->size(); ++i)
          (*data)[i] = ir::roundTo(at(v, i), *dtype_);
        op.data = std::move(data);
      }
      op.origin = "initializer '" + v.name + "'";
    }
    v.v = g_.addOp(std::move(op), {});
    return *v.v;
  }

  /// Nodes in an order where every input is defined first (ONNX asks exporters for one; a
  /// file that breaks it, or has a cycle, is reported).
  void nodes(const ::onnx::GraphProto& g) {
    const int n = g.node_size();
    std::map<std::string, int> producer;
    for (int i = 0; i < n; ++i)
      for (const std::string& o : g.node(i).output()) {
        if (o.empty())
          continue;
        if (vals_.count(o) || !producer.emplace(o, i).second) {
          problem(nodeName(g.node(i)), g.node(i).op_type(),
                  "output '" + o + "' is already defined by another node, input or initializer");
          return;
        }
      }
    std::vector<int> indeg(static_cast<size_t>(n), 0);
    std::vector<std::vector<int>> users(static_cast<size_t>(n));
    for (const auto& o : g.output())
      ++onnxUses_[o.name()];
    for (int i = 0; i < n; ++i)
      for (const std::string& in : g.node(i).input()) {
        ++onnxUses_[in];
        if (in.empty() || vals_.count(in))
          continue;
        auto it = producer.find(in);
        if (it == producer.end()) {
          problem(nodeName(g.node(i)), g.node(i).op_type(),
                  "input '" + in + "' is not produced by any node, graph input or initializer");
          continue;
        }
        ++indeg[static_cast<size_t>(i)];
        users[static_cast<size_t>(it->second)].push_back(i);
      }
    if (!r_.problems.empty())
      return;
    std::vector<int> ready, order;
    for (int i = 0; i < n; ++i)
      if (!indeg[static_cast<size_t>(i)])
        ready.push_back(i);
    while (!ready.empty()) {
      std::sort(ready.begin(), ready.end(), std::greater<>()); // file order among the ready
      const int i = ready.back();
      ready.pop_back();
      order.push_back(i);
      for (int u : users[static_cast<size_t>(i)])
        if (--indeg[static_cast<size_t>(u)] == 0)
          ready.push_back(u);
    }
    if (static_cast<int>(order.size()) != n) {
      std::string names;
      int shown = 0;
      for (int i = 0; i < n && shown < 4; ++i)
        if (indeg[static_cast<size_t>(i)]) {
          names += (shown++ ? ", '" : "'") + nodeName(g.node(i)) + "'";
        }
      problem("", "", "the graph has a cycle: nodes " + names + " depend on each other");
      return;
    }
    if (reportUnsupported(g))
      return;
    // The first node that cannot be converted stops the import: what follows reads its result.
    for (int i : order) {
      const NodeProto& node = g.node(i);
      try {
        convert(node);
      } catch (const UnsupportedError& e) {
        std::string why = e.message;
        for (const std::string& name : node.input()) { // an input a Slice emptied: which one
          const auto x = emptied_.find(name);
          const auto v = vals_.find(name);
          if (x != emptied_.end() && v != vals_.end() && numel(v->second.shape) == 0) {
            why += " ('" + name + "' has no elements: " + x->second + ")";
            break;
          }
        }
        problem(nodeName(node), node.op_type(), why);
        return;
      }
    }
  }

  /// Unsupported op types, reported once each with every node that has them, before anything
  /// is converted (and also where initializers or inputs already failed: a user learns every
  /// problem of the model in one run). Returns whether there were any.
  bool reportUnsupported(const ::onnx::GraphProto& g) {
    std::map<std::string, std::vector<std::string>> unsupported;
    for (const NodeProto& node : g.node()) {
      const std::string key = node.domain().empty() || node.domain() == "ai.onnx"
                                  ? node.op_type()
                                  : node.domain() + "." + node.op_type();
      if (!std::count(supportedOpTypes().begin(), supportedOpTypes().end(), key))
        unsupported[key].push_back(nodeName(node));
    }
    for (const auto& [op, names] : unsupported) {
      std::string list;
      for (size_t k = 0; k < names.size() && k < 5; ++k)
        list += (k ? ", '" : "'") + names[k] + "'";
      if (names.size() > 5)
        list += " and " + std::to_string(names.size() - 5) + " more";
      problem(names[0], op,
              "op type " + op + " is not supported (" + std::to_string(names.size()) + " node" +
                  (names.size() == 1 ? "" : "s") + ": " + list + ")");
    }
    return !unsupported.empty();
  }

  static std::string nodeName(const NodeProto& n) {
    if (!n.name().empty())
      return n.name();
    return n.output_size() ? n.output(0) : std::string("(unnamed)");
  }

  const AttributeProto* attr(const NodeProto& n, const std::string& name) {
    for (const AttributeProto& a : n.attribute())
      if (a.name() == name)
        return &a;
    return nullptr;
  }
  int64_t intAttr(const NodeProto& n, const std::string& name, int64_t dflt) {
    const AttributeProto* a = attr(n, name);
    return a ? a->i() : dflt;
  }
  double floatAttr(const NodeProto& n, const std::string& name, double dflt) {
    const AttributeProto* a = attr(n, name);
    return a ? a->f() : dflt;
  }

  Val& in(const NodeProto& n, int i) {
    if (i >= n.input_size() || n.input(i).empty())
      throw UnsupportedError{"input " + std::to_string(i) + " is missing"};
    auto it = vals_.find(n.input(i));
    if (it == vals_.end()) // its producer has no output of that name
      throw UnsupportedError{"input '" + n.input(i) + "' is not defined"};
    return it->second;
  }
  bool hasIn(const NodeProto& n, int i) { return i < n.input_size() && !n.input(i).empty(); }

  void define(const NodeProto& n, Val v, int output = 0) {
    if (output >= n.output_size())
      throw UnsupportedError{"it has no output " + std::to_string(output)};
    v.name = n.output(output);
    vals_[n.output(output)] = std::move(v);
  }

  /// Adds an IR op for node `n` whose result has ONNX shape `shape`.
  Val emit(const NodeProto& n, ir::Op op, const std::vector<ir::Vertex>& operands,
           std::vector<int64_t> shape, int output = 0, const std::string& name = "") {
    op.name = uniqueName(name.empty() ? n.output(output) : name);
    op.origin = "node '" + nodeName(n) + "' (" + n.op_type() + ")";
    std::vector<ir::OperandInfo> infos;
    for (ir::Vertex u : operands)
      infos.push_back({g_.op(u).name, g_.op(u).type});
    ir::TypeError err;
    auto t = ir::inferType(op, infos, err, acts_);
    if (!t)
      throw UnsupportedError{err.message};
    op.type = *t;
    Val v;
    v.shape = std::move(shape);
    v.v = g_.addOp(std::move(op), operands);
    return v;
  }

  static std::vector<int64_t> broadcast(const std::vector<int64_t>& a,
                                        const std::vector<int64_t>& b) {
    auto s = ir::broadcastShapes(a, b);
    if (!s)
      throw UnsupportedError{"shapes " + shapeStr(a) + " and " + shapeStr(b) + " do not broadcast"};
    return *s;
  }

  /// An operand of a broadcasting op over the flattened result: it must cover the result's
  /// leading dimensions whole or not at all.
  void checkFlatBroadcast(const std::vector<int64_t>& operand, const std::vector<int64_t>& out) {
    if (out.size() <= 2)
      return;
    const size_t lead = out.size() - 1, off = out.size() - operand.size();
    bool all = operand.size() == out.size(), none = true;
    for (size_t i = 0; i < lead; ++i) {
      const int64_t d = i >= off ? operand[i - off] : 1;
      all = all && d == out[i];
      none = none && d == 1;
    }
    if (!all && !none)
      throw UnsupportedError{"broadcasting " + shapeStr(operand) + " to " + shapeStr(out) +
                             " over some of the leading dimensions is not supported (fpat folds "
                             "them into rows)"};
  }

  /// Opsets 1-6 broadcast only with `broadcast = 1`, B's shape matched against A's at `axis`
  /// (default: its last dimensions). Where that is NumPy's broadcasting (B a suffix of A), it is
  /// computed as such; anything else is refused (computed with NumPy's rules, it was silently
  /// wrong, and the f32 check agreed, coming from the same import).
  void legacyBroadcast(const NodeProto& n, const std::vector<int64_t>& a,
                       const std::vector<int64_t>& b) {
    const AttributeProto* bc = attr(n, "broadcast");
    const bool legacy = r_.opset < 7 || bc;
    if (!legacy)
      return;
    if (!bc || bc->i() == 0) {
      if (a != b)
        throw UnsupportedError{"shapes " + shapeStr(a) + " and " + shapeStr(b) +
                               " differ, and without broadcast = 1 opset " +
                               std::to_string(r_.opset) + " requires equal shapes"};
      return;
    }
    const int64_t suffix = static_cast<int64_t>(a.size()) - static_cast<int64_t>(b.size());
    const int64_t axis = attr(n, "axis") ? intAttr(n, "axis", suffix) : suffix;
    if (axis != suffix || suffix < 0)
      throw UnsupportedError{"legacy broadcasting of " + shapeStr(b) + " into " + shapeStr(a) +
                             " at axis " + std::to_string(axis) +
                             " (opset 1-6, broadcast = 1) is not supported: only B matching "
                             "A's last dimensions; export the model with opset 7 or newer"};
    for (size_t i = 0; i < b.size(); ++i)
      if (b[i] != a[static_cast<size_t>(suffix) + i] && b[i] != 1)
        throw UnsupportedError{"legacy broadcasting of " + shapeStr(b) + " into " + shapeStr(a) +
                               ": dimension " + std::to_string(i) + " differs"};
  }

  /// `a k b` of two constants, NumPy-broadcast to `shape`: one element (a scalar constant) in
  /// `data`, more (a weight) in `fdata`.
  static Val foldBinary(ir::OpKind k, const Val& a, const Val& b,
                        const std::vector<int64_t>& shape) {
    const size_t total = static_cast<size_t>(numel(shape)), rank = shape.size();
    // Each operand's stride per output dimension: 0 where it is broadcast.
    auto strides = [&](const Val& v) {
      std::vector<size_t> st(rank, 0);
      size_t step = 1;
      for (size_t i = 0; i < v.shape.size(); ++i) {
        const size_t d = v.shape.size() - 1 - i, o = rank - 1 - i;
        st[o] = v.shape[d] == 1 ? 0 : step;
        step *= static_cast<size_t>(v.shape[d]);
      }
      return st;
    };
    const std::vector<size_t> sa = strides(a), sb = strides(b);
    const bool scalarA = count(a) == 1, scalarB = count(b) == 1;
    auto op = [k](double x, double y) { return ir::applyBinary(k, x, y); };
    Val v;
    v.isConst = true;
    v.shape = shape;
    v.name = a.name + "." + ir::opKindName(k) + "." + b.name;
    if (total == 1) {
      v.data = {op(at(a, 0), at(b, 0))};
      return v;
    }
    v.fdata = std::make_shared<std::vector<float>>(total);
    std::vector<int64_t> idx(rank, 0);
    size_t ia = 0, ib = 0;
    for (size_t i = 0; i < total; ++i) {
      (*v.fdata)[i] = static_cast<float>(op(at(a, scalarA ? 0 : ia), at(b, scalarB ? 0 : ib)));
      for (size_t d = rank; d-- > 0;) { // the next index, row-major
        ia += sa[d];
        ib += sb[d];
        if (++idx[d] < shape[d])
          break;
        ia -= sa[d] * static_cast<size_t>(shape[d]);
        ib -= sb[d] * static_cast<size_t>(shape[d]);
        idx[d] = 0;
      }
    }
    return v;
  }

  void binary(const NodeProto& n, ir::OpKind k) {
    Val* pa = &in(n, 0);
    Val* pb = &in(n, 1);
    legacyBroadcast(n, pa->shape, pb->shape);
    const std::vector<int64_t> shape = broadcast(pa->shape, pb->shape);
    Val scalarA, scalarB;
    if (pa->uniform || pb->uniform) {
      const bool oneA = pa->isConst && count(*pa) == 1, oneB = pb->isConst && count(*pb) == 1;
      if (oneA && oneB) { // uniform (or scalar) with uniform: one value again
        Val v = foldBinary(k, constOf({}, {at(*pa, 0)}, pa->integer),
                           constOf({}, {at(*pb, 0)}, pb->integer), {});
        v.integer = pa->integer && pb->integer;
        if (v.integer)
          for (double& d : v.data)
            d = std::trunc(d);
        v.shape = shape;
        v.uniform = numel(shape) != 1;
        return define(n, std::move(v));
      }
      // Beside anything else: a scalar where it does not widen the other operand.
      for (auto [p, other, scalar] :
           {std::tuple{&pa, pb, &scalarA}, std::tuple{&pb, pa, &scalarB}}) {
        Val& u = **p;
        if (!u.uniform)
          continue;
        if (broadcast(other->shape, u.shape) == other->shape) {
          *scalar = constOf({}, {at(u, 0)}, u.integer);
          scalar->name = u.name;
          *p = scalar;
        } else {
          expandUniform(u);
        }
      }
    }
    Val &a = *pa, &b = *pb;
    if (a.isConst && b.isConst && a.integer && b.integer) {
      // Shape arithmetic (a dimension times the heads, a sequence length less one): integers,
      // division truncated as ONNX's integer Div.
      Val v = foldBinary(k, a, b, shape);
      v.integer = true;
      if (v.fdata)
        v.data.assign(v.fdata->begin(), v.fdata->end());
      v.fdata.reset();
      for (double& d : v.data)
        d = std::trunc(d);
      define(n, std::move(v));
      return;
    }
    if (a.isConst && b.isConst) {
      // Arithmetic on constants and weights is done here, once, in double (an unfolded
      // export's W * 0.5, a scale applied to a weight): it never becomes a kernel.
      define(n, foldBinary(k, a, b, shape));
      return;
    }
    if (a.queryMajor || b.queryMajor)
      return queryMajorBinary(n, k, a, b, shape);
    if (a.bmmHeads || b.bmmHeads)
      return bmmMaskBinary(n, k, a, b);
    ir::Op op;
    op.kind = k;
    if (a.view != Val::View::None || b.view != Val::View::None) {
      // A head view times a scalar (torch's SDPA scales q and k^T): the same view of the
      // scaled activation.
      Val& x = a.view != Val::View::None ? a : b;
      Val& c = a.view != Val::View::None ? b : a;
      if (k == ir::OpKind::Pow)
        throw UnsupportedError{"of the elementwise ops on an activation split into heads ('" +
                               x.name + "' " + shapeStr(x.shape) + "), Pow is not supported"};
      if (c.view != Val::View::None || numel(c.shape) != 1 || x.view == Val::View::Dense4 ||
          (&x == &b && (k == ir::OpKind::Sub || k == ir::OpKind::Div)))
        return headsBinary(n, k, a, b, shape);
      Val v = x;
      const ir::Vertex vx = *x.v, vc = tensor(c);
      v.v =
          emit(n, op, &x == &a ? std::vector<ir::Vertex>{vx, vc} : std::vector<ir::Vertex>{vc, vx},
               g_.op(vx).type.shape)
              .v;
      define(n, std::move(v));
      return;
    }
    // Scores in torch.bmm's form, [B*H, Sq, Sk] of a rank-4 IR tensor, with a constant of
    // [B*H or 1, Sq or 1, Sk] (BLOOM's ALiBi added by baddbmm): computed on [B, H, Sq, Sk].
    for (int i = 0; i < 2; ++i) {
      Val& x = i ? b : a;
      const Val& c = i ? a : b;
      if (x.isConst || !x.v || !c.isConst || c.shape.size() > 3)
        continue;
      const std::vector<int64_t> ir = g_.op(*x.v).type.shape;
      if (ir.size() != 4 || x.shape.size() != 3 || x.shape[0] != ir[0] * ir[1])
        continue;
      std::vector<int64_t> cs = c.shape;
      while (cs.size() < 3)
        cs.insert(cs.begin(), 1);
      if (cs[0] != 1 && cs[0] != ir[0] * ir[1])
        continue;
      Val c4 = c;
      c4.v.reset();
      c4.shape = {cs[0] == 1 ? 1 : ir[0], cs[0] == 1 ? 1 : ir[1], cs[1], cs[2]};
      if (broadcast(ir, c4.shape) != ir)
        continue;
      const ir::Vertex vx = *x.v, vc = tensor(c4);
      Val v =
          emit(n, op, i ? std::vector<ir::Vertex>{vc, vx} : std::vector<ir::Vertex>{vx, vc}, ir);
      v.shape = shape;
      return define(n, std::move(v));
    }
    if (shape.size() != 4) {
      checkFlatBroadcast(a.shape, shape);
      checkFlatBroadcast(b.shape, shape);
    }
    const ir::Vertex va = tensor(a), vb = tensor(b);
    define(n, emit(n, op, {va, vb}, shape));
  }

  /// Op `k` on `operands`, of x's IR shape: x's value (form, ONNX shape, flags) computed anew.
  Val sameForm(const NodeProto& n, ir::OpKind k, const Val& x,
               const std::vector<ir::Vertex>& operands) {
    ir::Op op;
    op.kind = k;
    Val v = x;
    v.v = emit(n, op, operands, g_.op(*x.v).type.shape).v;
    return v;
  }

  /// Constant `c` as an operand of an elementwise op on query-major scores `x`: broadcast
  /// against x's ONNX shape ([B, Sq*H, Sk] or [B, Sq, H, Sk]) and put in the IR's order [B, H,
  /// Sq, Sk] (a scalar stays one).
  Val queryMajorConst(const Val& c, const Val& x) {
    if (count(c) == 1)
      return c;
    const std::vector<int64_t> ir = g_.op(*x.v).type.shape; // [B, H, Sq, Sk]
    std::vector<int64_t> cs = c.shape;
    if (cs.size() > x.shape.size() || broadcast(cs, x.shape) != x.shape)
      throw UnsupportedError{"'" + c.name + "' " + shapeStr(c.shape) + " does not broadcast to '" +
                             x.name + "' " + shapeStr(x.shape)};
    while (cs.size() < x.shape.size())
      cs.insert(cs.begin(), 1);
    Val c4 = c;
    c4.v.reset();
    if (cs.size() == 3) { // [c0, Sq*H or 1, c2]
      if (cs[1] != 1 && cs[1] != ir[2] * ir[1])
        throw UnsupportedError{"'" + c.name + "' " + shapeStr(c.shape) +
                               " mixes the query and head axes of '" + x.name + "'"};
      cs = {cs[0], cs[1] == 1 ? 1 : ir[2], cs[1] == 1 ? 1 : ir[1], cs[2]};
    }
    c4.shape = cs; // [c0, Sq or 1, H or 1, c3], the same elements
    Val t = permuted(c4, {0, 2, 1, 3});
    t.name = c.name + ".query_major";
    return t;
  }

  /// A tensor materialize made of a value of a run-time mask that is one for every head of
  /// query-major scores `x` ([B, Sq, 1, Sk]: HF GPTBigCode's causal and padding mask), made
  /// again in the IR's order [B, 1, Sq, Sk]; nullopt for any other value.
  std::optional<ir::Vertex> irOrderMask(const NodeProto& n, const Val& c, const Val& x) {
    if (c.isConst || !c.madeFrom || c.shape.size() != 4 || c.shape[2] != 1 ||
        ir::broadcastShapes(c.shape, x.shape) != x.shape)
      return std::nullopt;
    const Val::OfMask& o = *c.madeFrom;
    const std::vector<int64_t> swap{0, 2, 1, 3};
    auto of = std::make_shared<Val::OfMask>();
    of->mask = o.mask;
    of->lo = std::make_shared<const Val>(permuted(*o.lo, swap));
    of->hi = std::make_shared<const Val>(permuted(*o.hi, swap));
    of->at = std::make_shared<const Val>(permuted(*o.at, swap));
    Val m;
    m.name = c.name + ".query_major";
    m.shape = {c.shape[0], 1, c.shape[1], c.shape[3]};
    m.ofMask = std::move(of);
    materialize(m, n);
    if (m.isConst || !m.v)
      return std::nullopt;
    const std::vector<int64_t> ir = g_.op(*x.v).type.shape;
    ir::Vertex vm = *m.v;
    if (ir::broadcastShapes(g_.op(vm).type.shape, ir) != ir && m.view == Val::View::Tokens &&
        !m.flatSH && m.repeat == 1) // the mask itself, viewed: as a rank-4 tensor
      vm = *dense4(n, m).v;
    if (ir::broadcastShapes(g_.op(vm).type.shape, ir) != ir)
      return std::nullopt;
    return vm;
  }

  /// An elementwise op of query-major scores and a constant, on the IR's [B, H, Sq, Sk]; adding
  /// zeros (torch's baddbmm with beta = 0 adds 0 times its input) is the scores themselves.
  void queryMajorBinary(const NodeProto& n, ir::OpKind k, Val& a, Val& b,
                        const std::vector<int64_t>& shape) {
    Val& x = a.queryMajor ? a : b;
    Val& c = a.queryMajor ? b : a;
    if (!c.isConst && c.view == Val::View::Tokens && !c.flatSH && c.parts == 1 && c.seq == 1 &&
        c.heads == 1 && c.repeat == 1 && shape == x.shape) {
      // A value computed at run time that is one for every query and head ([B, 1, 1, Sk], a
      // padding mask's bias, which imports as a head view of one position and one head): the
      // same in both orders, broadcast as a rank-4 tensor.
      const std::vector<int64_t> ir = g_.op(*x.v).type.shape;
      const ir::Vertex vc = *dense4(n, c).v;
      if (ir::broadcastShapes(g_.op(vc).type.shape, ir) == ir)
        return define(n, sameForm(n, k, x,
                                  &x == &a ? std::vector<ir::Vertex>{*x.v, vc}
                                           : std::vector<ir::Vertex>{vc, *x.v}));
    }
    if (std::optional<ir::Vertex> vm = irOrderMask(n, c, x))
      return define(n, sameForm(n, k, x,
                                &x == &a ? std::vector<ir::Vertex>{*x.v, *vm}
                                         : std::vector<ir::Vertex>{*vm, *x.v}));
    if (!c.isConst || c.integer || shape != x.shape)
      throw UnsupportedError{"'" + x.name + "' " + shapeStr(x.shape) +
                             " are attention scores ordered by query, then head; fpat supports "
                             "elementwise ops on them only with constants that broadcast to them"};
    bool zeros = true;
    for (size_t i = 0; zeros && i < count(c); ++i)
      zeros = at(c, i) == 0.0;
    if (zeros && (k == ir::OpKind::Add || (k == ir::OpKind::Sub && &x == &a)))
      return define(n, Val(x));
    Val t = queryMajorConst(c, x);
    const ir::Vertex vx = *x.v, vc = tensor(t);
    define(n,
           sameForm(n, k, x,
                    &x == &a ? std::vector<ir::Vertex>{vx, vc} : std::vector<ir::Vertex>{vc, vx}));
  }

  /// An elementwise op on a mask in torch.bmm's form (Val::bmmHeads): with a scalar, the same
  /// form; with scores of that form ([B*H, Sq, Sk] of a rank-4 IR tensor), on the rank-4
  /// tensors, broadcast.
  void bmmMaskBinary(const NodeProto& n, ir::OpKind k, Val& a, Val& b) {
    Val& m = a.bmmHeads ? a : b;
    Val& o = a.bmmHeads ? b : a;
    ir::Op op;
    op.kind = k;
    auto operands = [&](ir::Vertex vm, ir::Vertex vo) {
      return &m == &a ? std::vector<ir::Vertex>{vm, vo} : std::vector<ir::Vertex>{vo, vm};
    };
    const std::vector<int64_t> mir = g_.op(*m.v).type.shape; // [B, 1, 1, Sk]
    if (o.isConst && count(o) == 1) {
      Val v = sameForm(n, k, m, operands(*m.v, tensor(o)));
      v.intInput = false;
      v.binary01 = false;
      return define(n, std::move(v));
    }
    if (!o.isConst && o.v && o.view == Val::View::None && !o.bmmHeads && !o.queryMajor &&
        !o.seqFirst && k != ir::OpKind::Pow) {
      const std::vector<int64_t> oir = g_.op(*o.v).type.shape; // [B, H, Sq, Sk]
      if (oir.size() == 4 && o.shape == std::vector<int64_t>{oir[0] * oir[1], oir[2], oir[3]} &&
          oir[1] == m.bmmHeads && mir[0] == oir[0] && mir[3] == oir[3]) {
        Val v = emit(n, op, operands(*m.v, *o.v), oir);
        v.shape = o.shape;
        return define(n, std::move(v));
      }
    }
    throw UnsupportedError{"'" + m.name + "' " + shapeStr(m.shape) +
                           " is a mask broadcast over the heads in torch.bmm's form; fpat "
                           "supports elementwise ops on it with scalars and with scores of that "
                           "form, not with '" +
                           o.name + "' " + shapeStr(o.shape)};
  }

  /// Max and Min, which ONNX lets take any number of operands: one is itself, two a binary op.
  void maxMin(const NodeProto& n) {
    const int operands = n.input_size();
    if (operands == 1) {
      Val v = in(n, 0);
      return define(n, std::move(v));
    }
    if (operands != 2)
      throw UnsupportedError{"it has " + std::to_string(operands) +
                             " operands; fpat imports Max and Min of one or two"};
    const bool isMax = n.op_type() == "Max";
    // A clamp at float's lowest (highest) value changes no finite value: OPT's
    // torch.max(scores, finfo(f32).min) after its mask. It is the other operand itself; kept,
    // its constant would be beyond f16's range.
    for (int i = 0; i < 2; ++i) {
      const Val& c = in(n, i);
      const double limit = std::numeric_limits<float>::max();
      if (c.isConst && count(c) == 1 && !in(n, 1 - i).isConst &&
          (isMax ? at(c, 0) <= -limit : at(c, 0) >= limit) &&
          broadcast(in(n, 0).shape, in(n, 1).shape) == in(n, 1 - i).shape) {
        Val v = in(n, 1 - i);
        return define(n, std::move(v));
      }
    }
    binary(n, isMax ? ir::OpKind::Max : ir::OpKind::Min);
  }

  /// An elementwise function: the activation `fn`, or where its operand is a constant (T5's
  /// relative-position buckets: Abs, Log of the distances) `fold` of it, once, in double.
  void unary(const NodeProto& n, const std::string& fn, double (*fold)(double)) {
    Val& x = in(n, 0);
    if (x.isConst) {
      const bool keepsInteger = x.integer && (fn == "abs" || fn == "neg" || fn == "relu");
      return define(n, foldConst({&x}, x.shape, keepsInteger,
                                 [fold](const double* v) { return fold(v[0]); }));
    }
    if (!acts_.contains(fn))
      throw UnsupportedError{"the activation '" + fn + "' is not defined"};
    ir::Op op;
    op.kind = ir::OpKind::Activation;
    op.fn = fn;
    if (x.view != Val::View::None) { // on heads (RoPE's Neg): on their Dense4 tensor
      Val v = dense4(n, x);
      v.v = emit(n, op, {*v.v}, g_.op(*v.v).type.shape).v;
      define(n, std::move(v));
      return;
    }
    define(n, emit(n, op, {tensor(x)}, x.shape));
  }

  std::vector<int64_t> axesOf(const NodeProto& n, int inputIndex) {
    std::vector<int64_t> axes;
    if (const AttributeProto* a = attr(n, "axes")) {
      axes.assign(a->ints().begin(), a->ints().end());
    } else if (hasIn(n, inputIndex)) {
      Val& v = in(n, inputIndex);
      if (!v.isConst)
        throw UnsupportedError{"its axes must be constant"};
      for (size_t i = 0; i < count(v); ++i)
        axes.push_back(static_cast<int64_t>(at(v, i)));
    }
    return axes;
  }

  static int64_t normAxis(int64_t axis, size_t rank) {
    const int64_t r = static_cast<int64_t>(rank);
    if (axis < -r || axis >= r)
      throw UnsupportedError{"axis " + std::to_string(axis) + " is out of range for rank " +
                             std::to_string(rank)};
    return axis < 0 ? axis + r : axis;
  }

  /// A shape-only op: the value keeps its data (and its IR vertex) under a new ONNX shape,
  /// which must keep the last dimension (the IR's columns).
  void alias(const NodeProto& n, Val& x, std::vector<int64_t> shape) {
    if (numel(shape) != numel(x.shape))
      throw UnsupportedError{"it changes the element count (" + shapeStr(x.shape) + " to " +
                             shapeStr(shape) + ")"};
    Val v = x;
    v.shape = std::move(shape);
    if (x.queryMajor) { // [B, Sq*H, Sk] <-> [B, Sq, H, Sk]
      const std::vector<int64_t>& ir = g_.op(*x.v).type.shape;
      if (v.shape != std::vector<int64_t>{ir[0], ir[2] * ir[1], ir[3]} &&
          v.shape != std::vector<int64_t>{ir[0], ir[2], ir[1], ir[3]})
        throw UnsupportedError{"reshaping the query-major scores '" + x.name + "' " +
                               shapeStr(x.shape) + " to " + shapeStr(v.shape) +
                               " is not supported"};
      return define(n, std::move(v));
    }
    if (!x.isConst && x.v) {
      // Scores [B, H, Sq, Sk] seen as [B*H, Sq, Sk] (torch.bmm's form) and back: the IR keeps
      // the rank-4 tensor, the value its ONNX shape.
      const std::vector<int64_t>& ir = g_.op(*x.v).type.shape;
      if (ir.size() == 4 &&
          (v.shape == ir || v.shape == std::vector<int64_t>{ir[0] * ir[1], ir[2], ir[3]}))
        return define(n, std::move(v));
    }
    if (!x.isConst && flatten(v.shape) != flatten(x.shape)) {
      // [M, N] <-> [N] when M = 1, and the like, keep the data but not the IR type.
      const std::vector<int64_t> a = flatten(v.shape), b = flatten(x.shape);
      if (a.empty() || b.empty() || a.back() != b.back() || numel(a) != numel(b) ||
          (a.size() == 2 && a[0] != 1) || (b.size() == 2 && b[0] != 1))
        throw UnsupportedError{"reshaping " + shapeStr(x.shape) + " to " + shapeStr(v.shape) +
                               " changes the last dimension, which fpat keeps as the columns "
                               "of every row-wise op"};
    }
    define(n, std::move(v));
  }

  /// One converter per ONNX op type: the one place that says what is supported
  /// (supportedOpTypes() lists its keys).
  using Converter = std::function<void(Importer&, const NodeProto&)>;
  static const std::map<std::string, Converter>& converters() {
    auto bin = [](ir::OpKind k) {
      return [k](Importer& i, const NodeProto& n) { i.binary(n, k); };
    };
    auto un = [](const char* fn, double (*fold)(double)) {
      return [fn, fold](Importer& i, const NodeProto& n) { i.unary(n, fn, fold); };
    };
    auto member = [](void (Importer::*f)(const NodeProto&)) {
      return [f](Importer& i, const NodeProto& n) { (i.*f)(n); };
    };
    auto cmp = [](bool (*f)(double, double)) {
      return [f](Importer& i, const NodeProto& n) {
        const Val &a = i.constIn(n, 0, "its first operand"), &b = i.constIn(n, 1, "its second");
        i.define(n, foldConst({&a, &b}, broadcast(a.shape, b.shape), true,
                              [f](const double* x) { return f(x[0], x[1]) ? 1.0 : 0.0; }));
      };
    };
    auto constUnary = [](double (*f)(double)) {
      return [f](Importer& i, const NodeProto& n) {
        const Val& x = i.constIn(n, 0, "its operand");
        i.define(n, foldConst({&x}, x.shape, false, [f](const double* v) { return f(v[0]); }));
      };
    };
    static const std::map<std::string, Converter> table = {
        {"Abs", un("abs", [](double x) { return std::fabs(x); })},
        {"Add", bin(ir::OpKind::Add)},
        {"Attention", member(&Importer::attentionOp)},
        {"Cast", member(&Importer::cast)},
        {"Clip", member(&Importer::clip)},
        {"Concat", member(&Importer::concat)},
        {"Constant", member(&Importer::constant)},
        {"ConstantOfShape", member(&Importer::constantOfShape)},
        {"Div", bin(ir::OpKind::Div)},
        {"Dropout", member(&Importer::identity)},
        {"Erf", un("erf", [](double x) { return std::erf(x); })},
        {"Exp", un("exp", [](double x) { return std::exp(x); })},
        {"Expand", member(&Importer::expand)},
        {"Flatten", member(&Importer::reshape)},
        {"Gather", member(&Importer::gather)},
        {"Gemm", member(&Importer::matmul)},
        {"Identity", member(&Importer::identity)},
        {"LayerNormalization", member(&Importer::layerNorm)},
        {"Log", un("log", [](double x) { return std::log(x); })},
        {"MatMul", member(&Importer::matmul)},
        {"Mul", bin(ir::OpKind::Mul)},
        {"Neg", un("neg", [](double x) { return -x; })},
        {"Pow", bin(ir::OpKind::Pow)},
        {"Max", member(&Importer::maxMin)},
        {"Min", member(&Importer::maxMin)},
        {"RMSNormalization", member(&Importer::rmsNorm)},
        {"Range", member(&Importer::range)},
        {"Reciprocal", un("reciprocal", [](double x) { return 1.0 / x; })},
        {"ReduceMean", member(&Importer::reduceMean)},
        {"Softmax", member(&Importer::softmax)},
        {"Split", member(&Importer::split)},
        {"Equal", cmp([](double a, double b) { return a == b; })},
        {"Less", cmp([](double a, double b) { return a < b; })},
        {"LessOrEqual", cmp([](double a, double b) { return a <= b; })},
        {"Greater", cmp([](double a, double b) { return a > b; })},
        {"GreaterOrEqual", cmp([](double a, double b) { return a >= b; })},
        {"And", cmp([](double a, double b) { return a != 0 && b != 0; })},
        {"Or", cmp([](double a, double b) { return a != 0 || b != 0; })},
        {"Not", member(&Importer::logicalNot)},
        {"Where", member(&Importer::where)},
        {"Cos", constUnary([](double x) { return std::cos(x); })},
        {"Sin", constUnary([](double x) { return std::sin(x); })},
        {"Trilu", member(&Importer::trilu)},
        {"Einsum", member(&Importer::einsum)},
        {"Relu", un("relu", [](double x) { return x > 0 ? x : 0.0; })},
        {"Reshape", member(&Importer::reshape)},
        {"ScatterND", member(&Importer::scatterND)},
        {"Shape", member(&Importer::shapeOf)},
        {"Sigmoid", un("sigmoid", [](double x) { return 1.0 / (1.0 + std::exp(-x)); })},
        {"Slice", member(&Importer::slice)},
        {"Sqrt", un("sqrt", [](double x) { return std::sqrt(x); })},
        {"Squeeze", member(&Importer::reshape)},
        {"Sub", bin(ir::OpKind::Sub)},
        {"Tanh", un("tanh", [](double x) { return std::tanh(x); })},
        {"Tile", member(&Importer::tile)},
        {"Transpose", member(&Importer::transpose)},
        {"Unsqueeze", member(&Importer::reshape)},
    };
    return table;
  }

  void convert(const NodeProto& n) {
    for (const std::string& name : n.input())
      if (auto e = emptied_.find(name); e != emptied_.end()) {
        for (const std::string& out : n.output())
          emptied_.emplace(out, e->second);
        break;
      }
    const auto& table = converters();
    auto it = table.find(n.op_type());
    if (it == table.end())
      throw UnsupportedError{"op type " + n.op_type() + " is not supported"};
    if (n.op_type() == "Shape") // reads the shape alone, of any value
      return it->second(*this, n);
    static const std::set<std::string> kUniformOps = {"Add", "Sub", "Mul", "Div"};
    if (!kUniformOps.count(n.op_type()))
      for (const std::string& name : n.input())
        if (auto v = vals_.find(name); v != vals_.end())
          expandUniform(v->second);
    if (everyOtherOp(n) || ofMaskOp(n))
      return;
    for (const std::string& name : n.input()) // any other use of a value of a mask: a tensor
      if (auto v = vals_.find(name); v != vals_.end() && v->second.ofMask)
        materialize(v->second, n);
    // An integer input moves as a mask (its values 0 and 1, which float holds exactly) until a
    // Cast to float or a Where; anything else would compute on it as on integers.
    static const std::set<std::string> kMaskMoves = {"Cast",    "Expand", "Flatten", "Identity",
                                                     "Reshape", "Slice",  "Squeeze", "Unsqueeze",
                                                     "Equal",   "Not",    "Where"};
    // A mask's Expand is left to the elementwise ops after it, which broadcast it the same.
    static const std::set<std::string> kBroadcasting = {
        "Cast", "Equal", "Not", "Where", "Add", "Sub", "Mul", "Div", "Max", "Min", "Attention"};
    if (n.op_type() == "Reshape" && bmmFormMask(n))
      return;
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name);
          v != vals_.end() && v->second.bmmHeads && !kBmmOps.count(n.op_type()))
        throw UnsupportedError{"'" + name + "' " + shapeStr(v->second.shape) +
                               " is a mask broadcast over the heads in torch.bmm's form; fpat "
                               "supports only Cast, Where, Add, Sub, Mul and Div on it"};
    bool intIn = false;
    for (const std::string& name : n.input()) {
      auto v = vals_.find(name);
      if (v == vals_.end())
        continue;
      if (v->second.lazyExpand && !kBroadcasting.count(n.op_type()))
        throw UnsupportedError{"'" + name +
                               "' is a mask expanded to another shape; fpat supports that only "
                               "before elementwise ops (Cast, Equal, Not, Where, Add, Sub, Mul, "
                               "Div, Max, Min), which broadcast it"};
      if (!v->second.intInput || (n.op_type() == "Attention" && n.input_size() > 3 &&
                                  name == n.input(3))) // its bool mask: attentionOp
        continue;
      if (!kMaskMoves.count(n.op_type()))
        throw UnsupportedError{
            "'" + name +
            "' is an integer input used as data; fpat imports integer and bool inputs only as "
            "masks of 0s and 1s, which the model casts to float (token ids feed embeddings, "
            "which are not imported)"};
      intIn = true;
    }
    if (intIn && n.op_type() != "Cast")
      return maskOp(n);
    // What the model sees after an elementwise op on a mask left unexpanded; the result stays
    // unexpanded (and so restricted) where the other operands do not cover that shape.
    std::optional<std::vector<int64_t>> seen;
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name); v != vals_.end() && v->second.lazyExpand)
        seen = v->second.expandedTo;
    if (seen)
      for (const std::string& name : n.input())
        if (auto v = vals_.find(name); v != vals_.end() && !v->second.lazyExpand)
          seen = broadcast(*seen, v->second.shape);
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name);
          v != vals_.end() && v->second.parts > 1 && n.op_type() != "Gather")
        throw UnsupportedError{"'" + name + "' " + shapeStr(v->second.shape) +
                               " holds q, k and v of each head side by side; fpat supports only "
                               "a Gather of one of them (axis 3, a scalar index)"};
    // A mask cast to float holds 0s and 1s: a product of it computes on integers given at run
    // time (Hugging Face's position_ids, inv_freq @ position_ids), which fpat does not take.
    if (n.op_type() == "MatMul" || n.op_type() == "Gemm")
      for (const std::string& name : n.input())
        if (auto v = vals_.find(name); v != vals_.end() && v->second.binary01)
          throw UnsupportedError{
              "'" + name + "' " + shapeStr(v->second.shape) +
              " is an integer or bool input cast to float, which fpat takes as a mask of 0s and "
              "1s; products of integers given at run time (position_ids, token ids) are not "
              "supported (positions computed in the model, from the cache's length, are)"};
    const bool seqFirst = seqFirstInputs(n);
    givenCache(n);
    const Val* cache = nullptr;
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name); v != vals_.end() && v->second.headMajor)
        cache = &v->second;
    const Val cacheIn = cache ? *cache : Val{};
    it->second(*this, n);
    if (cache && n.op_type() != "MatMul")
      checkCacheMoved(n, cacheIn);
    // A row-wise op of sequence-first activations gives one (the ops that reshape and transpose
    // set it themselves).
    static const std::set<std::string> kViewOps = {"Transpose", "Reshape", "Flatten", "Squeeze",
                                                   "Unsqueeze"};
    if (seqFirst && !kViewOps.count(n.op_type()))
      for (const std::string& out : n.output())
        if (auto v = vals_.find(out);
            v != vals_.end() && !v->second.isConst && v->second.view == Val::View::None)
          v->second.seqFirst = true;
    // 1 - m of 0s and 1s is 0s and 1s too (Hugging Face's inverted mask).
    if (n.op_type() == "Sub" && in(n, 0).isConst && count(in(n, 0)) == 1 && at(in(n, 0), 0) == 1 &&
        (in(n, 1).binary01 || in(n, 1).intInput))
      if (auto v = vals_.find(n.output(0)); v != vals_.end())
        v->second.binary01 = true;
    if (seen)
      for (const std::string& out : n.output())
        if (auto v = vals_.find(out); v != vals_.end() && v->second.shape != *seen) {
          v->second.lazyExpand = true;
          v->second.expandedTo = *seen;
        }
  }

  /// Whether `n` reads a sequence-first activation (Val::seqFirst, no head view); refuses the
  /// ops that would read its rows in the wrong order: only row-wise ops take one, with other
  /// sequence-first activations, scalars, constants along the last axis or (MatMul, Gemm) a
  /// weight.
  bool seqFirstInputs(const NodeProto& n) {
    bool any = false;
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name);
          v != vals_.end() && v->second.seqFirst && v->second.view == Val::View::None)
        any = true;
    if (!any)
      return false;
    static const std::set<std::string> kRowWise = {"MatMul",
                                                   "Gemm",
                                                   "Add",
                                                   "Sub",
                                                   "Mul",
                                                   "Div",
                                                   "Pow",
                                                   "Max",
                                                   "Min",
                                                   "Relu",
                                                   "Erf",
                                                   "Tanh",
                                                   "Sigmoid",
                                                   "Sqrt",
                                                   "Neg",
                                                   "Abs",
                                                   "Exp",
                                                   "Log",
                                                   "Reciprocal",
                                                   "Cast",
                                                   "Identity",
                                                   "Dropout",
                                                   "LayerNormalization",
                                                   "RMSNormalization",
                                                   "ReduceMean",
                                                   "Softmax",
                                                   "Slice",
                                                   "Split",
                                                   "Clip",
                                                   "Transpose",
                                                   "Reshape",
                                                   "Flatten",
                                                   "Squeeze",
                                                   "Unsqueeze"};
    const std::string what = "it reads a sequence-first activation ([S, B, E], token-major rows "
                             "seen with the first two axes swapped)";
    if (!kRowWise.count(n.op_type()))
      throw UnsupportedError{what + ", which fpat supports only in row-wise ops"};
    const bool product = n.op_type() == "MatMul" || n.op_type() == "Gemm";
    for (int i = 0; i < n.input_size(); ++i) {
      if (n.input(i).empty())
        continue;
      const Val& v = in(n, i);
      if (v.seqFirst && v.view == Val::View::None) {
        if (product && i != 0)
          throw UnsupportedError{what + " as the B operand of a product"};
        continue;
      }
      const bool lastAxis =
          v.isConst && (count(v) == 1 || (!v.shape.empty() && numel(v.shape) == v.shape.back()));
      if (!lastAxis && !(product && i == 1 && v.isConst) && !(v.isConst && v.integer)) {
        // An activation of the same [S, B, E] shape, row-wise beside a sequence-first one, is
        // sequence-first too: inputs whose rows reach it are taken so in a rerun.
        if (!v.isConst && v.v && v.view == Val::View::None && v.shape.size() == 3 &&
            std::any_of(n.input().begin(), n.input().end(), [&](const std::string& o) {
              const auto it = vals_.find(o);
              return it != vals_.end() && it->second.seqFirst && it->second.shape == v.shape;
            })) {
          seqFirstFound_.merge(rowSources(*v.v));
        }
        throw UnsupportedError{what + " beside '" + v.name + "' " + shapeStr(v.shape) +
                               ", whose rows are in the model's order"};
      }
    }
    return true;
  }

  static inline const std::set<std::string> kBmmOps = {"Cast", "Where", "Add",     "Sub",
                                                       "Mul",  "Div",   "Identity"};

  /// Reshape of a mask [B, 1, 1, Sk] (a head view of one position and one head) expanded to
  /// [B, H, 1, Sk] into torch.bmm's form [B*H, 1, Sk]: its rank-4 tensor, Val::bmmHeads.
  bool bmmFormMask(const NodeProto& n) {
    Val& m = in(n, 0);
    if (!m.lazyExpand || !m.intInput || m.view != Val::View::Tokens || m.seq != 1 || m.heads != 1 ||
        m.shape.size() != 4 || m.expandedTo.size() != 4)
      return false;
    const std::vector<int64_t>& e = m.expandedTo;
    if (reshapeTarget(n, e) != std::vector<int64_t>{e[0] * e[1], e[2], e[3]} || e[2] != 1 ||
        m.shape != std::vector<int64_t>{e[0], 1, 1, e[3]})
      return false;
    Val v;
    v.v = dense4(n, m).v;
    v.shape = {e[0] * e[1], 1, e[3]};
    v.intInput = true;
    v.bmmHeads = e[1];
    define(n, std::move(v));
    return true;
  }

  /// Converts `n` as if it were `op` with these inputs and output (the mask's own arithmetic,
  /// spelt with the ops that already import), named as n with a suffix.
  void convertAs(const NodeProto& n, const std::string& op, const std::vector<std::string>& ins,
                 const std::string& out, const std::string& suffix) {
    NodeProto m;
    m.set_op_type(op);
    m.set_name(nodeName(n) + suffix);
    for (const std::string& i : ins)
      m.add_input(i);
    m.add_output(out);
    converters().at(op)(*this, m);
  }
  /// A scalar constant under a name of its own (n's output and a suffix).
  std::string scalarConst(const NodeProto& n, const std::string& suffix, double value) {
    const std::string name = n.output(0) + suffix;
    Val c = constOf({}, {value}, false);
    c.name = name;
    vals_[name] = std::move(c);
    return name;
  }

  /// A mask of 0s and 1s given at run time: an integer or bool input (or a move of it), or
  /// one cast to float.
  static bool isMaskSource(const Val& v) {
    return (v.intInput || v.binary01) && !v.isConst && v.v && !v.ofMask;
  }
  /// The shape the model sees of a mask source (its Expand left to the ops after it).
  static const std::vector<int64_t>& seenShape(const Val& v) {
    return v.lazyExpand ? v.expandedTo : v.shape;
  }
  /// Constant `c` broadcast to `shape`.
  static Val broadcastConst(const Val& c, const std::vector<int64_t>& shape) {
    if (c.shape == shape)
      return c;
    checkConstSize(shape);
    return foldConst({&c}, shape, c.integer, [](const double* v) { return v[0]; });
  }
  /// Each element's index into a tensor of shape `own` broadcast to `shape`: held as float data
  /// (moves of integer tensors are not all folded), exact below 2^24.
  static Val broadcastIndices(const std::vector<int64_t>& own, const std::vector<int64_t>& shape) {
    if (numel(own) >= (int64_t{1} << 24))
      throw UnsupportedError{"its index space " + shapeStr(own) +
                             " is too large to fold at import"};
    std::vector<double> iota(static_cast<size_t>(numel(own)));
    for (size_t i = 0; i < iota.size(); ++i)
      iota[i] = static_cast<double>(i);
    return broadcastConst(constOf(own, std::move(iota), false), broadcast(own, shape));
  }

  /// The ops a value of a mask folds through: elementwise ones, and moves of their data inputs
  /// (the rest are shapes, axes, indices).
  static const std::set<std::string>& elementwiseOnMasks() {
    static const std::set<std::string> s = {"Add",  "Sub",         "Mul",     "Div",
                                            "Pow",  "Max",         "Min",     "Equal",
                                            "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                                            "And",  "Or",          "Not",     "Where",
                                            "Cast", "Neg",         "Abs",     "Clip"};
    return s;
  }
  static std::vector<int> maskMoveData(const std::string& op, int inputs) {
    static const std::set<std::string> first = {"Reshape",  "Flatten", "Squeeze",   "Unsqueeze",
                                                "Expand",   "Slice",   "Transpose", "Gather",
                                                "Identity", "Dropout", "Tile"};
    if (first.count(op))
      return {0};
    if (op == "ScatterND")
      return {0, 2};
    if (op == "Concat") {
      std::vector<int> all;
      for (int i = 0; i < inputs; ++i)
        all.push_back(i);
      return all;
    }
    return {};
  }

  /// `n`'s converter run on constants: input i replaced by subs[i] where that is set. Its
  /// first output.
  Val foldWith(const NodeProto& n, const std::vector<std::optional<Val>>& subs) {
    NodeProto m = n;
    std::vector<std::string> temps;
    for (int i = 0; i < n.input_size() && i < static_cast<int>(subs.size()); ++i)
      if (subs[static_cast<size_t>(i)]) {
        const std::string t = n.input(i) + ".fold" + std::to_string(i);
        Val c = *subs[static_cast<size_t>(i)];
        c.name = t;
        vals_[t] = std::move(c);
        m.set_input(i, t);
        temps.push_back(t);
      }
    const std::string out = n.output(0) + ".fold";
    m.set_output(0, out);
    for (int o = 1; o < m.output_size(); ++o)
      m.set_output(o, "");
    converters().at(n.op_type())(*this, m);
    Val r = vals_.at(out);
    vals_.erase(out);
    for (const std::string& t : temps)
      vals_.erase(t);
    if (!r.isConst)
      throw UnsupportedError{"on a value of a mask it does not fold to a constant"};
    return r;
  }

  /// An op on values of one run-time mask (or the mask itself) and constants: folded on their
  /// values where the mask is 0, where it is 1, and on which mask element each reads. Returns
  /// whether `n` was such an op. The mask's own moves, Equal with 0 or 1, Not, Cast and Where
  /// with a choice computed at run time stay maskOp's.
  bool ofMaskOp(const NodeProto& n) {
    const std::string& t = n.op_type();
    const bool elementwise = elementwiseOnMasks().count(t) != 0;
    const std::vector<int> moved = maskMoveData(t, n.input_size());
    if ((!elementwise && moved.empty()) || n.output_size() < 1 || n.output(0).empty())
      return false;
    bool anyOfMask = false, anySource = false;
    for (const std::string& name : n.input()) {
      auto v = vals_.find(name);
      if (name.empty() || v == vals_.end())
        continue;
      if (v->second.ofMask)
        anyOfMask = true;
      else if (isMaskSource(v->second))
        anySource = true;
      else if (!v->second.isConst)
        return false; // computed at run time from other data: not a value of the mask alone
    }
    if (!anyOfMask && !anySource)
      return false;
    // Values of two different masks: computed at run time (the op as on any tensors).
    std::string root;
    for (const std::string& name : n.input()) {
      auto v = vals_.find(name);
      if (name.empty() || v == vals_.end() || v->second.isConst)
        continue;
      const std::string r = v->second.ofMask ? v->second.ofMask->mask : name;
      if (root.empty())
        root = r;
      const Val &a = vals_.at(root), &b = vals_.at(r);
      if (r != root && (a.v != b.v || a.shape != b.shape))
        return false;
    }
    if (!anyOfMask) { // the mask itself: its moves, casts and comparisons with 0 or 1 as before
      if (!elementwise || t == "Cast" || t == "Not")
        return false;
      static const std::set<std::string> kCompare = {"Equal", "Less", "LessOrEqual", "Greater",
                                                     "GreaterOrEqual"};
      if (kCompare.count(t)) {
        // Compared with anything but 0 or 1, the input is not a mask of 0s and 1s (token type
        // ids, positions): refused, as its values are assumed to be 0 and 1.
        const Val &a = in(n, 0), &b = in(n, 1);
        const Val& k = a.isConst ? a : b;
        for (size_t i = 0; k.isConst && i < count(k); ++i)
          if (at(k, i) != 0 && at(k, i) != 1)
            throw UnsupportedError{"a mask (0s and 1s) is compared with " +
                                   (count(k) == 1 ? formatDouble(at(k, 0)) : "a tensor") +
                                   "; fpat supports comparing it with 0 or 1"};
        if (t == "Equal" && count(k) == 1 && (a.intInput || b.intInput))
          return false;
      }
    }
    // Each input as (lo, hi, at), all constants; constants are their own lo and hi.
    std::string mask;
    std::vector<std::optional<Val>> lo(static_cast<size_t>(n.input_size())), hi = lo, idx = lo;
    for (int i = 0; i < n.input_size(); ++i) {
      if (!hasIn(n, i))
        continue;
      const Val& v = in(n, i);
      std::string from;
      const size_t k = static_cast<size_t>(i);
      if (v.ofMask) {
        from = v.ofMask->mask;
        lo[k] = *v.ofMask->lo;
        hi[k] = *v.ofMask->hi;
        idx[k] = *v.ofMask->at;
      } else if (isMaskSource(v)) {
        from = v.name;
        const std::vector<int64_t>& s = seenShape(v);
        lo[k] = constOf(s, std::vector<double>(static_cast<size_t>(numel(s)), 0.0), false);
        hi[k] = constOf(s, std::vector<double>(static_cast<size_t>(numel(s)), 1.0), false);
        idx[k] = broadcastIndices(v.shape, s);
      } else {
        idx[k] = constOf(v.shape, std::vector<double>(count(v), -1.0), false);
        continue;
      }
      if (mask.empty())
        mask = from;
    }
    Val l = foldWith(n, lo), h = foldWith(n, hi);
    if (l.shape != h.shape)
      throw UnsupportedError{"on a value of a mask its result's shape depends on the mask"};
    Val a;
    if (elementwise) { // each element reads the mask element its operands read
      std::vector<double> ix(static_cast<size_t>(numel(l.shape)), -1.0);
      for (const std::optional<Val>& x : idx) {
        if (!x)
          continue;
        const std::vector<double> e = valuesOf(broadcastConst(*x, l.shape));
        for (size_t j = 0; j < ix.size(); ++j) {
          if (e[j] >= 0 && ix[j] >= 0 && e[j] != ix[j])
            throw UnsupportedError{"it combines different elements of the mask '" + mask +
                                   "' in one element; fpat supports values that read one"};
          ix[j] = std::max(ix[j], e[j]);
        }
      }
      a = constOf(l.shape, std::move(ix), false);
    } else { // a move: the same move of the indices (constants' elements read none)
      std::vector<std::optional<Val>> subs(static_cast<size_t>(n.input_size()));
      for (int i : moved)
        if (i < n.input_size())
          subs[static_cast<size_t>(i)] = idx[static_cast<size_t>(i)];
      a = foldWith(n, subs);
    }
    Val v;
    v.shape = l.shape;
    auto of = std::make_shared<Val::OfMask>();
    of->mask = mask;
    of->lo = std::make_shared<const Val>(std::move(l));
    of->hi = std::make_shared<const Val>(std::move(h));
    of->at = std::make_shared<const Val>(std::move(a));
    v.ofMask = std::move(of);
    define(n, std::move(v));
    return true;
  }

  /// Shapes of a mask's elements in their order, as a value of `shape` may read them: its own,
  /// then its axes longer than 1 placed on axes of `shape` of the same size, in order, with
  /// unit axes between (views that move no element).
  static std::vector<std::vector<int64_t>> maskViews(const std::vector<int64_t>& own,
                                                     const std::vector<int64_t>& shape) {
    std::vector<std::vector<int64_t>> out{own};
    std::vector<int64_t> dims;
    for (int64_t d : own)
      if (d != 1)
        dims.push_back(d);
    std::vector<int64_t> view(shape.size(), 1);
    std::function<void(size_t, size_t)> place = [&](size_t i, size_t from) {
      if (i == dims.size()) {
        if (view != own)
          out.push_back(view);
        return;
      }
      for (size_t a = from; a < shape.size(); ++a)
        if (shape[a] == dims[i]) {
          view[a] = dims[i];
          place(i + 1, a + 1);
          view[a] = 1;
        }
    };
    place(0, 0);
    return out;
  }

  /// A value of a mask m made a tensor where `n` uses it: c + d m + (a + b m) fill, with
  /// constants c, d, a, b (a + b m: 1 where masked), fill float's lowest. An element of at most
  /// -1e9 (ir::kMaskedAtMost: finfo.min, -inf) is masked: the fill, which the softmax after it
  /// reads alike; the rest is exact. Every element must read the mask where the mask broadcast
  /// to it would (not a rearrangement).
  void materialize(Val& v, const NodeProto& n) {
    const Val::OfMask& o = *v.ofMask;
    const Val& m = vals_.at(o.mask);
    const std::vector<int64_t> shape = v.shape;
    const std::vector<double> lo = valuesOf(*o.lo), hi = valuesOf(*o.hi), at = valuesOf(*o.at);
    const std::string moved = "'" + v.name + "' " + shapeStr(shape) +
                              " moves the elements of the mask '" + o.mask + "' " +
                              shapeStr(m.shape) +
                              " it is computed from; fpat supports values of a mask that read "
                              "it where it broadcasts";
    const double lowest = -static_cast<double>(std::numeric_limits<float>::max());
    auto masked = [](double x) { return x <= ir::kMaskedAtMost; };
    auto depends = [&](size_t e) { // whether element e differs with the mask
      const bool k0 = !masked(lo[e]), k1 = !masked(hi[e]);
      return k0 != k1 || (k0 ? lo[e] : 0) != (k1 ? hi[e] : 0);
    };
    // The mask as `shape` reads it: as it broadcasts, or viewed with unit axes between its own
    // (HF GPTBigCode's [B, S, 1, S] mask, unsqueezed between the query and key axes, against its
    // padding mask's [B, 1, S]: the same elements, read where [B, 1, 1, S] would broadcast).
    std::vector<int64_t> view;
    std::vector<double> want;
    for (const std::vector<int64_t>& cand : maskViews(m.shape, shape)) {
      if (auto b = ir::broadcastShapes(cand, shape); !b || *b != shape)
        continue;
      want = valuesOf(broadcastIndices(cand, shape));
      bool reads = true;
      for (size_t e = 0; e < lo.size() && reads; ++e)
        reads = !depends(e) || at[e] == want[e];
      if (reads) {
        view = cand;
        break;
      }
    }
    if (view.empty())
      throw UnsupportedError{moved};
    std::vector<double> c(lo.size()), d(lo.size()), a(lo.size()), b(lo.size());
    bool anyD = false, anyB = false, anyC = false;
    for (size_t e = 0; e < lo.size(); ++e) {
      for (double x : {lo[e], hi[e]})
        if (std::isnan(x) || x >= 1e30)
          throw UnsupportedError{"'" + v.name + "', computed from the mask '" + o.mask +
                                 "', holds " + formatDouble(x) +
                                 "; fpat supports finite values and masked ones (at most -1e9)"};
      const bool k0 = !masked(lo[e]), k1 = !masked(hi[e]);
      const double f0 = k0 ? lo[e] : 0, f1 = k1 ? hi[e] : 0;
      c[e] = f0;
      d[e] = f1 - f0;
      a[e] = k0 ? 0 : 1;
      b[e] = (k0 ? 1 : 0) - (k1 ? 1 : 0);
      anyD = anyD || d[e] != 0;
      anyB = anyB || b[e] != 0;
    }
    // Masked alike either way: the fill in the constant (as a causal mask's is, which the flash
    // kernel recognises); otherwise (1 - keep) fill, the fill a scalar that stays finite in the
    // run's type, so that a row masked whole reads as the model's does (finfo.min, not -inf).
    for (size_t e = 0; e < c.size(); ++e) {
      if (!anyB && a[e] != 0)
        c[e] = lowest;
      anyC = anyC || c[e] != 0;
    }
    const std::string base = v.name + ".of_mask";
    auto named = [&](const std::string& suffix, Val k) {
      const std::string name = base + suffix;
      k.name = name;
      vals_[name] = std::move(k);
      return name;
    };
    // A constant of `shape`, a scalar where all its elements are equal.
    auto konst = [&](const std::string& suffix, const std::vector<double>& x) {
      const bool uniform = std::all_of(x.begin(), x.end(), [&](double y) { return y == x[0]; });
      return named(suffix, uniform ? constOf({}, {x[0]}, false) : constOf(shape, x, false));
    };
    std::string src = o.mask; // the mask, viewed as `shape` reads it
    if (view != m.shape) {
      std::vector<double> dims(view.begin(), view.end());
      src = base + ".view";
      convertAs(n, "Reshape",
                {o.mask, named(".view_shape", constOf({static_cast<int64_t>(view.size())},
                                                      std::move(dims), true))},
                src, "");
    }
    std::vector<std::string> terms;
    if (anyC)
      terms.push_back(konst(".c", c));
    if (anyD) {
      convertAs(n, "Mul", {src, konst(".d", d)}, base + ".dm", "");
      terms.push_back(base + ".dm");
    }
    if (anyB) {
      bool plain = true, inverted = true; // m itself, or 1 - m, wherever it reads the mask
      for (size_t e = 0; e < a.size(); ++e) {
        plain = plain && a[e] == 0 && b[e] == 1;
        inverted = inverted && a[e] == 1 && b[e] == -1;
      }
      std::string drop = src;
      if (inverted) {
        drop = base + ".drop";
        convertAs(n, "Sub", {named(".one", constOf({}, {1.0}, false)), src}, drop, "");
      } else if (!plain) {
        convertAs(n, "Mul", {src, konst(".b", b)}, base + ".bm", "");
        drop = base + ".bm";
        if (std::any_of(a.begin(), a.end(), [](double x) { return x != 0; })) {
          drop = base + ".drop";
          convertAs(n, "Add", {konst(".a", a), base + ".bm"}, drop, "");
        }
      }
      convertAs(n, "Mul", {drop, named(".fill", constOf({}, {lowest}, false))}, base + ".bias", "");
      terms.push_back(base + ".bias");
    }
    Val out;
    if (terms.empty()) {
      out = constOf({}, {0.0}, false);
    } else {
      std::string sum = terms[0];
      for (size_t i = 1; i < terms.size(); ++i) {
        const std::string next = base + ".sum" + std::to_string(i);
        convertAs(n, "Add", {sum, terms[i]}, next, "");
        sum = next;
      }
      out = vals_.at(sum);
    }
    if (out.isConst) {
      out = broadcastConst(out, shape);
    } else if (out.shape != shape) { // m times scalars: the mask's shape, broadcast by its users
      out.lazyExpand = true;
      out.expandedTo = shape;
    }
    // Of only 0s and 1s it is a mask again (GPT-2's padding mask Or-ed with the causal one, given
    // to masked_fill): bool or integer as the model computed it, else float data of 0s and 1s.
    auto binary = [](double x) { return x == 0 || x == 1; };
    if (!out.isConst && std::all_of(lo.begin(), lo.end(), binary) &&
        std::all_of(hi.begin(), hi.end(), binary)) {
      out.intInput = o.lo->integer;
      out.binary01 = !o.lo->integer;
    }
    out.name = v.name;
    out.madeFrom = v.ofMask;
    v = std::move(out);
  }

  /// Ops on a run-time mask m of 0s and 1s (an integer or bool input): its moves (Reshape,
  /// Slice, Unsqueeze, ...) as on any tensor; Expand left to the broadcasting op after it;
  /// Equal with 0 is 1 - m, with 1 m itself; Not is 1 - m; Where(m, x, fill) is x + (1 - m)
  /// fill and Where(m, fill, x) is x + m fill, the fill a scalar of at most -1e9 or -inf
  /// (masked_fill with finfo.min or -1e9), taken as float's lowest (-inf times 0 would be NaN):
  /// the softmax after it gives the masked keys no weight, as the fill itself does.
  void maskOp(const NodeProto& n) {
    const std::string& t = n.op_type();
    if (n.output_size() < 1 || n.output(0).empty())
      throw UnsupportedError{"it has no output"};
    if (t == "Expand") {
      Val v = in(n, 0);
      std::vector<int64_t> target;
      for (double d : valuesOf(constIn(n, 1, "its shape")))
        target.push_back(static_cast<int64_t>(d));
      v.expandedTo = broadcast(v.shape, target); // throws where they do not broadcast
      v.lazyExpand = true;
      return define(n, std::move(v));
    }
    if (t == "Equal" || t == "Not") {
      const int mi = t == "Equal" && !in(n, 0).intInput ? 1 : 0;
      if (t == "Equal") {
        const Val& k = constIn(n, 1 - mi, "the value the mask is compared with");
        if (count(k) != 1 || (at(k, 0) != 0 && at(k, 0) != 1))
          throw UnsupportedError{"a mask (0s and 1s) is compared with " +
                                 (count(k) == 1 ? formatDouble(at(k, 0)) : "a tensor") +
                                 "; fpat supports comparing it with 0 or 1"};
        if (at(k, 0) == 1) { // the mask itself
          Val v = in(n, mi);
          return define(n, std::move(v));
        }
      }
      const Val& m = in(n, mi);
      const bool lazy = m.lazyExpand;
      const std::vector<int64_t> to = m.expandedTo;
      const std::string name = m.name;
      convertAs(n, "Sub", {scalarConst(n, ".one", 1.0), name}, n.output(0), ".not");
      Val& v = vals_[n.output(0)];
      v.intInput = true;
      v.lazyExpand = lazy;
      v.expandedTo = to;
      return;
    }
    if (t == "Where") {
      if (!in(n, 0).intInput || in(n, 1).intInput || in(n, 2).intInput)
        throw UnsupportedError{"a mask (0s and 1s) is one of its choices; fpat supports it "
                               "only as the condition"};
      const bool fillFirst = in(n, 1).isConst;
      const Val& fill = in(n, fillFirst ? 1 : 2);
      const Val& x = in(n, fillFirst ? 2 : 1);
      if (x.isConst || !fill.isConst || count(fill) != 1 || fill.integer ||
          !(at(fill, 0) <= ir::kMaskedAtMost))
        throw UnsupportedError{"with a run-time mask as its condition, fpat supports one choice "
                               "computed at run time and the other a scalar of -inf or at most "
                               "-1e9 (masked_fill with finfo.min or -1e9)"};
      const double f =
          std::max(at(fill, 0), -static_cast<double>(std::numeric_limits<float>::max()));
      if (x.queryMajor) { // the mask made again in the IR's order, the fill added there
        if (std::optional<ir::Vertex> vm = irOrderMask(n, in(n, 0), x)) {
          ir::Op sub, mul;
          sub.kind = ir::OpKind::Sub;
          mul.kind = ir::OpKind::Mul;
          const std::vector<int64_t> ms = g_.op(*vm).type.shape;
          Val one = constOf({}, {1.0}, false), fillValue = constOf({}, {f}, false);
          const ir::Vertex drop =
              fillFirst ? *vm : *emit(n, sub, {tensor(one), *vm}, ms, 0, n.output(0) + ".drop").v;
          const ir::Vertex bias =
              *emit(n, mul, {drop, tensor(fillValue)}, ms, 0, n.output(0) + ".bias").v;
          return define(n, sameForm(n, ir::OpKind::Add, x, {*x.v, bias}));
        }
      }
      const std::string m = n.input(0), xs = x.name, keep = n.output(0) + ".keep",
                        bias = n.output(0) + ".bias";
      if (fillFirst) { // the fill where m is 1
        convertAs(n, "Mul", {m, scalarConst(n, ".fill", f)}, bias, ".bias");
      } else { // the fill where m is 0
        convertAs(n, "Sub", {scalarConst(n, ".one", 1.0), m}, keep, ".keep");
        convertAs(n, "Mul", {keep, scalarConst(n, ".fill", f)}, bias, ".bias");
      }
      return convertAs(n, "Add", {xs, bias}, n.output(0), "");
    }
    // The moves: as on any tensor, and still a mask.
    converters().at(t)(*this, n);
    for (const std::string& out : n.output())
      if (auto v = vals_.find(out); v != vals_.end())
        v->second.intInput = true;
  }

  /// Clip(x, lo, hi) (torch.clamp: MPT's clip_qkv, ReLU6) is Min(Max(x, lo), hi); its bounds
  /// are attributes before opset 11, optional scalar inputs since.
  void clip(const NodeProto& n) {
    if (n.output_size() < 1 || n.output(0).empty())
      throw UnsupportedError{"it has no output"};
    std::optional<double> lo, hi;
    if (r_.opset < 11) {
      if (attr(n, "min"))
        lo = floatAttr(n, "min", 0);
      if (attr(n, "max"))
        hi = floatAttr(n, "max", 0);
    } else {
      for (int i = 1; i < 3; ++i) {
        if (!hasIn(n, i))
          continue;
        const Val& b = constIn(n, i, i == 1 ? "its lower bound" : "its upper bound");
        if (count(b) != 1)
          throw UnsupportedError{"its bounds must be scalars"};
        (i == 1 ? lo : hi) = at(b, 0);
      }
    }
    if (lo && hi && *lo > *hi)
      throw UnsupportedError{"its lower bound " + formatDouble(*lo) + " is above its upper bound " +
                             formatDouble(*hi)};
    std::string cur = n.input(0);
    if (lo) {
      const std::string out = hi ? n.output(0) + ".lo" : n.output(0);
      convertAs(n, "Max", {cur, scalarConst(n, ".min", *lo)}, out, hi ? ".lo" : "");
      cur = out;
    }
    if (hi)
      convertAs(n, "Min", {cur, scalarConst(n, ".max", *hi)}, n.output(0), "");
    if (!lo && !hi) {
      Val v = in(n, 0);
      define(n, std::move(v));
    }
  }

  void identity(const NodeProto& n) { // Identity, and Dropout at inference
    Val v = in(n, 0);
    define(n, std::move(v));
  }

  void cast(const NodeProto& n) {
    Val v = in(n, 0);
    const int to = static_cast<int>(intAttr(n, "to", 0));
    if (v.intInput || v.binary01) { // a mask: to float data of 0s and 1s, to an integer a mask
      v.intInput = !isFloatType(to);
      v.binary01 = !v.intInput;
      return define(n, std::move(v));
    }
    if (!isFloatType(to) && !v.isConst)
      throw UnsupportedError{std::string("casting to ") + dataTypeName(to) +
                             " is not supported (fpat computes in one float type)"};
    if (v.isConst && isFloatType(to)) {
      v.integer = false;    // Range(...) cast to float: data from here on
    } else if (v.isConst) { // to an integer type (T5's buckets: a float constant truncated)
      if (v.data.empty() && v.fdata)
        v.data.assign(v.fdata->begin(), v.fdata->end());
      v.fdata.reset();
      // Beyond the integer type's range (log(0) = -inf in T5's buckets, a value the model
      // then discards): its lowest value, as torch computes it on x86.
      const double lo = to == TensorProto::INT32 ? -2147483648.0 : -9223372036854775808.0;
      for (double& d : v.data)
        d = to == TensorProto::BOOL                  ? (d != 0 ? 1 : 0)
            : std::isfinite(d) && std::fabs(d) < -lo ? std::trunc(d)
                                                     : lo;
      v.integer = true;
    }
    define(n, std::move(v)); // the whole graph computes in one precision
  }

  void constant(const NodeProto& n) {
    Val v;
    if (const AttributeProto* a = attr(n, "value")) {
      if (std::string why = decodeTensor(a->t(), v); !why.empty())
        throw UnsupportedError{"its value: " + why};
    } else if (const AttributeProto* f = attr(n, "value_float")) {
      v.isConst = true;
      v.data = {f->f()};
    } else if (const AttributeProto* fs = attr(n, "value_floats")) {
      v.isConst = true;
      v.data.assign(fs->floats().begin(), fs->floats().end());
      v.shape = {static_cast<int64_t>(v.data.size())};
    } else if (const AttributeProto* i = attr(n, "value_int")) {
      v.isConst = v.integer = true;
      v.data = {static_cast<double>(i->i())};
    } else if (const AttributeProto* is = attr(n, "value_ints")) {
      v.isConst = v.integer = true;
      v.data.assign(is->ints().begin(), is->ints().end());
      v.shape = {static_cast<int64_t>(v.data.size())};
    } else {
      throw UnsupportedError{"it has no value (value, value_float(s) or value_int(s))"};
    }
    define(n, std::move(v));
  }

  // --- Shape arithmetic: what exporters write around view/reshape (x.size(), x.view(-1, d)),
  // folded here once the sizes are known (--dim binds a symbolic one). Each takes constants
  // (shapes, axes, weights) and makes a constant; on values computed at run time it says so.

  /// A constant of `shape` holding `values`: integers (shapes, indices) or floats.
  static Val constOf(std::vector<int64_t> shape, std::vector<double> values, bool integer) {
    Val v;
    v.isConst = true;
    v.integer = integer;
    v.shape = std::move(shape);
    if (integer || values.size() <= 1)
      v.data = std::move(values);
    else
      v.fdata = std::make_shared<std::vector<float>>(values.begin(), values.end());
    return v;
  }

  static std::vector<double> valuesOf(const Val& v) {
    std::vector<double> out(count(v));
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = at(v, i);
    return out;
  }

  Val& constIn(const NodeProto& n, int i, const char* what) {
    Val& v = in(n, i);
    if (!v.isConst)
      throw UnsupportedError{std::string(what) + " '" + v.name +
                             "' is computed at run time; only constants (shapes, axes, "
                             "weights) are supported here"};
    return v;
  }

  /// Guards the constants these ops make: shapes and masks, not tensors of data.
  static void checkConstSize(const std::vector<int64_t>& shape) {
    if (numel(shape) > (int64_t{1} << 28))
      throw UnsupportedError{"its result " + shapeStr(shape) + " is too large to fold at import"};
  }

  void shapeOf(const NodeProto& n) {
    const std::vector<int64_t> dims = seenShape(in(n, 0)); // known: --dim bound every symbol
    const int64_t r = static_cast<int64_t>(dims.size());
    auto clampAxis = [r](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + r : a, 0, r); };
    const int64_t from = clampAxis(intAttr(n, "start", 0)), to = clampAxis(intAttr(n, "end", r));
    std::vector<double> out;
    for (int64_t i = from; i < to; ++i)
      out.push_back(static_cast<double>(dims[static_cast<size_t>(i)]));
    const int64_t len = static_cast<int64_t>(out.size());
    define(n, constOf({len}, std::move(out), true));
  }

  void gather(const NodeProto& n) {
    if (in(n, 0).parts > 1)
      return partsGather(n);
    if (headAxis(in(n, 0)) >= 0)
      return headsGather(n);
    if (!in(n, 0).isConst)
      throw UnsupportedError{"only a gather from a constant (a shape, a weight) is supported; '" +
                             in(n, 0).name +
                             "' is computed at run time (an embedding lookup, a column pick)"};
    const Val& d = in(n, 0);
    const Val& idx = constIn(n, 1, "its indices");
    if (d.shape.empty())
      throw UnsupportedError{"it gathers from a scalar"};
    const size_t axis = static_cast<size_t>(normAxis(intAttr(n, "axis", 0), d.shape.size()));
    std::vector<int64_t> shape(d.shape.begin(), d.shape.begin() + static_cast<long>(axis));
    shape.insert(shape.end(), idx.shape.begin(), idx.shape.end());
    shape.insert(shape.end(), d.shape.begin() + static_cast<long>(axis) + 1, d.shape.end());
    checkConstSize(shape);
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < d.shape.size(); ++i)
      (i < axis ? outer : inner) *= i == axis ? 1 : d.shape[i];
    const int64_t dim = d.shape[axis];
    std::vector<double> out;
    out.reserve(static_cast<size_t>(numel(shape)));
    for (int64_t o = 0; o < outer; ++o)
      for (size_t k = 0; k < count(idx); ++k) {
        auto j = static_cast<int64_t>(at(idx, k));
        if (j < -dim || j >= dim)
          throw UnsupportedError{"index " + std::to_string(j) + " is out of range for " +
                                 shapeStr(d.shape) + " at axis " + std::to_string(axis)};
        j = j < 0 ? j + dim : j;
        for (int64_t i = 0; i < inner; ++i)
          out.push_back(at(d, static_cast<size_t>((o * dim + j) * inner + i)));
      }
    define(n, constOf(std::move(shape), std::move(out), d.integer));
  }

  /// Slice of a constant: starts, ends, axes, steps as inputs (opset 10+) or attributes.
  /// Slice's window over a value of shape `in`: the first index and step of every axis, and
  /// the result's shape (ONNX's clamping).
  struct SliceWindow {
    std::vector<int64_t> first, step, shape;
  };
  SliceWindow sliceWindow(const NodeProto& n, const std::vector<int64_t>& in) {
    const int64_t rank = static_cast<int64_t>(in.size());
    auto list = [&](int input, const char* name) {
      std::vector<double> v;
      if (const AttributeProto* a = attr(n, name))
        v.assign(a->ints().begin(), a->ints().end());
      else if (hasIn(n, input))
        v = valuesOf(constIn(n, input, name));
      return v;
    };
    const std::vector<double> starts = list(1, "starts"), ends = list(2, "ends");
    std::vector<double> axes = list(3, "axes"), steps = list(4, "steps");
    if (starts.size() != ends.size())
      throw UnsupportedError{"its starts and ends differ in length"};
    if (axes.empty())
      for (size_t i = 0; i < starts.size(); ++i)
        axes.push_back(static_cast<double>(i));
    if (steps.empty())
      steps.assign(starts.size(), 1.0);
    if (axes.size() != starts.size() || steps.size() != starts.size())
      throw UnsupportedError{"its axes or steps differ in length from its starts"};
    SliceWindow w{std::vector<int64_t>(static_cast<size_t>(rank), 0),
                  std::vector<int64_t>(static_cast<size_t>(rank), 1), in};
    std::set<int64_t> seen;
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t a = normAxis(static_cast<int64_t>(axes[i]), in.size());
      if (!seen.insert(a).second)
        throw UnsupportedError{"it slices axis " + std::to_string(a) + " twice"};
      const double dim = static_cast<double>(in[static_cast<size_t>(a)]), st = steps[i];
      if (st == 0)
        throw UnsupportedError{"its step is 0"};
      // ONNX's clamping, in double: the exporters write INT64_MAX for "to the end".
      double b = starts[i] < 0 ? starts[i] + dim : starts[i];
      double e = ends[i] < 0 ? ends[i] + dim : ends[i];
      b = st > 0 ? std::clamp(b, 0.0, dim) : std::clamp(b, 0.0, dim - 1);
      e = st > 0 ? std::clamp(e, 0.0, dim) : std::clamp(e, -1.0, dim - 1);
      const double len = st > 0 ? std::ceil((e - b) / st) : std::ceil((b - e) / -st);
      w.first[static_cast<size_t>(a)] = static_cast<int64_t>(b);
      w.step[static_cast<size_t>(a)] = static_cast<int64_t>(st);
      w.shape[static_cast<size_t>(a)] = std::max<int64_t>(0, static_cast<int64_t>(len));
    }
    return w;
  }

  void slice(const NodeProto& n) {
    if (const Val& x = in(n, 0); numel(x.shape) > 0) {
      try { // (a window that is no window is reported below, by the form that takes it)
        const SliceWindow w = sliceWindow(n, x.shape);
        for (size_t k = 0; k < w.shape.size() && k < x.shape.size(); ++k)
          if (w.shape[k] == 0) {
            emptied_.emplace(n.output(0), "node '" + nodeName(n) +
                                              "' (Slice) keeps nothing of axis " +
                                              std::to_string(k) + " of '" + n.input(0) + "' " +
                                              shapeStr(x.shape));
            break;
          }
      } catch (const UnsupportedError&) {
      }
    }
    if (!in(n, 0).isConst) {
      // An empty window of an activation (x[..., rot:] where the rotary covers the whole
      // head): no elements, which a Concat then drops.
      const SliceWindow w = sliceWindow(n, in(n, 0).shape);
      if (numel(w.shape) == 0)
        return define(n, constOf(w.shape, {}, false));
    }
    if (in(n, 0).view != Val::View::None)
      return headsSlice(n);
    if (!in(n, 0).isConst) {
      // Columns of an activation (torch.chunk of a fused projection: MPT, Phi): an IR slice.
      Val& x = in(n, 0);
      const SliceWindow w = sliceWindow(n, x.shape);
      bool columns = !x.shape.empty() && w.step.back() == 1 && w.shape.back() > 0;
      for (size_t k = 0; columns && k + 1 < x.shape.size(); ++k)
        columns = w.first[k] == 0 && w.shape[k] == x.shape[k];
      if (!columns)
        throw UnsupportedError{"of an activation ('" + x.name + "' " + shapeStr(x.shape) +
                               ", computed at run time) fpat slices only the last axis, in "
                               "steps of 1 (the columns), or heads (RoPE's halves)"};
      if (w.shape == x.shape) { // every column: the value itself, no copy
        Val v = x;
        return define(n, std::move(v));
      }
      ir::Op op;
      op.kind = ir::OpKind::Slice;
      op.begin = w.first.back();
      op.end = w.first.back() + w.shape.back();
      return define(n, emit(n, op, {tensor(x)}, w.shape));
    }
    define(n, constWindow(in(n, 0), sliceWindow(n, in(n, 0).shape)));
  }

  /// The elements of constant `d` in window `w`.
  Val constWindow(const Val& d, const SliceWindow& w) {
    const std::vector<int64_t>&first = w.first, &step = w.step, &shape = w.shape;
    checkConstSize(shape);
    std::vector<double> out;
    std::vector<int64_t> idx(d.shape.size(), 0);
    const int64_t total = numel(shape);
    for (int64_t t = 0; t < total; ++t) {
      int64_t src = 0;
      for (size_t k = 0; k < idx.size(); ++k)
        src = src * d.shape[k] + first[k] + idx[k] * step[k];
      out.push_back(at(d, static_cast<size_t>(src)));
      nextIndex(idx, shape);
    }
    return constOf(shape, std::move(out), d.integer);
  }

  /// Tile of a constant (BLOOM's ALiBi slopes repeated for each sequence of the batch).
  void tile(const NodeProto& n) {
    const Val& d = in(n, 0);
    if (!d.isConst)
      throw UnsupportedError{"only a constant is tiled at import; '" + d.name +
                             "' is computed at run time"};
    const std::vector<double> reps = valuesOf(constIn(n, 1, "its repeats"));
    if (reps.size() != d.shape.size())
      throw UnsupportedError{"it has " + std::to_string(reps.size()) + " repeats for " +
                             std::to_string(d.shape.size()) + " axes"};
    std::vector<int64_t> shape = d.shape;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (reps[k] < 0)
        throw UnsupportedError{"its repeats must not be negative"};
      shape[k] *= static_cast<int64_t>(reps[k]);
    }
    checkConstSize(shape);
    std::vector<double> out;
    out.reserve(static_cast<size_t>(numel(shape)));
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t t = 0, total = numel(shape); t < total; ++t) {
      int64_t src = 0;
      for (size_t k = 0; k < idx.size(); ++k)
        src = src * d.shape[k] + idx[k] % d.shape[k];
      out.push_back(at(d, static_cast<size_t>(src)));
      nextIndex(idx, shape);
    }
    define(n, constOf(std::move(shape), std::move(out), d.integer));
  }

  /// The axis of a head view's ONNX shape that counts heads, where a range of heads is a range
  /// of the token-major activation's columns: 2 of [B, S, H, d], 1 of [B, H, S, d]; else -1.
  int64_t headAxis(const Val& x) const {
    if (x.flatBH || x.repeat != 1 || x.shape.size() != 4 || !x.v ||
        g_.op(*x.v).type.shape.size() != 2)
      return -1;
    return x.view == Val::View::Tokens ? 2 : x.view == Val::View::Heads ? 1 : -1;
  }

  /// Heads [first, first + count) of `x` (headAxis >= 0; Falcon's fused q, k, v viewed as
  /// [B, S, H + 2, d]: f[:, :, :-2], f[:, :, [-2]]): a slice of the activation's columns, a
  /// head view again (keepAxis) or, the axis dropped by a scalar index, the activation of one
  /// head.
  Val headColumns(const NodeProto& n, const Val& x, int64_t first, int64_t count, bool keepAxis,
                  int output = 0) {
    ir::Op op;
    op.kind = ir::OpKind::Slice;
    op.begin = first * x.headDim;
    op.end = (first + count) * x.headDim;
    std::vector<int64_t> t = g_.op(*x.v).type.shape;
    t.back() = count * x.headDim;
    Val v = emit(n, op, {*x.v}, t, output);
    if (keepAxis) {
      const ir::Vertex vertex = *v.v;
      v = x;
      v.v = vertex;
      v.other.reset();
      v.heads = count;
      v.shape[static_cast<size_t>(headAxis(x))] = count;
    } else {
      v.shape = {x.batch, x.seq, x.headDim};
    }
    return v;
  }

  /// Gather of consecutive heads by constant indices (Falcon's multi-query k and v).
  void headsGather(const NodeProto& n) {
    const Val& x = in(n, 0);
    const Val& idx = constIn(n, 1, "its indices");
    const int64_t axis = normAxis(intAttr(n, "axis", 0), x.shape.size());
    if (axis != headAxis(x) || idx.shape.size() > 1 || count(idx) == 0)
      throw UnsupportedError{"of gathers from '" + x.name + "' " + shapeStr(x.shape) +
                             ", an activation split into heads, only those of consecutive "
                             "heads by a scalar or a list of indices are supported"};
    const int64_t dim = x.shape[static_cast<size_t>(axis)];
    std::vector<int64_t> heads;
    for (size_t k = 0; k < count(idx); ++k) {
      auto j = static_cast<int64_t>(at(idx, k));
      if (j < -dim || j >= dim)
        throw UnsupportedError{"index " + std::to_string(j) + " is out of range for " +
                               shapeStr(x.shape) + " at axis " + std::to_string(axis)};
      heads.push_back(j < 0 ? j + dim : j);
      if (k > 0 && heads[k] != heads[k - 1] + 1)
        throw UnsupportedError{"its heads " + shapeStr(heads) + " are not consecutive"};
    }
    define(n, headColumns(n, x, heads[0], static_cast<int64_t>(heads.size()), !idx.shape.empty()));
  }

  /// A slice of heads along their last axis (RoPE's halves, rotate_half): the IR's slice of
  /// columns, on the Dense4 tensor.
  void headsSlice(const NodeProto& n) {
    Val& x = in(n, 0);
    const SliceWindow w = sliceWindow(n, x.shape);
    if (const int64_t h = headAxis(x); h >= 0) {
      const auto ha = static_cast<size_t>(h);
      bool others = true; // the window keeps every axis whole but the heads'
      for (size_t k = 0; k < w.shape.size(); ++k)
        others = others && (k == ha || w.shape[k] == x.shape[k]);
      if (others && w.shape[ha] != x.shape[ha]) {
        if (w.step[ha] != 1 || w.shape[ha] == 0)
          throw UnsupportedError{"of slices of the heads of '" + x.name + "' " + shapeStr(x.shape) +
                                 ", only contiguous, non-empty ones are supported (step 1)"};
        define(n, headColumns(n, x, w.first[ha], w.shape[ha], true));
        return;
      }
    }
    for (size_t k = 0; k + 1 < w.shape.size(); ++k)
      if (w.shape[k] != x.shape[k])
        throw UnsupportedError{"of slices of an activation split into heads ('" + x.name + "' " +
                               shapeStr(x.shape) +
                               "), only those along the last axis or the heads' axis are "
                               "supported"};
    if (w.step.back() == 2 && w.first.back() < 2 && x.shape.back() % 2 == 0 &&
        w.shape.back() == x.shape.back() / 2) { // every other element (GPT-J's rotary)
      Val v = x;
      v.shape = w.shape;
      v.everyOther = Val::EveryOther{x.name, static_cast<int>(w.first.back())};
      return define(n, std::move(v));
    }
    if (w.step.back() != 1 || w.shape.back() == 0)
      throw UnsupportedError{"of slices of an activation split into heads ('" + x.name + "' " +
                             shapeStr(x.shape) +
                             "), only contiguous, non-empty ones are "
                             "supported (step 1)"};
    Val v = dense4(n, x);
    if (w.shape == x.shape) // the whole head (Qwen2's x[..., :rot] with rot = d): no copy
      return define(n, std::move(v));
    ir::Op op;
    op.kind = ir::OpKind::Slice;
    op.begin = w.first.back();
    op.end = w.first.back() + w.shape.back();
    std::vector<int64_t> t = g_.op(*v.v).type.shape;
    t.back() = w.shape.back();
    v.v = emit(n, op, {*v.v}, t).v;
    v.shape = w.shape;
    v.headDim = w.shape.back();
    define(n, std::move(v));
  }

  /// Heads joined along their own axis where they are consecutive heads of one activation,
  /// each repeated alike (torch 1.13's export of repeat_interleave on the heads: each KV head
  /// split off, repeated by Unsqueeze, Expand and Reshape, the repeats joined): the heads of
  /// that activation, GQA where repeated. False: not a concatenation along the head axis.
  bool headsRejoin(const NodeProto& n) {
    using View = Val::View;
    const Val& a = in(n, 0);
    if (a.flatBH || a.shape.size() != 4 || (a.view != View::Tokens && a.view != View::Heads) ||
        normAxis(intAttr(n, "axis", 0), 4) != (a.view == View::Tokens ? 2 : 1))
      return false;
    const auto axis = static_cast<size_t>(a.view == View::Tokens ? 2 : 1);
    std::optional<ir::Vertex> src;
    int64_t begin = 0, end = 0, heads = 0;
    for (int i = 0; i < n.input_size(); ++i) {
      const Val& p = in(n, i);
      if (p.view != a.view || p.flatBH || p.repeat != a.repeat || p.batch != a.batch ||
          p.seq != a.seq || p.headDim != a.headDim || !p.v)
        throw UnsupportedError{"it joins heads of different layouts ('" + a.name + "' " +
                               shapeStr(a.shape) + " and '" + p.name + "' " + shapeStr(p.shape) +
                               ")"};
      const ir::Op& op = g_.op(*p.v);
      const std::vector<ir::Vertex> operands = g_.operands(*p.v);
      if (op.kind != ir::OpKind::Slice || operands.size() != 1 ||
          (src && (operands[0] != *src || op.begin != end)))
        throw UnsupportedError{"of concatenations of heads along their axis, only those of "
                               "consecutive heads of one activation are supported"};
      if (!src) {
        src = operands[0];
        begin = op.begin;
      }
      end = op.end;
      heads += p.heads;
    }
    Val v = a;
    v.other.reset();
    v.heads = heads;
    v.shape[axis] = heads;
    if (begin == 0 && end == g_.op(*src).type.shape.back()) {
      v.v = src;
    } else {
      ir::Op op;
      op.kind = ir::OpKind::Slice;
      op.begin = begin;
      op.end = end;
      std::vector<int64_t> t = g_.op(*src).type.shape;
      t.back() = end - begin;
      v.v = emit(n, op, {*src}, t).v;
    }
    define(n, std::move(v));
    return true;
  }

  static std::string everyOtherRefusal(const Val& e) {
    return "'" + e.name + "' " + shapeStr(e.shape) +
           " is built from every other element of the last axis of '" + e.everyOther->of +
           "'; fpat supports that only as GPT-J's rotate_every_two: stack(-x[..., 1::2], "
           "x[..., ::2], dim=-1).flatten(-2)";
  }

  /// GPT-J's rotate_every_two on a head value x: stack(-x[..., 1::2], x[..., ::2], -1) flattened
  /// is a rope of pairs with cos 0 and sin 1 (raise_rope_pairs makes x * cos + it * sin one
  /// rope); stack(x[..., ::2], x[..., 1::2]) is x. Returns whether `n` read such a value.
  bool everyOtherOp(const NodeProto& n) {
    const Val* e = nullptr;
    for (const std::string& name : n.input())
      if (auto v = vals_.find(name); !e && v != vals_.end() && v->second.everyOther)
        e = &v->second;
    if (!e)
      return false;
    const std::string& t = n.op_type();
    const Val::EveryOther eo = *e->everyOther;
    const std::string refusal = everyOtherRefusal(*e);
    const int64_t rank = static_cast<int64_t>(e->shape.size());
    if ((t == "Neg" || t == "Unsqueeze") && !eo.stacked && !eo.joined) {
      Val v = *e;
      if (t == "Neg") {
        v.everyOther->negated = !eo.negated;
      } else {
        const std::vector<int64_t> axes = axesOf(n, 1);
        if (axes.size() != 1 || normAxis(axes[0], e->shape.size() + 1) != rank)
          throw UnsupportedError{refusal};
        v.shape.push_back(1);
        v.everyOther->stacked = true;
      }
      define(n, std::move(v));
      return true;
    }
    if (t == "Concat" && n.input_size() == 2 && eo.stacked) {
      const Val &a = in(n, 0), &b = in(n, 1);
      if (!a.everyOther || !b.everyOther || !a.everyOther->stacked || !b.everyOther->stacked ||
          a.everyOther->of != b.everyOther->of ||
          normAxis(intAttr(n, "axis", 0), e->shape.size()) != rank - 1)
        throw UnsupportedError{refusal};
      const Val::EveryOther &p = *a.everyOther, &q = *b.everyOther;
      Val v = dense4(n, vals_.at(p.of));
      if (p.parity == 1 && q.parity == 0 && p.negated != q.negated) {
        ir::Op op;
        op.kind = ir::OpKind::Rope;
        op.interleaved = true;
        Val c = constOf({}, {0.0}, false), s = constOf({}, {p.negated ? 1.0 : -1.0}, false);
        c.name = n.output(0) + ".cos";
        s.name = n.output(0) + ".sin";
        const ir::Vertex vx = *v.v, vc = tensor(c), vs = tensor(s);
        v.v = emit(n, op, {vx, vc, vs}, g_.op(vx).type.shape).v;
      } else if (!(p.parity == 0 && q.parity == 1 && !p.negated && !q.negated)) {
        throw UnsupportedError{refusal};
      }
      v.shape = a.shape;
      v.shape.back() = 2;
      v.everyOther = Val::EveryOther{p.of, 0, false, true, true};
      define(n, std::move(v));
      return true;
    }
    if (t == "Reshape" && eo.joined) {
      // Only the flattening of the last two axes: [..., d / 2, 2] to [..., d].
      std::vector<int64_t> want(e->shape.begin(), e->shape.end() - 2);
      want.push_back(e->shape[e->shape.size() - 2] * 2);
      if (reshapeTarget(n, e->shape) != want)
        throw UnsupportedError{refusal};
      Val v = *e;
      v.shape = want;
      v.everyOther.reset();
      define(n, std::move(v));
      return true;
    }
    throw UnsupportedError{refusal};
  }

  /// A rank-4 activation given as a graph input [B, H, S, d] that `n` reads as attention's K
  /// (transposed for Q K^T, or repeat_kv's Unsqueeze at axis 2) or V (MatMul's B): a cache
  /// given whole (cross-attention's encoder keys and values, Whisper's and BART's
  /// past_key_value[2:4]), read head-major in place.
  void givenCache(const NodeProto& n) {
    const std::string& t = n.op_type();
    int i = -1;
    if (t == "MatMul") {
      i = 1;
    } else if (t == "Transpose") {
      const AttributeProto* p = attr(n, "perm");
      if (p && std::vector<int64_t>(p->ints().begin(), p->ints().end()) ==
                   std::vector<int64_t>{0, 1, 3, 2})
        i = 0;
    } else if (t == "Unsqueeze" && n.input_size() > 0 && !in(n, 0).isConst &&
               in(n, 0).shape.size() == 4 && axesOf(n, 1) == std::vector<int64_t>{2}) {
      i = 0;
    }
    if (i < 0 || !hasIn(n, i))
      return;
    Val& x = in(n, i);
    if (x.isConst || !x.v || x.view != Val::View::None || x.shape.size() != 4 || x.seqFirst ||
        x.intInput || x.lazyExpand || x.headMajor)
      return;
    const ir::Op& op = g_.op(*x.v);
    if (op.kind != ir::OpKind::Input || op.weight || op.mask || op.type.shape != x.shape)
      return;
    makeCacheView(x, x.shape);
  }

  /// A cache (Val::headMajor) may only be moved into another view of itself.
  void checkCacheMoved(const NodeProto& n, const Val& cache) {
    for (const std::string& out : n.output()) {
      auto v = vals_.find(out);
      if (v == vals_.end())
        continue;
      const Val& r = v->second;
      if (!r.headMajor || r.v != cache.v ||
          (r.view != Val::View::Heads && r.view != Val::View::HeadsT &&
           r.view != Val::View::Repeat5))
        throw UnsupportedError{cacheRefusal(cache)};
    }
  }

  /// Makes `x`, whose vertex holds a cache [B, H, S, d] (`t`), the Heads view of that cache
  /// (Val::headMajor): as that tensor, or flat, [B*H, S, d] (torch.bmm's form), where `x`'s
  /// shape has rank 3.
  static void makeCacheView(Val& x, const std::vector<int64_t>& t) {
    x.view = Val::View::Heads;
    x.headMajor = true;
    x.flatBH = x.shape.size() == 3;
    x.batch = t[0];
    x.heads = t[1];
    x.seq = t[2];
    x.headDim = t[3];
    x.repeat = 1;
  }

  static std::string cacheRefusal(const Val& v) {
    return "'" + v.name + "' " + shapeStr(v.shape) +
           " is a key or value cache with the new tokens' appended; fpat supports it as "
           "attention's K or V (through Transpose, repeat_kv's Unsqueeze, Expand and Reshape, "
           "and MatMul) and as a graph output [B, Hkv, S, d]";
  }

  /// Concat(past [B, Hkv, P, d], new heads [B, Hkv, S, d], axis 2): a decode or prefill step's
  /// key or value cache (present_key), kv_append's [B, Hkv, P+S, d]; returns whether `n` was.
  /// Falcon's caches are torch.bmm's form, [B*Hkv, P, d] joined with [B*Hkv, S, d] along axis
  /// 1: the same elements, so the input is taken as [B, Hkv, P, d] and the result stays flat.
  bool cacheConcat(const NodeProto& n) {
    if (n.input_size() != 2)
      return false;
    Val &past = in(n, 0), &fresh = in(n, 1);
    const size_t rank = past.shape.size();
    if (past.isConst || !past.v || past.view != Val::View::None || (rank != 3 && rank != 4) ||
        g_.op(*past.v).kind != ir::OpKind::Input || g_.op(*past.v).weight ||
        g_.op(*past.v).type.shape != flatten(past.shape) || past.seqFirst || past.intInput)
      return false;
    const bool flat = rank == 3;
    if (flat && fresh.view == Val::View::None)
      return false; // (not heads: headsConcat says so)
    if (fresh.view == Val::View::HeadsT)
      throw UnsupportedError{"it joins the cache '" + past.name + "' " + shapeStr(past.shape) +
                             " with keys transposed, " + shapeStr(fresh.shape) +
                             " (BLOOM's [B*H, d, P]); fpat supports caches [B, Hkv, P, d] and "
                             "[B*Hkv, P, d]"};
    const int64_t axis = normAxis(intAttr(n, "axis", 0), static_cast<int64_t>(rank));
    if (axis != static_cast<int64_t>(rank) - 2)
      throw UnsupportedError{"it joins the cache '" + past.name + "' " + shapeStr(past.shape) +
                             " and heads; fpat supports that along the sequence (axis " +
                             std::to_string(rank - 2) + ") only"};
    const bool heads = fresh.view == Val::View::Heads && fresh.repeat == 1 &&
                       fresh.flatBH == flat && !fresh.headMajor && !fresh.seqFirst;
    const bool dense = !flat && fresh.view == Val::View::Dense4 && fresh.order == Val::View::Heads;
    if ((!heads && !dense) || fresh.shape.size() != rank || fresh.shape[0] != past.shape[0] ||
        fresh.shape[rank - 1] != past.shape[rank - 1] || (!flat && fresh.shape[1] != past.shape[1]))
      throw UnsupportedError{"it appends '" + fresh.name + "' " + shapeStr(fresh.shape) +
                             " to the cache '" + past.name + "' " + shapeStr(past.shape) +
                             "; fpat supports appending heads [B, Hkv, S, d] (or [B*Hkv, S, d] "
                             "to [B*Hkv, P, d]) of the same batch, heads and head dimension"};
    if (flat) {
      if (g_.useCount(*past.v) != 0)
        throw UnsupportedError{"the cache '" + past.name + "' " + shapeStr(past.shape) +
                               " is read before it is joined with the new keys or values; fpat "
                               "supports a cache [B*Hkv, P, d] whose first use is that join"};
      // The input's IR tensor becomes [B, Hkv, P, d]; the model's own uses of it, from here on,
      // are a cache given whole (givenCache's view), checked as kv_append's result is.
      g_.op(*past.v).type.shape = {fresh.batch, fresh.heads, past.shape[1], past.shape[2]};
      makeCacheView(past, g_.op(*past.v).type.shape);
    }
    ir::Op op;
    op.kind = ir::OpKind::KvAppend;
    std::vector<int64_t> t = g_.op(*past.v).type.shape;
    t[2] += fresh.shape[rank - 2];
    Val v = emit(n, op, {*past.v, *fresh.v}, t);
    if (flat)
      v.shape = {t[0] * t[1], t[2], t[3]};
    makeCacheView(v, t);
    define(n, std::move(v));
    return true;
  }

  /// Two head values joined along their last axis (rotate_half): the IR's concat, on their
  /// Dense4 tensors.
  void headsConcat(const NodeProto& n) {
    if (cacheConcat(n) || headsRejoin(n))
      return;
    if (n.input_size() != 2)
      throw UnsupportedError{"of concatenations of activations split into heads, only those of "
                             "two are supported"};
    Val &a = in(n, 0), &b = in(n, 1);
    if (a.view == Val::View::None || b.view == Val::View::None)
      throw UnsupportedError{"it joins heads with '" +
                             (a.view == Val::View::None ? a.name : b.name) +
                             "', which is not split into heads"};
    const size_t rank = a.shape.size();
    if (normAxis(intAttr(n, "axis", 0), rank) != static_cast<int64_t>(rank) - 1)
      throw UnsupportedError{"of concatenations of activations split into heads, only those "
                             "along the last axis are supported"};
    const Val A = dense4(n, a), B = dense4(n, b);
    if (A.order != B.order ||
        !std::equal(a.shape.begin(), a.shape.end() - 1, b.shape.begin(), b.shape.end() - 1))
      throw UnsupportedError{"its heads " + shapeStr(a.shape) + " and " + shapeStr(b.shape) +
                             " differ off the last axis"};
    ir::Op op;
    op.kind = ir::OpKind::Concat;
    std::vector<int64_t> t = g_.op(*A.v).type.shape;
    t.back() += g_.op(*B.v).type.shape.back();
    Val v = A;
    v.v = emit(n, op, {*A.v, *B.v}, t).v;
    v.shape = a.shape;
    v.shape.back() += b.shape.back();
    v.headDim = t.back();
    define(n, std::move(v));
  }

  /// Concat of two activations [B, P, E] and [B, S, E] along the sequence (GPTBigCode's cache
  /// of keys and values side by side, layer_past joined with the new tokens'): kv_append of
  /// token-major rows, [B*(P+S), E]; returns whether `n` was one.
  bool sequenceConcat(const NodeProto& n) {
    if (n.input_size() != 2)
      return false;
    Val &a = in(n, 0), &b = in(n, 1);
    auto rows = [&](const Val& x) {
      return !x.isConst && x.v && x.shape.size() == 3 && !x.seqFirst && !x.intInput &&
             !x.lazyExpand && !x.headMajor && g_.op(*x.v).type.shape == flatten(x.shape);
    };
    if (!rows(a) || !rows(b) || normAxis(intAttr(n, "axis", 0), 3) != 1 ||
        a.shape[0] != b.shape[0] || a.shape[2] != b.shape[2])
      return false;
    ir::Op op;
    op.kind = ir::OpKind::KvAppend;
    op.batch = a.shape[0];
    Val v = emit(n, op, {*a.v, tensor(b)}, {a.shape[0] * (a.shape[1] + b.shape[1]), a.shape[2]});
    v.shape = {a.shape[0], a.shape[1] + b.shape[1], a.shape[2]};
    define(n, std::move(v));
    return true;
  }

  void concat(const NodeProto& n) {
    if (n.input_size() == 0)
      throw UnsupportedError{"it has no inputs"};
    // Parts without elements (empty slices) add nothing: the others are joined, or one alone
    // passes through.
    NodeProto kept = n;
    kept.clear_input();
    for (int i = 0; i < n.input_size(); ++i)
      if (!in(n, i).isConst || numel(in(n, i).shape) != 0)
        kept.add_input(n.input(i));
    if (kept.input_size() == 1 && n.input_size() > 1)
      return define(n, Val(in(kept, 0)));
    if (kept.input_size() > 0 && kept.input_size() < n.input_size())
      return concat(kept);
    for (int i = 0; i < n.input_size(); ++i)
      if (in(n, i).view != Val::View::None)
        return headsConcat(n);
    if (sequenceConcat(n))
      return;
    std::vector<const Val*> parts;
    for (int i = 0; i < n.input_size(); ++i) {
      if (!in(n, i).isConst)
        throw UnsupportedError{"only constants (shapes, weights) are concatenated at import; '" +
                               in(n, i).name + "' is computed at run time"};
      parts.push_back(&in(n, i));
    }
    const std::vector<int64_t>& s0 = parts[0]->shape;
    if (s0.empty())
      throw UnsupportedError{"it concatenates scalars"};
    const size_t axis = static_cast<size_t>(normAxis(intAttr(n, "axis", 0), s0.size()));
    std::vector<int64_t> shape = s0;
    shape[axis] = 0;
    bool integer = true;
    for (const Val* p : parts) {
      for (size_t k = 0; k < s0.size(); ++k)
        if (k != axis && (p->shape.size() != s0.size() || p->shape[k] != s0[k]))
          throw UnsupportedError{"its inputs' shapes " + shapeStr(s0) + " and " +
                                 shapeStr(p->shape) + " differ off axis " + std::to_string(axis)};
      shape[axis] += p->shape[axis];
      integer = integer && p->integer;
    }
    checkConstSize(shape);
    int64_t outer = 1, inner = 1;
    for (size_t k = 0; k < s0.size(); ++k)
      if (k < axis)
        outer *= s0[k];
      else if (k > axis)
        inner *= s0[k];
    std::vector<double> out;
    for (int64_t o = 0; o < outer; ++o)
      for (const Val* p : parts) {
        const int64_t block = p->shape[axis] * inner;
        for (int64_t i = 0; i < block; ++i)
          out.push_back(at(*p, static_cast<size_t>(o * block + i)));
      }
    define(n, constOf(std::move(shape), std::move(out), integer));
  }

  /// Elementwise `f` over constants broadcast (NumPy) to `shape`, in double: masks and tables
  /// (RoPE's cos and sin, a causal mask) that exporters compute from constants.
  static Val foldConst(const std::vector<const Val*>& ops, const std::vector<int64_t>& shape,
                       bool integer, const std::function<double(const double*)>& f) {
    checkConstSize(shape);
    const size_t total = static_cast<size_t>(numel(shape)), rank = shape.size();
    // Each operand's stride per result dimension: 0 where it is broadcast.
    std::vector<size_t> strides(ops.size() * rank, 0);
    for (size_t k = 0; k < ops.size(); ++k) {
      const std::vector<int64_t>& vs = ops[k]->shape;
      size_t step = 1;
      for (size_t i = 0; i < vs.size() && i < rank; ++i) {
        const size_t d = vs.size() - 1 - i, o = rank - 1 - i;
        strides[k * rank + o] = vs[d] == 1 ? 0 : step;
        step *= static_cast<size_t>(vs[d]);
      }
    }
    std::vector<double> out(total), args(ops.size());
    std::vector<size_t> pos(ops.size(), 0);
    std::vector<int64_t> idx(rank, 0);
    for (size_t i = 0; i < total; ++i) {
      for (size_t k = 0; k < ops.size(); ++k)
        args[k] = at(*ops[k], count(*ops[k]) == 1 ? 0 : pos[k]);
      out[i] = f(args.data());
      for (size_t d = rank; d-- > 0;) { // the next index, row-major
        for (size_t k = 0; k < ops.size(); ++k)
          pos[k] += strides[k * rank + d];
        if (++idx[d] < shape[d])
          break;
        for (size_t k = 0; k < ops.size(); ++k)
          pos[k] -= strides[k * rank + d] * static_cast<size_t>(shape[d]);
        idx[d] = 0;
      }
    }
    return constOf(shape, std::move(out), integer);
  }

  void logicalNot(const NodeProto& n) {
    const Val& x = constIn(n, 0, "its operand");
    define(n,
           foldConst({&x}, x.shape, true, [](const double* v) { return v[0] == 0 ? 1.0 : 0.0; }));
  }

  /// Where of constants (a causal mask chosen between 0 and the most negative float).
  void where(const NodeProto& n) {
    if (in(n, 0).isConst && in(n, 1).isConst != in(n, 2).isConst)
      return maskedFill(n);
    const Val &c = constIn(n, 0, "its condition"), &a = constIn(n, 1, "its first choice"),
              &b = constIn(n, 2, "its second choice");
    const std::vector<int64_t> shape = broadcast(broadcast(c.shape, a.shape), b.shape);
    define(n, foldConst({&c, &a, &b}, shape, a.integer && b.integer,
                        [](const double* v) { return v[0] != 0 ? v[1] : v[2]; }));
  }

  /// Where(mask, x, fill) (or the choices swapped) with a constant mask and a fill value of
  /// -inf or at most -1e9 (Hugging Face's finfo.min, Falcon's -1e9): the addition of a bias of 0
  /// where x is kept and the fill elsewhere, after which the softmax gives those keys no weight,
  /// as after the fill (ir::kMaskedAtMost); any other fill is refused.
  void maskedFill(const NodeProto& n) {
    const Val& c = in(n, 0);
    const bool xFirst = !in(n, 1).isConst;
    Val& x = in(n, xFirst ? 1 : 2);
    const Val& fill = in(n, xFirst ? 2 : 1);
    if (count(fill) != 1 || fill.integer || !(at(fill, 0) <= ir::kMaskedAtMost))
      throw UnsupportedError{"its " + std::string(xFirst ? "first" : "second") + " choice '" +
                             x.name +
                             "' is computed at run time; fpat supports that only "
                             "as a mask, the other choice a scalar of -inf or at most -1e9"};
    const double f = at(fill, 0);
    Val bias = foldConst({&c}, c.shape, false,
                         [&](const double* v) { return (v[0] != 0) == xFirst ? 0.0 : f; });
    bias.name = nodeName(n) + ".bias";
    const std::vector<int64_t> shape = broadcast(x.shape, c.shape);
    if (x.queryMajor) {
      Val t = queryMajorConst(bias, x);
      return define(n, sameForm(n, ir::OpKind::Add, x, {*x.v, tensor(t)}));
    }
    if (shape.size() != 4) {
      checkFlatBroadcast(x.shape, shape);
      checkFlatBroadcast(c.shape, shape);
    }
    ir::Op op;
    op.kind = ir::OpKind::Add;
    const ir::Vertex vx = tensor(x), vb = tensor(bias);
    define(n, emit(n, op, {vx, vb}, shape));
  }

  /// ScatterND of constants (transformers writing the padding mask into a slice of its causal
  /// mask in place): a copy of the data with the updates at the indices, reduction none.
  void scatterND(const NodeProto& n) {
    const Val &d = constIn(n, 0, "its data"), &ix = constIn(n, 1, "its indices"),
              &u = constIn(n, 2, "its updates");
    if (const AttributeProto* r = attr(n, "reduction"); r && r->s() != "none")
      throw UnsupportedError{"its reduction '" + r->s() + "' is not supported (only none)"};
    const size_t k = ix.shape.empty() ? 0 : static_cast<size_t>(ix.shape.back());
    if (k == 0 || k > d.shape.size())
      throw UnsupportedError{"its indices " + shapeStr(ix.shape) + " do not index the data " +
                             shapeStr(d.shape) + " (their last dimension must be 1 to its rank)"};
    std::vector<int64_t> want(ix.shape.begin(), ix.shape.end() - 1);
    want.insert(want.end(), d.shape.begin() + static_cast<std::ptrdiff_t>(k), d.shape.end());
    if (u.shape != want)
      throw UnsupportedError{"its updates " + shapeStr(u.shape) + " are not of the shape " +
                             shapeStr(want) + " that its indices and data ask for"};
    checkConstSize(d.shape);
    std::vector<double> out = valuesOf(d);
    int64_t slice = 1;
    for (size_t i = k; i < d.shape.size(); ++i)
      slice *= d.shape[i];
    const int64_t tuples = numel(want) / std::max<int64_t>(slice, 1);
    for (int64_t t = 0; t < tuples && slice > 0; ++t) {
      int64_t off = 0;
      for (size_t j = 0; j < k; ++j) {
        int64_t i = static_cast<int64_t>(at(ix, static_cast<size_t>(t) * k + j));
        const int64_t dim = d.shape[j];
        if (i < -dim || i >= dim)
          throw UnsupportedError{"its index " + std::to_string(i) + " is out of range for axis " +
                                 std::to_string(j) + " of size " + std::to_string(dim)};
        off = off * dim + (i < 0 ? i + dim : i);
      }
      for (int64_t e = 0; e < slice; ++e)
        out[static_cast<size_t>(off * slice + e)] = at(u, static_cast<size_t>(t * slice + e));
    }
    define(n, constOf(d.shape, std::move(out), d.integer && u.integer));
  }

  /// Trilu of a constant (opset 14): the lower (upper = 0) or upper triangle of each matrix,
  /// shifted by k, the rest zero.
  void trilu(const NodeProto& n) {
    const Val& x = constIn(n, 0, "its input");
    if (x.shape.size() < 2)
      throw UnsupportedError{"its input " + shapeStr(x.shape) + " has fewer than 2 dimensions"};
    const int64_t k = hasIn(n, 1) ? static_cast<int64_t>(at(constIn(n, 1, "its k"), 0)) : 0;
    const bool upper = intAttr(n, "upper", 1) != 0;
    const int64_t rows = x.shape[x.shape.size() - 2], cols = x.shape.back();
    std::vector<double> v = valuesOf(x);
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t r = static_cast<int64_t>(i) / cols % rows, c = static_cast<int64_t>(i) % cols;
      if (upper ? c - r < k : c - r > k)
        v[i] = 0;
    }
    define(n, constOf(x.shape, std::move(v), x.integer));
  }

  /// Einsum of constants (torch.outer of RoPE's positions and frequencies exports as one):
  /// single-letter subscripts, explicit output, no ellipsis; summed over what the output
  /// leaves out.
  void einsum(const NodeProto& n) {
    const AttributeProto* eq = attr(n, "equation");
    std::string e = eq ? eq->s() : "";
    e.erase(std::remove(e.begin(), e.end(), ' '), e.end());
    const size_t arrow = e.find("->");
    if (arrow == std::string::npos || e.find("...") != std::string::npos)
      throw UnsupportedError{"its equation '" + e + "' needs an explicit output and no '...'"};
    std::vector<std::string> terms;
    for (size_t start = 0;;) {
      const size_t comma = e.find(',', start);
      terms.push_back(e.substr(start, std::min(comma, arrow) - start));
      if (comma == std::string::npos || comma > arrow)
        break;
      start = comma + 1;
    }
    const std::string outTerm = e.substr(arrow + 2);
    if (static_cast<int>(terms.size()) != n.input_size())
      throw UnsupportedError{"its equation '" + e + "' names " + std::to_string(terms.size()) +
                             " operands, the node has " + std::to_string(n.input_size())};
    std::map<char, int64_t> size;
    std::vector<const Val*> ops;
    for (size_t t = 0; t < terms.size(); ++t) {
      const Val& v = constIn(n, static_cast<int>(t), "its operand");
      if (terms[t].size() != v.shape.size())
        throw UnsupportedError{"its subscripts '" + terms[t] + "' do not fit " + shapeStr(v.shape)};
      for (size_t d = 0; d < v.shape.size(); ++d) {
        auto [it, fresh] = size.emplace(terms[t][d], v.shape[d]);
        if (!fresh && it->second != v.shape[d])
          throw UnsupportedError{"its subscript '" + std::string(1, terms[t][d]) +
                                 "' has two sizes"};
      }
      ops.push_back(&v);
    }
    std::vector<int64_t> shape;
    for (char c : outTerm) {
      if (!size.count(c))
        throw UnsupportedError{"its output subscript '" + std::string(1, c) + "' is no input's"};
      shape.push_back(size[c]);
    }
    checkConstSize(shape);
    std::vector<char> letters;
    int64_t space = 1;
    for (auto& [c, s] : size) {
      letters.push_back(c);
      if (s != 0 && space > (int64_t{1} << 28) / s)
        throw UnsupportedError{"its index space is too large to fold at import"};
      space = s == 0 ? 0 : space * s; // an empty subscript: nothing to sum, zeros out
    }
    std::vector<double> out(static_cast<size_t>(numel(shape)), 0.0);
    std::map<char, int64_t> idx;
    auto offset = [&](const std::string& term, const std::vector<int64_t>& dims) {
      int64_t o = 0;
      for (size_t d = 0; d < term.size(); ++d)
        o = o * dims[d] + idx[term[d]];
      return static_cast<size_t>(o);
    };
    for (int64_t i = 0; i < space; ++i) {
      int64_t rest = i;
      for (size_t l = letters.size(); l-- > 0;) {
        idx[letters[l]] = rest % size[letters[l]];
        rest /= size[letters[l]];
      }
      double p = 1;
      for (size_t t = 0; t < ops.size(); ++t)
        p *= at(*ops[t], offset(terms[t], ops[t]->shape));
      out[offset(outTerm, shape)] += p;
    }
    bool integer = true;
    for (const Val* v : ops)
      integer = integer && v->integer;
    define(n, constOf(std::move(shape), std::move(out), integer));
  }

  void constantOfShape(const NodeProto& n) {
    std::vector<int64_t> shape;
    for (double d : valuesOf(constIn(n, 0, "its shape"))) {
      if (!(d >= 0 && d <= static_cast<double>(kMaxElements)))
        throw UnsupportedError{"its shape has the dimension " + formatDouble(d)};
      shape.push_back(static_cast<int64_t>(d));
    }
    checkConstSize(shape);
    Val fill = constOf({}, {0.0}, false); // the default: float 0
    if (const AttributeProto* a = attr(n, "value")) {
      fill = Val{};
      if (std::string why = decodeTensor(a->t(), fill); !why.empty())
        throw UnsupportedError{"its value: " + why};
    }
    if (count(fill) != 1)
      throw UnsupportedError{"its value has " + std::to_string(count(fill)) + " elements, not one"};
    const auto total = static_cast<size_t>(numel(shape));
    if (total > kUniformFrom) {
      Val v = constOf(std::move(shape), {at(fill, 0)}, fill.integer);
      v.uniform = true;
      return define(n, std::move(v));
    }
    define(n, constOf(std::move(shape), std::vector<double>(total, at(fill, 0)), fill.integer));
  }

  /// ConstantOfShape results of more elements than this stay one value (Val::uniform).
  static constexpr size_t kUniformFrom = 4096;

  /// A uniform constant with every element stored.
  static void expandUniform(Val& v) {
    if (!v.uniform)
      return;
    checkConstSize(v.shape);
    const double x = v.data.at(0);
    const auto total = static_cast<size_t>(numel(v.shape));
    v.uniform = false;
    if (v.integer) {
      v.data.assign(total, x);
    } else {
      v.data.clear();
      v.fdata = std::make_shared<std::vector<float>>(total, static_cast<float>(x));
    }
  }

  void range(const NodeProto& n) {
    const Val &s = constIn(n, 0, "its start"), &l = constIn(n, 1, "its limit"),
              &d = constIn(n, 2, "its delta");
    const double start = at(s, 0), limit = at(l, 0), delta = at(d, 0);
    if (delta == 0)
      throw UnsupportedError{"its delta is 0"};
    const double len = std::max(0.0, std::ceil((limit - start) / delta));
    checkConstSize({static_cast<int64_t>(std::min(len, 1e18))});
    std::vector<double> out;
    for (int64_t i = 0; i < static_cast<int64_t>(len); ++i)
      out.push_back(start + static_cast<double>(i) * delta);
    const auto len64 = static_cast<int64_t>(out.size());
    define(n, constOf({len64}, std::move(out), s.integer));
  }

  /// Expand of a constant to a shape (NumPy broadcasting both ways).
  void expand(const NodeProto& n) {
    if (in(n, 0).view == Val::View::Repeat5) { // repeat_kv: [B, Hkv, 1, S, d] to [B, Hkv, n, S, d]
      Val v = in(n, 0);
      std::vector<int64_t> target;
      for (double d : valuesOf(constIn(n, 1, "its shape")))
        target.push_back(static_cast<int64_t>(d));
      const std::vector<int64_t> shape = broadcast(v.shape, target);
      if (shape.size() != 5 || shape[0] != v.batch || shape[1] != v.heads || shape[3] != v.seq ||
          shape[4] != v.headDim)
        throw UnsupportedError{"expanding the heads of '" + v.name + "' " + shapeStr(v.shape) +
                               " to " + shapeStr(shape) +
                               " is not supported (only repeat_kv's third axis)"};
      v.repeat = shape[2];
      v.shape = shape;
      define(n, std::move(v));
      return;
    }
    Val converted;
    if (Val& x = asHeadView(n, in(n, 0), converted);
        x.view == Val::View::Heads && !x.flatBH && x.repeat == 1 && x.heads == 1) {
      // Multi-query attention's one head expanded to the query heads: [B, 1, S, d] to
      // [B, H, S, d], GQA with one stored head.
      std::vector<int64_t> target;
      for (double d : valuesOf(constIn(n, 1, "its shape")))
        target.push_back(static_cast<int64_t>(d));
      const std::vector<int64_t> shape = broadcast(x.shape, target);
      if (shape.size() != 4 || shape[0] != x.batch || shape[2] != x.seq || shape[3] != x.headDim)
        throw UnsupportedError{"expanding the head of '" + x.name + "' " + shapeStr(x.shape) +
                               " to " + shapeStr(shape) +
                               " is not supported (only to more heads, [B, H, S, d])"};
      Val v = x;
      v.heads = v.repeat = shape[1];
      v.shape = shape;
      v.other.reset();
      define(n, std::move(v));
      return;
    }
    if (!in(n, 0).isConst)
      throw UnsupportedError{"only a constant is expanded at import; '" + in(n, 0).name +
                             "' is computed at run time"};
    const Val& x = in(n, 0);
    std::vector<int64_t> target;
    for (double d : valuesOf(constIn(n, 1, "its shape")))
      target.push_back(static_cast<int64_t>(d));
    const std::vector<int64_t> shape = broadcast(x.shape, target);
    checkConstSize(shape);
    Val v = foldBinary(ir::OpKind::Mul, x, constOf({}, {1.0}, false), shape);
    if (x.integer)
      v = constOf(v.shape, valuesOf(v), true);
    define(n, std::move(v));
  }

  void reduceMean(const NodeProto& n) {
    Val& x = in(n, 0);
    std::vector<int64_t> axes = axesOf(n, 1);
    if (axes.size() != 1 ||
        normAxis(axes[0], x.shape.size()) + 1 != static_cast<int64_t>(x.shape.size()))
      throw UnsupportedError{"only a mean over the last axis is supported"};
    if (intAttr(n, "keepdims", 1) != 1)
      throw UnsupportedError{"only keepdims = 1 is supported"};
    std::vector<int64_t> shape = x.shape;
    shape.back() = 1;
    ir::Op op;
    op.kind = ir::OpKind::ReduceMean;
    define(n, emit(n, op, {tensor(x)}, shape));
  }

  /// Split of an activation along its last axis (GPT-2's fused q, k, v projection): column
  /// slices. Sizes from the `split` input (opset 13 on) or attribute, else equal parts
  /// (num_outputs, opset 18: the last part smaller).
  void split(const NodeProto& n) {
    Val& x = in(n, 0);
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    const int64_t axis = normAxis(intAttr(n, "axis", 0), x.shape.size());
    if (axis + 1 != rank && !x.isConst && headAxis(x) != axis)
      throw UnsupportedError{"only a split of the last axis (the columns) is supported; this "
                             "one splits axis " +
                             std::to_string(axis) + " of " + shapeStr(x.shape)};
    const int64_t dim = x.shape[static_cast<size_t>(axis)];
    std::vector<int64_t> sizes;
    if (const AttributeProto* a = attr(n, "split")) {
      sizes.assign(a->ints().begin(), a->ints().end());
    } else if (hasIn(n, 1)) {
      for (double d : valuesOf(constIn(n, 1, "its split sizes")))
        sizes.push_back(static_cast<int64_t>(d));
    } else {
      const int64_t parts = attr(n, "num_outputs") ? intAttr(n, "num_outputs", 1)
                                                   : static_cast<int64_t>(n.output_size());
      if (parts < 1)
        throw UnsupportedError{"it splits into " + std::to_string(parts) + " parts"};
      const int64_t each = (dim + parts - 1) / parts;
      for (int64_t p = 0, left = dim; p < parts; ++p, left -= each)
        sizes.push_back(std::min(each, left));
    }
    int64_t total = 0;
    for (int64_t z : sizes) {
      if (z < 1)
        throw UnsupportedError{"its part sizes must be at least 1"};
      total += z;
    }
    if (total != dim || static_cast<int>(sizes.size()) != n.output_size())
      throw UnsupportedError{"its " + std::to_string(sizes.size()) + " parts (" + shapeStr(sizes) +
                             ") do not split the " + std::to_string(dim) + " columns into its " +
                             std::to_string(n.output_size()) + " outputs"};
    if (headAxis(x) == axis && axis + 1 != rank) { // heads split apart
      int64_t first = 0;
      for (int i = 0; i < n.output_size(); ++i) {
        const int64_t count = sizes[static_cast<size_t>(i)];
        if (!n.output(i).empty())
          define(n, headColumns(n, x, first, count, true, i), i);
        first += count;
      }
      return;
    }
    if (x.isConst) { // (the exporter's repeat_interleave splits its repeats)
      int64_t begin = 0;
      for (int i = 0; i < n.output_size(); ++i) {
        SliceWindow w{std::vector<int64_t>(x.shape.size(), 0),
                      std::vector<int64_t>(x.shape.size(), 1), x.shape};
        w.first[static_cast<size_t>(axis)] = begin;
        w.shape[static_cast<size_t>(axis)] = sizes[static_cast<size_t>(i)];
        begin += sizes[static_cast<size_t>(i)];
        if (!n.output(i).empty())
          define(n, constWindow(x, w), i);
      }
      return;
    }
    if (x.view != Val::View::None) {
      // Heads split along their last axis (HF GPTBigCode's query and key-value of each head):
      // each part a Slice of the heads, as that would be written.
      const std::string xs = x.name;
      int64_t begin = 0;
      for (int i = 0; i < n.output_size(); ++i) {
        const int64_t end = begin + sizes[static_cast<size_t>(i)];
        if (!n.output(i).empty()) {
          const std::string part = nodeName(n) + ".part" + std::to_string(i);
          auto one = [&](const std::string& what, int64_t value) {
            vals_[part + what] = constOf({1}, {static_cast<double>(value)}, true);
            vals_[part + what].name = part + what;
            return part + what;
          };
          NodeProto sl;
          sl.set_op_type("Slice");
          sl.set_name(part);
          for (const std::string& input :
               {xs, one(".starts", begin), one(".ends", end), one(".axes", axis)})
            sl.add_input(input);
          sl.add_output(n.output(i));
          headsSlice(sl);
        }
        begin = end;
      }
      return;
    }
    const ir::Vertex vx = tensor(x);
    int64_t begin = 0;
    for (int i = 0; i < n.output_size(); ++i) {
      const int64_t end = begin + sizes[static_cast<size_t>(i)];
      if (!n.output(i).empty()) {
        ir::Op op;
        op.kind = ir::OpKind::Slice;
        op.begin = begin;
        op.end = end;
        std::vector<int64_t> shape = x.shape;
        shape.back() = end - begin;
        define(n, emit(n, op, {vx}, shape, i), i);
      }
      begin = end;
    }
  }

  /// Softmax over the last axis. Opset 13 on: over `axis` (default -1). Before: over the input
  /// flattened to 2-D at `axis` (default 1), which is the last axis only where axis is.
  void softmax(const NodeProto& n) {
    Val& x = in(n, 0);
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    const int64_t axis = normAxis(intAttr(n, "axis", r_.opset >= 13 ? -1 : 1), x.shape.size());
    if (rank == 0 || axis + 1 != rank)
      throw UnsupportedError{"only a softmax over the last axis is supported (this one is over "
                             "axis " +
                             std::to_string(axis) + " of " + std::to_string(rank) + ")"};
    ir::Op op;
    op.kind = ir::OpKind::Softmax;
    if (x.queryMajor) // the keys' axis is last in both orders
      return define(n, sameForm(n, ir::OpKind::Softmax, x, {*x.v}));
    define(n, emit(n, op, {tensor(x)}, x.shape));
  }

  void layerNorm(const NodeProto& n) {
    Val& x = in(n, 0);
    if (normAxis(intAttr(n, "axis", -1), x.shape.size()) + 1 !=
        static_cast<int64_t>(x.shape.size()))
      throw UnsupportedError{"only a norm over the last axis is supported"};
    for (int o = 1; o < n.output_size(); ++o)
      if (!n.output(o).empty())
        throw UnsupportedError{"its mean and inverse standard deviation outputs are not "
                               "supported"};
    ir::Op op;
    op.kind = ir::OpKind::LayerNorm;
    op.eps = floatAttr(n, "epsilon", 1e-5);
    const ir::Vertex gamma = tensor(in(n, 1));
    ir::Vertex beta;
    if (hasIn(n, 2)) {
      beta = tensor(in(n, 2));
    } else {
      Val zeros;
      zeros.isConst = true;
      zeros.shape = {x.shape.back()};
      zeros.data.assign(static_cast<size_t>(x.shape.back()), 0.0);
      zeros.name = nodeName(n) + ".beta";
      beta = tensor(zeros);
    }
    define(n, emit(n, op, {tensor(x), gamma, beta}, x.shape));
  }

  /// RMSNormalization (opset 23): x / sqrt(mean(x^2) + epsilon) * scale over the last axis.
  void rmsNorm(const NodeProto& n) {
    Val& x = in(n, 0);
    if (normAxis(intAttr(n, "axis", -1), x.shape.size()) + 1 !=
        static_cast<int64_t>(x.shape.size()))
      throw UnsupportedError{"only a norm over the last axis is supported"};
    ir::Op op;
    op.kind = ir::OpKind::RmsNorm;
    op.eps = floatAttr(n, "epsilon", 1e-5);
    define(n, emit(n, op, {tensor(x), tensor(in(n, 1))}, x.shape));
  }

  /// Reshape's target for an input of shape `from`: 0 copies its dimension (unless allowzero),
  /// one -1 takes what is left.
  std::vector<int64_t> reshapeTarget(const NodeProto& n, const std::vector<int64_t>& from) {
    std::vector<int64_t> shape;
    Val& s = in(n, 1);
    if (!s.isConst)
      throw UnsupportedError{"its target shape must be constant"};
    int infer = -1;
    int64_t known = 1;
    for (size_t i = 0; i < count(s); ++i) {
      const double raw = at(s, i);
      if (!(raw >= -1 && raw <= static_cast<double>(kMaxElements)))
        throw UnsupportedError{"its shape has the dimension " + formatDouble(raw)};
      auto d = static_cast<int64_t>(raw);
      if (d == 0 && !intAttr(n, "allowzero", 0)) {
        if (i >= from.size())
          throw UnsupportedError{"its shape copies a dimension the input does not have"};
        d = from[i];
      }
      if (d == -1) {
        if (infer >= 0)
          throw UnsupportedError{"its shape has two -1 dimensions"};
        infer = static_cast<int>(i);
        d = 1;
      } else if (d < 1) {
        throw UnsupportedError{"its shape has the dimension " + std::to_string(d)};
      } else {
        known *= d;
      }
      shape.push_back(d);
    }
    if (infer >= 0) {
      if (known == 0 || numel(from) % known)
        throw UnsupportedError{"its shape does not divide the input's element count"};
      shape[static_cast<size_t>(infer)] = numel(from) / known;
    }
    return shape;
  }

  void reshape(const NodeProto& n) {
    Val converted;
    Val& x = asHeadView(n, in(n, 0), converted);
    const std::string& t = n.op_type();
    std::vector<int64_t> shape;
    if (t == "Reshape") {
      shape = reshapeTarget(n, x.shape);
    } else if (t == "Flatten") {
      const int64_t axis = intAttr(n, "axis", 1);
      const int64_t r = static_cast<int64_t>(x.shape.size());
      const int64_t a = axis < 0 ? axis + r : axis;
      if (a < 0 || a > r)
        throw UnsupportedError{"axis " + std::to_string(axis) + " is out of range"};
      int64_t lead = 1, rest = 1;
      for (int64_t i = 0; i < r; ++i)
        (i < a ? lead : rest) *= x.shape[static_cast<size_t>(i)];
      shape = {lead, rest};
    } else {
      const std::vector<int64_t> axes = axesOf(n, 1);
      shape = x.shape;
      if (t == "Squeeze") {
        std::set<int64_t> drop;
        for (int64_t a : axes)
          drop.insert(normAxis(a, x.shape.size()));
        shape.clear();
        for (size_t i = 0; i < x.shape.size(); ++i)
          if (axes.empty() ? x.shape[i] != 1 : !drop.count(static_cast<int64_t>(i)))
            shape.push_back(x.shape[i]);
      } else {
        const size_t rank = x.shape.size() + axes.size();
        std::set<int64_t> add;
        for (int64_t a : axes)
          add.insert(normAxis(a, rank));
        shape.clear();
        size_t k = 0;
        for (size_t i = 0; i < rank; ++i)
          shape.push_back(add.count(static_cast<int64_t>(i)) ? 1 : x.shape.at(k++));
      }
    }
    if (!x.isConst && x.view == Val::View::None && shape.size() == 5 && shape[3] > 1 &&
        fusedParts(n, x, shape))
      return;
    if (!x.isConst && x.v && x.seqFirst && x.view == Val::View::None && shape.size() == 4 &&
        x.shape.size() == 3 && shape[0] == x.shape[0] && shape[1] == x.shape[1]) {
      // Heads [A, C, H, d] of what was taken as [S, B, E] transposed from batch-first: the
      // model's batch is axis 0 here, so its input was sequence-first (fairseq's
      // x.transpose(0, 1) on entry). Inputs whose rows reach here are taken so in a rerun.
      seqFirstFound_.merge(rowSources(*x.v));
    }
    if (!x.isConst &&
        (x.view != Val::View::None || shape.size() == 4 || headRows(x, shape) ||
         seqFirstHeads(x, shape)) &&
        reshapeHeads(n, x, shape))
      return;
    alias(n, x, std::move(shape));
  }

  /// [B*S, H * P * d] viewed as [B, S, H, P, d] (BLOOM's fused projection, q, k and v of each
  /// head side by side): where the value is a projection x W (+ b) with W and b weights and
  /// nothing else reads it, W's and b's columns are reordered once to (part, head, d), so that
  /// each part is consecutive heads, which a Gather then slices as columns. False otherwise.
  bool fusedParts(const NodeProto& n, Val& x, const std::vector<int64_t>& shape) {
    const std::vector<int64_t> ir = g_.op(*x.v).type.shape;
    const int64_t H = shape[2], P = shape[3], d = shape[4], C = H * P * d;
    if (ir.size() != 2 || shape[0] * shape[1] != ir[0] || ir[1] != C)
      return false;
    auto readOnlyHere = [&](ir::Vertex v) { // one IR use, and no ONNX node left to read it
      if (g_.useCount(v) > 1)
        return false;
      for (const auto& [name, val] : vals_)
        if (val.v == v && onnxUses_[name] > 1)
          return false;
      return true;
    };
    auto weightOf = [&](ir::Vertex w, int64_t numel) -> ir::Op* {
      ir::Op& op = g_.op(w);
      return op.kind == ir::OpKind::Input && op.weight && op.data &&
                     static_cast<int64_t>(op.data->size()) == numel && g_.useCount(w) == 1
                 ? &op
                 : nullptr;
    };
    // x = gemm(a, W), or add / bias_add of it with a [C] weight.
    ir::Vertex v = *x.v;
    std::vector<ir::Op*> permute; // weights whose columns are C wide
    if (!readOnlyHere(v) || onnxUses_[x.name] > 1)
      return false;
    if (g_.op(v).kind == ir::OpKind::Add || g_.op(v).kind == ir::OpKind::BiasAdd) {
      const std::vector<ir::Vertex> ops = g_.operands(v);
      if (ops.size() != 2)
        return false;
      const int bi = weightOf(ops[0], C) ? 0 : 1;
      ir::Op* b = weightOf(ops[static_cast<size_t>(bi)], C);
      if (!b || !readOnlyHere(ops[static_cast<size_t>(1 - bi)]))
        return false;
      permute.push_back(b);
      v = ops[static_cast<size_t>(1 - bi)];
    }
    const ir::Op& gemm = g_.op(v);
    if (gemm.kind != ir::OpKind::Gemm || gemm.transposeB)
      return false;
    const std::vector<ir::Vertex> ops = g_.operands(v);
    const int64_t K = g_.op(ops[0]).type.shape.back();
    ir::Op* w = weightOf(ops[1], K * C);
    if (!w)
      return false;
    permute.push_back(w);
    for (size_t i = 0; i < permute.size(); ++i) {
      permute[i]->data = std::make_shared<std::vector<float>>(
          ir::headPartsToColumns(*permute[i]->data, H, P, d, /*rowsOfN=*/false));
      // No longer the model's tensor: a file of --inputs named after it must not replace it.
      permute[i]->name = uniqueName(permute[i]->name + ".parts");
      permute[i]->origin += ", columns reordered to (part, head, d) for " + nodeName(n);
    }
    Val y = x;
    y.shape = shape;
    y.view = Val::View::Tokens;
    y.batch = shape[0];
    y.seq = shape[1];
    y.heads = P * H;
    y.headDim = d;
    y.repeat = 1;
    y.parts = P;
    define(n, std::move(y));
    return true;
  }

  /// Gather of one part of BLOOM's fused heads [B, S, H, P, d] (axis 3, a scalar index): heads
  /// p H .. (p + 1) H - 1 of the reordered projection, [B, S, H, d].
  void partsGather(const NodeProto& n) {
    const Val& x = in(n, 0);
    const Val& idx = constIn(n, 1, "its index");
    const int64_t P = x.parts, H = x.heads / P;
    const int64_t axis = normAxis(intAttr(n, "axis", 0), x.shape.size());
    if (axis != 3 || !idx.shape.empty())
      throw UnsupportedError{"of '" + x.name + "' " + shapeStr(x.shape) +
                             " (q, k and v of each head side by side), fpat supports only a "
                             "Gather of one of them: a scalar index on axis 3"};
    auto p = static_cast<int64_t>(at(idx, 0));
    if (p < -P || p >= P)
      throw UnsupportedError{"index " + std::to_string(p) + " is out of range for " +
                             shapeStr(x.shape) + " at axis 3"};
    p = p < 0 ? p + P : p;
    Val x4 = x;
    x4.parts = 1;
    x4.shape = {x.batch, x.seq, x.heads, x.headDim};
    define(n, headColumns(n, x4, p * H, H, true));
  }

  /// H where reshaping activation `x` [A, C, H*d] (token-major [A*C, H*d] in the IR) to `shape`
  /// [A, C*H, d] splits each row into H rows, else 0: GPTBigCode's query, its heads as rows of
  /// their own ([B, S, H*d] to [B, S*H, d]), or nn.MultiheadAttention's sequence-first heads
  /// ([S, B, H*d] to [S, B*H, d], before its bmm).
  int64_t rowHeads(const Val& x, const std::vector<int64_t>& shape) const {
    if (x.isConst || !x.v || x.view != Val::View::None || x.queryMajor || x.shape.size() != 3 ||
        shape.size() != 3 || shape[0] != x.shape[0] || x.shape[1] <= 0 ||
        shape[1] % x.shape[1] != 0)
      return 0;
    const int64_t h = shape[1] / x.shape[1];
    const bool fits =
        shape[2] * h == x.shape[2] &&
        g_.op(*x.v).type.shape == std::vector<int64_t>{x.shape[0] * x.shape[1], x.shape[2]};
    return fits ? h : 0;
  }
  bool headRows(const Val& x, const std::vector<int64_t>& shape) const {
    return !x.seqFirst && rowHeads(x, shape) > 1;
  }
  bool seqFirstHeads(const Val& x, const std::vector<int64_t>& shape) const {
    return x.seqFirst && rowHeads(x, shape) > 0;
  }

  /// Reshapes that split an activation into heads or merge them back (views, no data moved):
  /// [B*S, H*d] (any leading dimensions) to [B, S, H, d] and back, and repeat_kv's
  /// Unsqueeze(2) -> Expand -> Reshape on [B, Hkv, S, d]. False: not a head reshape.
  bool reshapeHeads(const NodeProto& n, Val& x, const std::vector<int64_t>& shape) {
    using View = Val::View;
    Val v = x;
    v.shape = shape;
    if (seqFirstHeads(x, shape)) {
      v.view = View::Tokens; // [S, B, H*d] -> [S, B*H, d], sequence-first heads
      v.batch = x.shape[1];
      v.seq = x.shape[0];
      v.heads = shape[1] / x.shape[1];
      v.headDim = shape[2];
      v.repeat = 1;
    } else if (x.seqFirst && x.view == View::None) {
      return false;
    } else if (x.seqFirst && x.view == View::Tokens &&
               !(shape.size() >= 2 && shape.back() == x.heads * x.headDim)) {
      throw UnsupportedError{"reshaping '" + x.name + "' " + shapeStr(x.shape) +
                             ", sequence-first heads, to " + shapeStr(shape) +
                             " is not supported (only merging the heads back)"};
    } else if (headRows(x, shape)) {
      v.view = View::Tokens; // [B, S, H*d] -> [B, S*H, d]
      v.flatSH = true;
      v.batch = shape[0];
      v.seq = x.shape[1];
      v.heads = shape[1] / x.shape[1];
      v.headDim = shape[2];
      v.repeat = 1;
    } else if (x.view == View::Tokens && x.flatSH && shape.size() == 4 &&
               shape == std::vector<int64_t>{x.batch, x.seq, x.heads, x.headDim}) {
      v.flatSH = false; // [B, S*H, d] -> [B, S, H, d]
    } else if (x.view == View::Tokens && !x.flatSH && !x.seqFirst && x.parts == 1 &&
               shape.size() == 3 &&
               shape == std::vector<int64_t>{x.batch, x.seq * x.heads, x.headDim}) {
      v.flatSH = true; // and back
    } else if (x.view == View::None) {
      const std::vector<int64_t> ir = g_.op(*x.v).type.shape;
      if (shape.size() != 4 || ir.size() != 2 || shape[0] * shape[1] != ir[0] ||
          shape[2] * shape[3] != ir[1] || x.shape.size() == 4) {
        if (shape.size() == 4 && ir.size() == 2 && x.shape.size() == 3 && shape[1] == 1 &&
            shape[0] * shape[2] == ir[0] && shape[3] == ir[1] &&
            std::vector<int64_t>{shape[0], shape[2], shape[3]} == x.shape) {
          // [B, S, d] unsqueezed to [B, 1, S, d]: one head (Hugging Face's cos and sin given to
          // a Llama layer, applied to the heads of q and k).
          v.view = View::Heads;
          v.batch = shape[0];
          v.seq = shape[2];
          v.heads = 1;
          v.headDim = shape[3];
          v.repeat = 1;
          define(n, std::move(v));
          return true;
        }
        return false;
      }
      v.view = View::Tokens;
      v.batch = shape[0];
      v.seq = shape[1];
      v.heads = shape[2];
      v.headDim = shape[3];
      v.repeat = 1;
    } else if (x.view == View::Tokens && shape.size() >= 2 && shape.back() == x.heads * x.headDim &&
               numel(shape) == numel(x.shape)) {
      v.view = View::None; // merged back: [B, S, H*d] or [B*S, H*d]
      v.flatSH = false;
      if (flatten(shape) != g_.op(*x.v).type.shape)
        return false;
    } else if ((x.view == View::Heads || x.view == View::HeadsT) && !x.flatBH &&
               shape.size() == 3 && shape[0] == x.batch * x.heads &&
               std::equal(shape.begin() + 1, shape.end(), x.shape.begin() + 2)) {
      v.flatBH = true; // [B, H, S, d] -> [B*H, S, d]
    } else if ((x.view == View::Heads || x.view == View::HeadsT) && x.flatBH && shape.size() == 4 &&
               shape[0] == x.batch && shape[1] == x.heads &&
               std::equal(shape.begin() + 2, shape.end(), x.shape.begin() + 1)) {
      v.flatBH = false; // and back
    } else if (x.view == View::Heads && x.repeat == 1 && n.op_type() == "Unsqueeze" &&
               shape == std::vector<int64_t>{x.batch, x.heads, 1, x.seq, x.headDim}) {
      v.view = View::Repeat5;
    } else if (x.view == View::Repeat5 &&
               shape == std::vector<int64_t>{x.batch, x.heads * x.repeat, x.seq, x.headDim}) {
      v.view = View::Heads; // GQA: `repeat` query heads per stored head
      v.heads = x.heads * x.repeat;
    } else {
      throw UnsupportedError{"reshaping '" + x.name + "' " + shapeStr(x.shape) +
                             ", an activation split into heads, to " + shapeStr(shape) +
                             " is not supported (only merging the heads back, and repeat_kv)"};
    }
    define(n, std::move(v));
    return true;
  }

  static std::string transposeRefusal(const Val& x, const std::vector<int64_t>& perm,
                                      const std::string& what, const std::string& only) {
    return "transposing '" + x.name + "' " + shapeStr(x.shape) + ", " + what + ", by " +
           (perm.empty() ? std::string("the reversed axes") : shapeStr(perm)) +
           " is not supported" + only;
  }

  void transpose(const NodeProto& n) {
    Val converted;
    Val& x = asHeadView(n, in(n, 0), converted); // heads computed on (RoPE) go on as a view
    std::vector<int64_t> perm;
    if (const AttributeProto* p = attr(n, "perm"))
      perm.assign(p->ints().begin(), p->ints().end());
    if (x.view == Val::View::Tokens && x.seqFirst) {
      // Sequence-first heads [S, B*H, d] to [B*H, S, d] (the bmm's q and v) or [B*H, d, S] (k^T).
      using P = std::vector<int64_t>;
      if (perm != P{1, 0, 2} && perm != P{1, 2, 0})
        throw UnsupportedError{transposeRefusal(x, perm, "sequence-first heads", "")};
      Val v = x;
      v.seqFirst = false;
      v.flatBH = true;
      v.view = perm == P{1, 0, 2} ? Val::View::Heads : Val::View::HeadsT;
      v.shape = perm == P{1, 0, 2} ? P{x.batch * x.heads, x.seq, x.headDim}
                                   : P{x.batch * x.heads, x.headDim, x.seq};
      return define(n, std::move(v));
    }
    if (x.flatBH && x.view == Val::View::Heads && x.repeat == 1 &&
        perm == std::vector<int64_t>{1, 0, 2}) {
      // [B*H, S, d] -> [S, B*H, d]: sequence-first heads again (nn.MultiheadAttention's output).
      Val v = x;
      v.flatBH = false;
      v.seqFirst = true;
      v.view = Val::View::Tokens;
      v.shape = {x.seq, x.batch * x.heads, x.headDim};
      return define(n, std::move(v));
    }
    if (x.flatBH) { // [B*H, S, d] <-> [B*H, d, S]
      using View = Val::View;
      if (perm != std::vector<int64_t>{0, 2, 1})
        throw UnsupportedError{
            transposeRefusal(x, perm, "heads merged with the batch", " (only the last two axes)")};
      Val v = x;
      v.view = x.view == View::Heads ? View::HeadsT : View::Heads;
      v.shape = {x.shape[0], x.shape[2], x.shape[1]};
      return define(n, std::move(v));
    }
    if (x.view != Val::View::None) {
      // Between the head views: [B, S, H, d] <-> [B, H, S, d] <-> [B, H, d, S].
      using View = Val::View;
      using P = std::vector<int64_t>;
      const View from = x.view;
      View to = View::None;
      if (from == View::Tokens && perm == P{0, 2, 1, 3})
        to = View::Heads;
      else if (from == View::Tokens && perm == P{0, 2, 3, 1})
        to = View::HeadsT;
      else if (from == View::Heads && perm == P{0, 2, 1, 3})
        to = View::Tokens;
      else if (from == View::Heads && perm == P{0, 1, 3, 2})
        to = View::HeadsT;
      else if (from == View::HeadsT && perm == P{0, 1, 3, 2})
        to = View::Heads;
      else if (from == View::HeadsT && perm == P{0, 3, 1, 2})
        to = View::Tokens;
      if (to == View::None && x.flatSH && !x.seqFirst && x.v &&
          (perm == P{1, 0, 2} || perm == P{1, 2, 0})) {
        // [A, C*H, d] to [C*H, A, d]: the model takes axis 1 as the batch, as
        // nn.MultiheadAttention does with sequence-first activations. Inputs whose rows reach
        // here are taken sequence-first in a rerun (importModel).
        seqFirstFound_.merge(rowSources(*x.v));
      }
      if (to == View::None || (to == View::Tokens && x.repeat != 1))
        throw UnsupportedError{transposeRefusal(x, perm, "an activation split into heads", "")};
      Val v = x;
      v.view = to;
      v.shape = to == View::Tokens  ? P{x.batch, x.seq, x.heads, x.headDim}
                : to == View::Heads ? P{x.batch, x.heads, x.seq, x.headDim}
                                    : P{x.batch, x.heads, x.headDim, x.seq};
      define(n, std::move(v));
      return;
    }
    if (x.isConst && x.shape.size() != 2)
      return define(n, permuted(x, perm));
    if (!x.isConst && x.v && !x.queryMajor && x.shape.size() == 3 &&
        perm == std::vector<int64_t>{1, 0, 2} &&
        g_.op(*x.v).type.shape == std::vector<int64_t>{x.shape[0] * x.shape[1], x.shape[2]}) {
      // [B, S, E] <-> [S, B, E]: the same token-major rows, seen sequence-first or not.
      Val v = x;
      v.seqFirst = !x.seqFirst;
      v.shape = {x.shape[1], x.shape[0], x.shape[2]};
      return define(n, std::move(v));
    }
    if (!x.isConst && x.v && !x.queryMajor && !x.seqFirst && x.shape.size() == 3 &&
        perm == std::vector<int64_t>{0, 2, 1} &&
        g_.op(*x.v).type.shape == std::vector<int64_t>{x.shape[0] * x.shape[1], x.shape[2]}) {
      // [B, S, d] -> [B, d, S]: the keys of one head (GPTBigCode's multi-query K^T), as
      // [B*H, d, S] with H = 1.
      Val v = x;
      v.view = Val::View::HeadsT;
      v.flatBH = true;
      v.batch = x.shape[0];
      v.seq = x.shape[1];
      v.heads = 1;
      v.headDim = x.shape[2];
      v.repeat = 1;
      v.shape = {x.shape[0], x.shape[2], x.shape[1]};
      return define(n, std::move(v));
    }
    if (x.shape.size() != 2 || (!perm.empty() && perm != std::vector<int64_t>{1, 0}))
      throw UnsupportedError{"only the transpose of a matrix is supported"};
    if (!x.isConst) {
      // A transposed activation: only as the B operand of a MatMul, where it is transpose_b.
      Val v;
      v.shape = {x.shape[1], x.shape[0]};
      v.transposedOf = n.input(0);
      define(n, std::move(v));
      return;
    }
    // A weight: transposed once, here (the model's constant).
    Val v;
    v.isConst = true;
    v.shape = {x.shape[1], x.shape[0]};
    if (x.integer)
      throw UnsupportedError{"transposing an integer tensor is not supported"};
    const size_t r = static_cast<size_t>(x.shape[0]), c = static_cast<size_t>(x.shape[1]);
    v.fdata = std::make_shared<std::vector<float>>(count(x));
    for (size_t i = 0; i < r; ++i)
      for (size_t j = 0; j < c; ++j)
        (*v.fdata)[j * r + i] = static_cast<float>(at(x, i * c + j));
    define(n, std::move(v));
  }

  /// A constant of any rank transposed by `perm` (reversed axes when empty): T5's relative
  /// position bias, [Sq, Sk, H] -> [H, Sq, Sk].
  static Val permuted(const Val& x, std::vector<int64_t> perm) {
    const size_t rank = x.shape.size();
    if (perm.empty())
      for (size_t i = rank; i-- > 0;)
        perm.push_back(static_cast<int64_t>(i));
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < rank; ++i)
      if (perm.size() != rank || sorted[i] != static_cast<int64_t>(i))
        throw UnsupportedError{"its perm " + shapeStr(perm) + " is not a permutation of the " +
                               std::to_string(rank) + " axes of " + shapeStr(x.shape)};
    std::vector<int64_t> shape(rank), stride(rank, 1), from(rank);
    for (size_t i = rank; i-- > 1;)
      stride[i - 1] = stride[i] * x.shape[i];
    for (size_t i = 0; i < rank; ++i) {
      shape[i] = x.shape[static_cast<size_t>(perm[i])];
      from[i] = stride[static_cast<size_t>(perm[i])];
    }
    std::vector<double> out(count(x));
    std::vector<int64_t> idx(rank, 0);
    size_t src = 0;
    for (double& o : out) {
      o = at(x, src);
      for (size_t d = rank; d-- > 0;) { // the next index of the result, row-major
        src += static_cast<size_t>(from[d]);
        if (++idx[d] < shape[d])
          break;
        src -= static_cast<size_t>(from[d] * shape[d]);
        idx[d] = 0;
      }
    }
    return constOf(std::move(shape), std::move(out), x.integer);
  }

  /// A head view as a rank-4 tensor in token order (the `heads` op, made once per value), for
  /// elementwise ops, slices and concatenations on heads.
  Val dense4(const NodeProto& n, Val& x) {
    using View = Val::View;
    if (x.view == View::Dense4)
      return x;
    if (x.seqFirst)
      throw UnsupportedError{"'" + x.name + "' " + shapeStr(x.shape) +
                             " are heads of a sequence-first activation; fpat computes on them "
                             "only in attention's products"};
    if (x.headMajor)
      throw UnsupportedError{cacheRefusal(x)};
    if (x.flatBH || x.flatSH)
      throw UnsupportedError{"'" + x.name + "' " + shapeStr(x.shape) +
                             " is an activation split into heads and merged with the " +
                             (x.flatBH ? "batch" : "sequence") +
                             "; fpat computes on it only in attention's products"};
    if ((x.view != View::Tokens && x.view != View::Heads) || x.repeat != 1)
      throw UnsupportedError{"'" + x.name + "' " + shapeStr(x.shape) +
                             " is an activation split into heads in a layout fpat computes on "
                             "only in attention's products (Q K^T, P V)"};
    if (!x.other) {
      ir::Op op;
      op.kind = ir::OpKind::Heads;
      op.batch = x.batch;
      op.headDim = x.headDim;
      x.other = emit(n, op, {*x.v}, {x.batch, x.seq, x.heads, x.headDim}, 0, x.name + ".heads").v;
    }
    Val v = x;
    v.view = View::Dense4;
    v.order = x.view;
    v.v = x.other;
    v.other.reset();
    return v;
  }

  /// A Dense4 value as the head view of a token-major activation (merge_heads, made once per
  /// value); any other value as it is.
  Val headView(const NodeProto& n, Val& x) {
    using View = Val::View;
    if (x.view != View::Dense4)
      return x;
    if (!x.other) {
      ir::Op op;
      op.kind = ir::OpKind::MergeHeads;
      x.other =
          emit(n, op, {*x.v}, {x.batch * x.seq, x.heads * x.headDim}, 0, x.name + ".merged").v;
    }
    Val v = x;
    v.view = x.order;
    v.order = View::None;
    v.v = x.other;
    v.other.reset();
    return v;
  }

  /// `x` itself, or where it is Dense4 its head view, made in `scratch` (the value in vals_
  /// stays the one later uses find: a weight's vertex is made once).
  Val& asHeadView(const NodeProto& n, Val& x, Val& scratch) {
    if (x.view != Val::View::Dense4)
      return x;
    scratch = headView(n, x);
    return scratch;
  }

  /// A constant (RoPE's cos and sin tables) as an operand of an elementwise op on Dense4 `x`:
  /// its ONNX shape broadcast against x's, put in token order (axes 1 and 2 swapped where x
  /// is seen as [B, H, S, d]).
  ir::Vertex tokenOrderConst(const Val& c, const Val& x) {
    const std::string key = c.name + (x.order == Val::View::Heads ? "@heads" : "@tokens");
    if (auto it = tokenConsts_.find(key); it != tokenConsts_.end())
      return it->second; // q and k share RoPE's tables
    return tokenConsts_[key] = makeTokenOrderConst(c, x);
  }
  ir::Vertex makeTokenOrderConst(const Val& c, const Val& x) {
    std::vector<int64_t> s4(4, 1);
    if (c.shape.size() > 4)
      throw UnsupportedError{"'" + c.name + "' " + shapeStr(c.shape) +
                             " has more than 4 dimensions"};
    std::copy(c.shape.begin(), c.shape.end(),
              s4.end() - static_cast<std::ptrdiff_t>(c.shape.size()));
    broadcast(s4, x.shape); // the ONNX shapes agree
    if (numel(c.shape) == 1 || x.order == Val::View::Tokens) {
      Val v = constOf(numel(c.shape) == 1 ? std::vector<int64_t>{} : s4, valuesOf(c), false);
      v.name = c.name;
      return tensor(v);
    }
    const std::vector<int64_t> t = {s4[0], s4[2], s4[1], s4[3]};
    std::vector<double> out(static_cast<size_t>(numel(s4)));
    for (int64_t a = 0; a < s4[0]; ++a)
      for (int64_t h = 0; h < s4[1]; ++h)
        for (int64_t q = 0; q < s4[2]; ++q)
          for (int64_t e = 0; e < s4[3]; ++e)
            out[static_cast<size_t>(((a * t[1] + q) * t[2] + h) * t[3] + e)] =
                at(c, static_cast<size_t>(((a * s4[1] + h) * s4[2] + q) * s4[3] + e));
    Val v = constOf(t, std::move(out), false);
    v.name = c.name + ".tokens";
    return tensor(v);
  }

  /// An elementwise op with a head value among its operands (RoPE: x * cos, rotate_half(x) *
  /// sin, their sum): computed on Dense4 tensors, the other operand a head value of the same
  /// heads or a constant.
  void headsBinary(const NodeProto& n, ir::OpKind k, Val& a, Val& b,
                   const std::vector<int64_t>& shape) {
    using View = Val::View;
    // x: the head value of the result's shape (the other may be one head, broadcast).
    Val& x = a.view != View::None && (b.view == View::None || a.shape == shape) ? a : b;
    const Val X = dense4(n, x);
    std::vector<ir::Vertex> ops(2);
    for (int i = 0; i < 2; ++i) {
      Val& o = i == 0 ? a : b;
      if (&o == &x) {
        ops[static_cast<size_t>(i)] = *X.v;
      } else if (o.view != View::None) {
        const Val O = dense4(n, o);
        // The same heads, or one head (Hugging Face's cos and sin) broadcast over them.
        const std::vector<int64_t>&os = g_.op(*O.v).type.shape, &xs = g_.op(*X.v).type.shape;
        // One head of one token ([B, 1, 1, d]) reads the same in either order.
        const bool sameOrder = O.order == X.order || (O.heads == 1 && O.seq == 1);
        if (!sameOrder || (os != xs && ir::broadcastShapes(os, xs) != xs))
          throw UnsupportedError{"its operands '" + a.name + "' " + shapeStr(a.shape) + " and '" +
                                 b.name + "' " + shapeStr(b.shape) +
                                 " are heads of different layouts"};
        ops[static_cast<size_t>(i)] = *O.v;
      } else if (shape != X.shape && g_.op(*X.v).type.shape == X.shape &&
                 ((o.isConst && o.shape.size() <= 4) ||
                  (o.v && g_.op(*o.v).type.shape == o.shape && o.shape.size() == 4))) {
        // x and o both hold their elements in their ONNX order (x split so that its heads'
        // order is the ONNX one), the result larger than x: a broadcasting op of rank-4
        // tensors, whose result is no head value. BERT's padding mask [B, 1, 1, S] added to
        // the scores [B, H, Sq, Sk]; Hugging Face's causal mask [B, 1, S, S], a constant, added
        // to the padding mask.
        ir::Vertex vo;
        if (o.isConst) {
          Val c = o;
          c.v.reset();
          while (c.shape.size() < 4)
            c.shape.insert(c.shape.begin(), 1);
          vo = tensor(c);
        } else {
          vo = *o.v;
        }
        ir::Op op;
        op.kind = k;
        return define(
            n, emit(n, op,
                    i == 0 ? std::vector<ir::Vertex>{vo, *X.v} : std::vector<ir::Vertex>{*X.v, vo},
                    shape));
      } else if (o.isConst) {
        ops[static_cast<size_t>(i)] = tokenOrderConst(o, X);
      } else {
        throw UnsupportedError{"of the elementwise ops on an activation split into heads ('" +
                               x.name + "' " + shapeStr(x.shape) +
                               "), only those with constants or other heads are supported; '" +
                               o.name + "' is computed at run time"};
      }
    }
    if (shape != X.shape)
      throw UnsupportedError{"its result " + shapeStr(shape) + " is larger than the heads '" +
                             x.name + "' " + shapeStr(X.shape)};
    ir::Op op;
    op.kind = k;
    Val v = X;
    v.v = emit(n, op, ops, g_.op(*X.v).type.shape).v;
    define(n, std::move(v));
  }

  /// One of ONNX Attention's Q, K, V (opset 23: what torch's dynamo exporter writes for
  /// scaled_dot_product_attention): its token-major vertex [B*S, H*d] and B, S, H, d. Rank 3
  /// ([B, S, H*d], `heads` from the node's attribute) or rank 4 heads of a token-major
  /// activation ([B, H, S, d], a Reshape and Transpose of a projection).
  struct AttnIn {
    ir::Vertex v;
    int64_t batch, seq, heads, d;
  };
  AttnIn attnIn(const NodeProto& n, int i, const char* what, const char* headsAttr) {
    Val scratch;
    Val& x = asHeadView(n, in(n, i), scratch); // heads computed on (RoPE): their view
    const std::string name = std::string(what) + " '" + x.name + "' " + shapeStr(x.shape);
    if (x.isConst || !x.v || x.seqFirst || x.queryMajor || x.intInput || x.lazyExpand)
      throw UnsupportedError{name + " must be an activation in the model's row order"};
    if (x.shape.size() == 3 && x.view == Val::View::None) {
      const int64_t h = intAttr(n, headsAttr, 0);
      if (h < 1 || x.shape[2] % h != 0)
        throw UnsupportedError{name + " is rank 3, [B, S, H*d]: attribute " + headsAttr +
                               " must divide its last dimension"};
      if (g_.op(*x.v).type.shape != std::vector<int64_t>{x.shape[0] * x.shape[1], x.shape[2]})
        throw UnsupportedError{name + " is not token-major"};
      return {*x.v, x.shape[0], x.shape[1], h, x.shape[2] / h};
    }
    if (x.shape.size() == 4 && x.view == Val::View::Heads && !x.flatBH && x.repeat == 1)
      return {*x.v, x.batch, x.seq, x.heads, x.headDim};
    throw UnsupportedError{name + " must be [B, S, H*d] or the heads [B, H, S, d] of a token-major "
                                  "activation (a Reshape and Transpose of a projection)"};
  }

  /// ONNX Attention (opset 23): one `attention` op. The mask (bool: true keeps; float: added)
  /// and is_causal (top-left, as the operator defines it without a cache) become its bias; a
  /// run-time bool mask a fill of f32's lowest (-65504 in f16) where it is false, so a fully
  /// masked row averages where ONNX gives NaN. Caches, softcap and the scores output are
  /// refused.
  void attentionOp(const NodeProto& n) {
    if (hasIn(n, 6))
      throw UnsupportedError{"nonpad_kv_seqlen (a KV cache in the graph) is not supported"};
    const bool cached = hasIn(n, 4) || hasIn(n, 5);
    if (cached && !(hasIn(n, 4) && hasIn(n, 5)))
      throw UnsupportedError{"it has a past key or a past value, not both"};
    if (cached && intAttr(n, "is_causal", 0) != 0)
      throw UnsupportedError{"is_causal with a past key and value: the operator's causal mask "
                             "is aligned top-left, which with a cache masks keys of the new "
                             "tokens' own past; give the mask as attn_mask instead"};
    if (floatAttr(n, "softcap", 0.0) != 0.0)
      throw UnsupportedError{"softcap is not supported"};
    if (n.output_size() > 3 && !n.output(3).empty())
      throw UnsupportedError{"its output qk_matmul_output (the scores) is not supported"};
    const AttnIn q = attnIn(n, 0, "Q", "q_num_heads"), k = attnIn(n, 1, "K", "kv_num_heads"),
                 v = attnIn(n, 2, "V", "kv_num_heads");
    const Val& qv = in(n, 0);
    if (k.batch != q.batch || v.batch != q.batch || k.seq != v.seq || k.heads != v.heads ||
        k.d != q.d || v.d != q.d || q.heads % k.heads != 0)
      throw UnsupportedError{"Q " + shapeStr(qv.shape) + ", K " + shapeStr(in(n, 1).shape) +
                             " and V " + shapeStr(in(n, 2).shape) +
                             " must share the batch and head size, K and V their length and "
                             "heads, whose count divides Q's"};
    // A cache: present_key and present_value are past_key and past_value [B, Hkv, P, d] with
    // K and V appended, which attention reads.
    std::optional<ir::Vertex> kc, vc;
    if (cached) {
      auto append = [&](int i, const AttnIn& fresh) {
        const Val& past = in(n, i);
        const std::vector<int64_t> want = {q.batch, fresh.heads, -1, fresh.d};
        if (past.isConst || !past.v || past.view != Val::View::None || past.shape.size() != 4 ||
            past.shape[0] != want[0] || past.shape[1] != want[1] || past.shape[3] != want[3] ||
            g_.op(*past.v).type.shape != past.shape)
          throw UnsupportedError{std::string(i == 4 ? "its past key '" : "its past value '") +
                                 past.name + "' " + shapeStr(past.shape) +
                                 " must be a cache [B, Hkv, P, d] = [" + std::to_string(want[0]) +
                                 ", " + std::to_string(want[1]) + ", P, " +
                                 std::to_string(want[3]) + "] given at run time"};
        ir::Op op;
        op.kind = ir::OpKind::KvAppend;
        std::vector<int64_t> t = past.shape;
        t[2] += fresh.seq;
        const int o = i - 3; // present_key, present_value
        const std::string name = o < n.output_size() && !n.output(o).empty()
                                     ? n.output(o)
                                     : n.output(0) + (o == 1 ? ".present_key" : ".present_value");
        return *emit(n, op, {*past.v, fresh.v}, t, 0, name).v;
      };
      kc = append(4, k);
      vc = append(5, v);
    }
    const int64_t B = q.batch, Sq = q.seq, Sk = cached ? g_.op(*kc).type.shape[2] : k.seq;
    const bool causal = intAttr(n, "is_causal", 0) != 0;
    const double lowest = -3.4028234663852886e38;
    // The bias [.., Sq, Sk]: the mask's, the causal one's, or their sum.
    std::optional<ir::Vertex> bias;
    auto constBias = [&](std::vector<int64_t> shape, const std::function<double(size_t)>& f) {
      ir::Op w;
      w.kind = ir::OpKind::Input;
      w.weight = true;
      w.name = uniqueName(n.output(0) + ".bias");
      w.type = {shape, *dtype_};
      w.origin = "node '" + nodeName(n) + "' (Attention): its mask as a bias";
      auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(numel(shape)));
      for (size_t i = 0; i < data->size(); ++i)
        (*data)[i] = static_cast<float>(f(i));
      w.data = std::move(data);
      return g_.addOp(std::move(w), {});
    };
    if (hasIn(n, 3)) {
      Val& m = in(n, 3);
      if (m.shape.empty() || m.shape.size() > 4 || m.shape.back() != Sk ||
          (m.shape.size() >= 2 && m.shape[m.shape.size() - 2] != Sq &&
           m.shape[m.shape.size() - 2] != 1))
        throw UnsupportedError{"its mask '" + m.name + "' " + shapeStr(m.shape) +
                               " must broadcast to the scores [B, H, " + std::to_string(Sq) + ", " +
                               std::to_string(Sk) + "] (a shorter mask is not supported)"};
      std::vector<int64_t> shape = m.shape;
      while (shape.size() < 4)
        shape.insert(shape.begin(), 1);
      const bool boolean = m.integer || m.intInput || m.binary01;
      if (m.isConst) {
        bias = constBias(shape, [&](size_t i) {
          const double x = at(m, count(m) == 1 ? 0 : i);
          return boolean ? (x != 0 ? 0.0 : -INFINITY) : x;
        });
      } else {
        Val mm = m; // a bool input is a float one of 0s and 1s in the IR
        mm.binary01 = mm.binary01 || mm.intInput;
        mm.intInput = false;
        ir::Vertex t = tensor(mm);
        if (g_.op(t).type.shape != m.shape)
          throw UnsupportedError{"its mask '" + m.name + "' " + shapeStr(m.shape) +
                                 " is not held in its own order (rank 3 masks are folded)"};
        if (boolean) { // (m - 1) * -lowest: 0 where kept, lowest where not
          ir::Op one, sub, fill, mul;
          one.kind = fill.kind = ir::OpKind::Constant;
          one.value = 1.0;
          fill.value = -lowest;
          one.type = fill.type = {{}, *dtype_};
          sub.kind = ir::OpKind::Sub;
          mul.kind = ir::OpKind::Mul;
          const ir::Vertex c1 = emit(n, one, {}, {}, 0, n.output(0) + ".one").v.value();
          const ir::Vertex d = emit(n, sub, {t, c1}, shape, 0, n.output(0) + ".kept").v.value();
          const ir::Vertex f = emit(n, fill, {}, {}, 0, n.output(0) + ".fill").v.value();
          t = emit(n, mul, {d, f}, shape, 0, n.output(0) + ".bias").v.value();
        }
        bias = t;
      }
    }
    if (causal) {
      const ir::Vertex c = constBias({1, 1, Sq, Sk}, [&](size_t i) {
        return static_cast<int64_t>(i) % Sk > static_cast<int64_t>(i) / Sk ? -INFINITY : 0.0;
      });
      if (bias) {
        ir::Op add;
        add.kind = ir::OpKind::Add;
        bias = emit(n, add, {*bias, c}, {}, 0, n.output(0) + ".masks").v.value();
      } else {
        bias = c;
      }
    }
    ir::Op zero, sc;
    zero.kind = sc.kind = ir::OpKind::Constant;
    zero.type = sc.type = {{}, *dtype_};
    sc.value = floatAttr(n, "scale", 1.0 / std::sqrt(static_cast<double>(q.d)));
    if (!bias)
      bias = emit(n, zero, {}, {}, 0, n.output(0) + ".nobias").v.value();
    const ir::Vertex scale = emit(n, sc, {}, {}, 0, n.output(0) + ".scale").v.value();
    ir::Op op;
    op.kind = ir::OpKind::Attention;
    op.batch = B;
    op.headDim = q.d;
    const bool heads4 = qv.shape.size() == 4;
    Val y = emit(n, op, {q.v, cached ? *kc : k.v, cached ? *vc : v.v, *bias, scale},
                 heads4 ? std::vector<int64_t>{B, q.heads, Sq, q.d}
                        : std::vector<int64_t>{B, Sq, q.heads * q.d});
    if (heads4) { // the heads [B, H, Sq, d] of the token-major result, as P V gives them
      y.view = Val::View::Heads;
      y.batch = B;
      y.seq = Sq;
      y.heads = q.heads;
      y.headDim = q.d;
      y.repeat = 1;
    }
    define(n, std::move(y));
    // present_key and present_value: the caches; without one, K and V themselves, as heads
    // [B, Hkv, S, d] (rank-3 K and V would need a transpose fpat does not make).
    for (int o = 1; o < 3 && o < n.output_size(); ++o)
      if (!n.output(o).empty() && cached) {
        const ir::Vertex c = o == 1 ? *kc : *vc;
        Val p;
        p.v = c;
        p.shape = g_.op(c).type.shape;
        makeCacheView(p, p.shape);
        define(n, std::move(p), o);
      } else if (!n.output(o).empty()) {
        if (!heads4)
          throw UnsupportedError{"its output present_" + std::string(o == 1 ? "key" : "value") +
                                 " of rank-3 K and V ([B, Hkv, S, d]) is not supported"};
        define(n, in(n, o), o);
      }
  }

  /// MatMul of heads: Q K^T ([B, H, Sq, d] x [B, H, d, Sk]) is attn_qk, P V ([B, H, Sq, Sk] x
  /// [B, H, Sk, d]) attn_pv, whose result is the heads of a token-major activation.
  void headMatmul(const NodeProto& n, Val& a, Val& b) {
    using View = Val::View;
    ir::Op op;
    if (a.headMajor)
      throw UnsupportedError{cacheRefusal(a)};
    if (a.view == View::Tokens && a.flatSH) {
      // [B, Sq*H, d] x [B, d, Sk]: every query head against one key head (GPTBigCode's
      // multi-query attention), scores [B, H, Sq, Sk] seen as [B, Sq*H, Sk].
      if (b.view != View::HeadsT || !b.flatBH || b.heads != 1 || b.batch != a.batch ||
          b.headDim != a.headDim)
        throw UnsupportedError{"of products of '" + a.name + "' " + shapeStr(a.shape) +
                               " (the heads of each token as rows), only that with the keys of "
                               "one head, [B, d, Sk], is supported (multi-query Q K^T)"};
      op.kind = ir::OpKind::AttnQk;
      op.batch = a.batch;
      op.headDim = a.headDim;
      Val v = emit(n, op, {*a.v, *b.v}, {a.batch, a.heads, a.seq, b.seq});
      v.shape = {a.batch, a.seq * a.heads, b.seq};
      v.queryMajor = true;
      return define(n, std::move(v));
    }
    if (a.view == View::Heads && b.view == View::HeadsT) {
      // (K of one head against every query head: multi-query attention by broadcasting.)
      if (a.batch != b.batch || (a.heads != b.heads && (b.heads != 1 || a.flatBH)) ||
          a.headDim != b.headDim || a.repeat != 1 || a.flatBH != b.flatBH)
        throw UnsupportedError{"its heads " + shapeStr(a.shape) + " and " + shapeStr(b.shape) +
                               " do not fit Q K^T"};
      op.kind = ir::OpKind::AttnQk;
      op.batch = a.batch;
      op.headDim = a.headDim;
      define(n, emit(n, op, {*a.v, *b.v},
                     a.flatBH ? std::vector<int64_t>{a.batch * a.heads, a.seq, b.seq}
                              : std::vector<int64_t>{a.batch, a.heads, a.seq, b.seq}));
      return;
    }
    // P: [B, H, Sq, Sk], or [B*H, Sq, Sk] over a rank-4 IR tensor where V is [B*H, Sk, d].
    const bool flatP = a.view == View::None && b.flatBH && a.shape.size() == 3 && a.v &&
                       g_.op(*a.v).type.shape.size() == 4;
    if (a.view == View::None && (a.shape.size() == 4 || flatP) && b.view == View::Heads) {
      const std::vector<int64_t> p = flatP ? g_.op(*a.v).type.shape : a.shape;
      const int64_t heads = b.heads == 1 && !b.flatBH ? p[1] : b.heads; // (V of one head: MQA)
      if (p != std::vector<int64_t>{b.batch, heads, p[2], b.seq} || (!flatP && b.flatBH))
        throw UnsupportedError{"its operands " + shapeStr(a.shape) + " and heads " +
                               shapeStr(b.shape) + " do not fit P V"};
      op.kind = ir::OpKind::AttnPv;
      op.batch = b.batch;
      op.headDim = b.headDim;
      Val v = emit(n, op, {tensor(a), *b.v}, {b.batch * p[2], heads * b.headDim});
      v.view = View::Heads;
      v.shape = b.flatBH ? std::vector<int64_t>{b.batch * heads, p[2], b.headDim}
                         : std::vector<int64_t>{b.batch, heads, p[2], b.headDim};
      v.batch = b.batch;
      v.seq = p[2];
      v.heads = heads;
      v.headDim = b.headDim;
      v.repeat = 1;
      v.flatBH = b.flatBH;
      define(n, std::move(v));
      return;
    }
    throw UnsupportedError{"a product of " + shapeStr(a.shape) + " and " + shapeStr(b.shape) +
                           " with heads is supported as attention's Q K^T ([B, H, Sq, d] x [B, "
                           "H, d, Sk]) and P V ([B, H, Sq, Sk] x [B, H, Sk, d]) only"};
  }

  /// P V with P query-major ([B, Sq*H, Sk]) and V one head ([B, Sk, d], multi-query): attn_pv,
  /// whose result [B*Sq, H*d] the model sees as [B, Sq*H, d], each token's heads as rows.
  void queryMajorPv(const NodeProto& n, Val& p, Val& v) {
    const std::vector<int64_t> ir = g_.op(*p.v).type.shape; // [B, H, Sq, Sk]
    if (p.shape != std::vector<int64_t>{ir[0], ir[2] * ir[1], ir[3]} || v.isConst || !v.v ||
        v.view != Val::View::None || v.queryMajor ||
        v.shape != std::vector<int64_t>{ir[0], ir[3], v.shape.size() == 3 ? v.shape[2] : -1} ||
        g_.op(*v.v).type.shape != std::vector<int64_t>{ir[0] * ir[3], v.shape[2]})
      throw UnsupportedError{"of products of the query-major scores '" + p.name + "' " +
                             shapeStr(p.shape) + ", only that with the values of one head, [B, " +
                             std::to_string(ir[3]) + ", d], is supported (multi-query P V), not " +
                             shapeStr(v.shape)};
    ir::Op op;
    op.kind = ir::OpKind::AttnPv;
    op.batch = ir[0];
    op.headDim = v.shape[2];
    Val y = emit(n, op, {*p.v, *v.v}, {ir[0] * ir[2], ir[1] * v.shape[2]});
    y.view = Val::View::Tokens;
    y.flatSH = true;
    y.shape = {ir[0], ir[2] * ir[1], v.shape[2]};
    y.batch = ir[0];
    y.seq = ir[2];
    y.heads = ir[1];
    y.headDim = v.shape[2];
    y.repeat = 1;
    define(n, std::move(y));
  }

  /// MatMul of constants, in double (transformers 4.38-4.44's rotary frequencies, inv_freq @
  /// position_ids): NumPy's rules, batch dimensions broadcast, a vector operand promoted.
  void constMatmul(const NodeProto& n) {
    Val a = in(n, 0), b = in(n, 1);
    if (a.shape.empty() || b.shape.empty())
      throw UnsupportedError{"its operands must not be scalars"};
    const bool vecA = a.shape.size() == 1, vecB = b.shape.size() == 1;
    if (vecA)
      a.shape.insert(a.shape.begin(), 1);
    if (vecB)
      b.shape.push_back(1);
    const int64_t m = a.shape[a.shape.size() - 2], k = a.shape.back(), nn = b.shape.back();
    if (b.shape[b.shape.size() - 2] != k)
      throw UnsupportedError{"its operands " + shapeStr(in(n, 0).shape) + " and " +
                             shapeStr(in(n, 1).shape) + " do not multiply"};
    const std::vector<int64_t> ba(a.shape.begin(), a.shape.end() - 2),
        bb(b.shape.begin(), b.shape.end() - 2);
    const std::vector<int64_t> batch = broadcast(ba, bb);
    std::vector<int64_t> shape = batch;
    if (!vecA)
      shape.push_back(m);
    if (!vecB)
      shape.push_back(nn);
    checkConstSize(shape);
    // Each operand's batch index for each batch of the result (0 where it is broadcast).
    const Val ia = broadcastIndices(ba, batch), ib = broadcastIndices(bb, batch);
    const int64_t batches = numel(batch);
    std::vector<double> out(static_cast<size_t>(batches * m * nn));
    for (int64_t t = 0; t < batches; ++t) {
      const auto oa = static_cast<int64_t>(at(ia, static_cast<size_t>(t))) * m * k,
                 ob = static_cast<int64_t>(at(ib, static_cast<size_t>(t))) * k * nn;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nn; ++j) {
          double acc = 0;
          for (int64_t l = 0; l < k; ++l)
            acc += at(a, static_cast<size_t>(oa + i * k + l)) *
                   at(b, static_cast<size_t>(ob + l * nn + j));
          out[static_cast<size_t>((t * m + i) * nn + j)] = acc;
        }
    }
    define(n, constOf(shape, std::move(out), a.integer && b.integer));
  }

  void matmul(const NodeProto& n) {
    const bool gemm = n.op_type() == "Gemm";
    if (!gemm && in(n, 0).isConst && in(n, 1).isConst)
      return constMatmul(n);
    Val ca, cb;
    Val& a = asHeadView(n, in(n, 0), ca);
    Val& b = asHeadView(n, in(n, 1), cb);
    if (!gemm && a.queryMajor)
      return queryMajorPv(n, a, b);
    if (!gemm && (a.view != Val::View::None || b.view != Val::View::None))
      return headMatmul(n, a, b);
    if (gemm && intAttr(n, "transA", 0))
      throw UnsupportedError{"transA = 1 is not supported"};
    const bool tB = gemm && intAttr(n, "transB", 0);
    if (a.shape.size() < 2)
      throw UnsupportedError{"its A operand " + shapeStr(a.shape) + " must have rank 2 or more"};
    if (b.shape.size() != 2)
      throw UnsupportedError{"its B operand " + shapeStr(b.shape) +
                             " must be a matrix (batched products are not supported)"};
    // The product's B as [K, N], and how the IR reads it: MatMul(x, Transpose(W)) reads W as
    // [N, K] (transpose_b), which is how nn.Linear stores it.
    const int64_t kb = b.shape[tB ? 1 : 0], nn = b.shape[tB ? 0 : 1];
    ir::Vertex vb;
    bool transB = tB;
    const double alpha = gemm ? floatAttr(n, "alpha", 1.0) : 1.0;
    const bool alphaFolded = alpha != 1.0 && b.isConst && !b.integer && b.transposedOf.empty();
    if (!b.transposedOf.empty()) {
      vb = tensor(vals_.find(b.transposedOf)->second);
      transB = !tB;
    } else if (alphaFolded) {
      // alpha (x B) = x (alpha B): a weight's scale is folded into it, not run as a kernel.
      Val s;
      s.isConst = true;
      s.data = {alpha};
      Val scaledB = foldBinary(ir::OpKind::Mul, b, s, b.shape);
      scaledB.name = b.name + ".alpha";
      vb = tensor(scaledB);
    } else {
      vb = tensor(b);
    }
    const int64_t k = a.shape.back();
    if (k != kb)
      throw UnsupportedError{"A " + shapeStr(a.shape) + " and B " + shapeStr(b.shape) +
                             (tB ? " (transposed)" : "") + " do not fit"};
    std::vector<int64_t> shape = a.shape;
    shape.back() = nn;
    ir::Op op;
    op.kind = ir::OpKind::Gemm;
    op.transposeB = transB;
    Val y = emit(n, op, {tensor(a), vb}, shape);
    if (!gemm)
      return define(n, std::move(y));
    const double beta = floatAttr(n, "beta", 1.0);
    if (alpha != 1.0 && !alphaFolded)
      y = scaled(n, y, alpha);
    if (hasIn(n, 2) && beta != 0.0) {
      Val& c = in(n, 2);
      const std::vector<int64_t> s = broadcast(y.shape, c.shape);
      checkFlatBroadcast(c.shape, s);
      Val sc = beta == 1.0 ? Val{} : scaled(n, c, beta);
      const ir::Vertex vc = beta == 1.0 ? tensor(c) : tensor(sc);
      ir::Op add;
      add.kind = ir::OpKind::Add;
      y = emit(n, add, {*y.v, vc}, s);
    }
    define(n, std::move(y));
  }

  Val scaled(const NodeProto& n, Val& x, double s) {
    Val c;
    c.isConst = true;
    c.data = {s};
    c.name = nodeName(n) + ".scale";
    if (x.isConst && !x.integer) { // a constant C times beta: folded
      Val v = foldBinary(ir::OpKind::Mul, x, c, x.shape);
      v.name = x.name + ".scaled";
      return v;
    }
    ir::Op mul;
    mul.kind = ir::OpKind::Mul;
    return emit(n, mul, {tensor(x), tensor(c)}, x.shape);
  }

  const ImportOptions& opts_;
  const ir::ActivationSet& acts_;
  ImportResult& r_;
  ExternalData external_; // the model's external data files, mapped once
  ir::Graph g_;
  std::optional<ir::DType> dtype_;
  std::map<std::string, Val> vals_;
  // Values with no elements because a Slice kept nothing of an axis (GPT-2's causal buffer of
  // n_positions rows sliced past its end), and the values computed from them: what the Slice
  // did, for the error of the node that cannot use them.
  std::map<std::string, std::string> emptied_;
  std::map<std::string, int> onnxUses_; // nodes reading each value, and graph outputs naming it
  std::map<std::string, ir::Vertex> tokenConsts_; // constants in token order, by use
  std::set<std::string> used_;
  const std::set<std::string>& seqFirstIn_;
  std::set<std::string> seqFirstFound_;
};

} // namespace

const std::vector<std::string>& supportedOpTypes() {
  static const std::vector<std::string> ops = Importer::opTypes();
  return ops;
}

ir::Graph convertPrecision(const ir::Graph& g, ir::DType t) {
  ir::Graph out = g;
  for (ir::Vertex v : out.vertices()) {
    ir::Op& op = out.op(v);
    op.type.dtype = t;
    // A constant beyond the type's range (a mask's fill of f32's lowest value, as HF's BERT
    // multiplies its padding mask by): the type's largest finite value of that sign, which
    // the softmax gives no weight alike. fpatc says so; the f32 model keeps the exact value.
    if (op.kind == ir::OpKind::Constant && std::isfinite(op.value) &&
        std::fabs(op.value) > ir::largestFinite(t))
      op.value = std::copysign(ir::largestFinite(t), op.value);
    if (op.data && t != ir::DType::F32) {
      auto data = std::make_shared<std::vector<float>>();
      data->reserve(op.data->size());
      adviseHugePages(data->data(), op.data->size() * sizeof(float));
      data->resize(op.data->size());
      const std::vector<float>& from = *op.data;
      parallelFor(from.size(), size_t{1} << 20, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i)
          (*data)[i] = ir::roundTo(from[i], t);
      });
      op.data = std::move(data);
    }
  }
  return out;
}

bool looksLikeOnnx(const std::string& path, const std::string& bytes) {
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0)
    return true;
  // A ModelProto starts with field 1 (ir_version, varint): byte 0x08. .fgraph text never does.
  return !bytes.empty() && bytes[0] == '\x08';
}

ImportResult importModel(const std::string& bytes, const ImportOptions& opts,
                         const ir::ActivationSet& acts) {
  ImportResult r;
  ::onnx::ModelProto m;
  if (bytes.size() > static_cast<size_t>(INT32_MAX)) {
    r.problems.push_back({"", "",
                          "the file is larger than 2 GB, protobuf's limit (models that "
                          "large keep their weights in external data files: onnx.save(..., "
                          "save_as_external_data=True))"});
    return r;
  }
  if (!m.ParseFromString(bytes)) {
    r.problems.push_back(
        {"", "", "not a valid ONNX model: protobuf decoding failed (truncated or corrupt file)"});
    return r;
  }
  // A model that reads an input sequence-first (nn.Transformer's default layers) is found by
  // its attention's transposes; it imports on a rerun that takes that input so (a decoder's
  // memory, found later, on another).
  std::set<std::string> seqFirst;
  for (;;) {
    Importer imp(opts, acts, r, seqFirst);
    imp.run(m);
    const std::set<std::string>& found = imp.seqFirstFound();
    if (r.problems.empty() ||
        std::includes(seqFirst.begin(), seqFirst.end(), found.begin(), found.end()))
      return r;
    seqFirst.insert(found.begin(), found.end());
    r = ImportResult{};
  }
}

} // namespace fpat::onnx
