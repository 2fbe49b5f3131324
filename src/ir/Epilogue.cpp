#include "fpat/ir/Epilogue.h"

#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <functional>

namespace fpat::ir {

int Epilogue::add(EpilogueNode n) {
  nodes.push_back(std::move(n));
  return static_cast<int>(nodes.size()) - 1;
}

std::vector<int> Epilogue::operands() const {
  std::vector<int> out;
  auto note = [&](int o) {
    if (std::find(out.begin(), out.end(), o) == out.end())
      out.push_back(o);
  };
  for (const EpilogueNode& n : nodes)
    if (n.kind == EpiKind::Operand) {
      note(n.operand);
    } else if (n.kind == EpiKind::Rope) {
      note(n.operand);
      note(n.operand2);
    }
  return out;
}

bool Epilogue::hasRope() const {
  return std::any_of(nodes.begin(), nodes.end(),
                     [](const EpilogueNode& n) { return n.kind == EpiKind::Rope; });
}

bool Epilogue::readsSecondAcc() const {
  return std::any_of(nodes.begin(), nodes.end(), [](const EpilogueNode& n) {
    return n.kind == EpiKind::Acc && n.operand == 1;
  });
}

std::vector<std::string> Epilogue::activations() const {
  std::vector<std::string> out;
  for (const EpilogueNode& n : nodes)
    if (n.kind == EpiKind::Activation && std::find(out.begin(), out.end(), n.fn) == out.end())
      out.push_back(n.fn);
  return out;
}

namespace {

const char* binaryName(EpiKind k) {
  return k == EpiKind::BiasAdd ? "bias_add" : k == EpiKind::Add ? "add" : "mul";
}

void print(const Epilogue& e, int i, std::string& out) {
  const EpilogueNode& n = e.nodes[static_cast<size_t>(i)];
  switch (n.kind) {
  case EpiKind::Acc:
    out += n.operand == 1 ? "acc2" : "acc";
    return;
  case EpiKind::Operand:
    out += "$" + std::to_string(n.operand);
    return;
  case EpiKind::Activation:
  case EpiKind::Rope:
    out += (n.kind == EpiKind::Rope ? std::string("rope") : n.fn) + "(";
    print(e, n.lhs, out);
    if (n.kind == EpiKind::Rope)
      out += ", $" + std::to_string(n.operand) + ", $" + std::to_string(n.operand2);
    for (const auto& [k, v] : n.params) // rope's begin and end are columns
      out += ", " + k + " = " +
             (n.kind == EpiKind::Rope ? std::to_string(static_cast<int64_t>(v)) : formatDouble(v));
    out += ")";
    return;
  default:
    out += std::string(binaryName(n.kind)) + "(";
    print(e, n.lhs, out);
    out += ", ";
    print(e, n.rhs, out);
    out += ")";
  }
}

/// Recursive descent over `expr := acc | acc2 | $INT | NAME '(' expr (',' expr)* (',' NAME '='
/// NUM)* ')'`.
class EpilogueParser {
public:
  EpilogueParser(std::string_view s, Epilogue& out) : s_(s), out_(out) {}

  bool parse(std::string& error, size_t& column) {
    const bool ok = expr(0) >= 0 && (skip(), at_ == s_.size() || fail("unexpected text"));
    if (!ok) {
      error = error_;
      column = errAt_;
    }
    return ok;
  }

private:
  void skip() {
    while (at_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[at_])))
      ++at_;
  }
  bool fail(std::string msg) {
    if (error_.empty()) {
      error_ = std::move(msg);
      errAt_ = at_;
    }
    return false;
  }
  std::string name() {
    skip();
    size_t b = at_;
    while (at_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[at_])) || s_[at_] == '_'))
      ++at_;
    return std::string(s_.substr(b, at_ - b));
  }
  bool expect(char c) {
    skip();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return fail(std::string("expected '") + c + "'");
  }

  int expr(int depth) {
    if (depth > 64)
      return fail("the epilogue nests deeper than 64 levels"), -1;
    skip();
    if (at_ < s_.size() && s_[at_] == '$') {
      ++at_;
      const size_t b = at_;
      while (at_ < s_.size() && at_ - b < 6 && std::isdigit(static_cast<unsigned char>(s_[at_])))
        ++at_;
      if (at_ == b || (at_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[at_]))))
        return fail("'$' takes an operand number from 0 to 99999"), -1;
      EpilogueNode n;
      n.kind = EpiKind::Operand;
      n.operand = std::atoi(std::string(s_.substr(b, at_ - b)).c_str());
      return out_.add(n);
    }
    const size_t start = at_;
    const std::string id = name();
    if (id.empty())
      return fail("expected 'acc', '$N' or a function such as gelu(...)"), -1;
    if (id == "acc")
      return out_.add(EpilogueNode{});
    if (id == "acc2") { // the second GEMM's accumulator (dual-GEMM families)
      EpilogueNode n;
      n.operand = 1;
      return out_.add(n);
    }
    EpilogueNode n;
    n.kind = id == "bias_add" ? EpiKind::BiasAdd
             : id == "add"    ? EpiKind::Add
             : id == "mul"    ? EpiKind::Mul
             : id == "rope"   ? EpiKind::Rope
                              : EpiKind::Activation;
    const bool named = n.kind == EpiKind::Activation || n.kind == EpiKind::Rope;
    if (!expect('('))
      return -1;
    std::vector<int> args;
    for (bool first = true;; first = false) {
      skip();
      if (!first) {
        if (at_ < s_.size() && s_[at_] == ')') {
          ++at_;
          break;
        }
        if (!expect(','))
          return -1;
      }
      // `name = number`: a parameter of an activation.
      const size_t save = at_;
      const std::string key = name();
      skip();
      if (!key.empty() && at_ < s_.size() && s_[at_] == '=') {
        ++at_;
        skip();
        std::string rest(s_.substr(at_, std::min<size_t>(64, s_.size() - at_)));
        char* end = nullptr;
        const double v = std::strtod(rest.c_str(), &end);
        if (end == rest.c_str())
          return fail("expected a number after '" + key + " ='"), -1;
        at_ += static_cast<size_t>(end - rest.c_str());
        if (!named)
          return at_ = save, fail("'" + id + "' takes no parameters"), -1;
        if (n.kind == EpiKind::Rope && key != "begin" && key != "end" && key != "head")
          return at_ = save,
                 fail("rope takes the parameters begin, end and head, not '" + key + "'"), -1;
        if (!n.params.emplace(key, v).second)
          return at_ = save, fail("parameter '" + key + "' is given twice"), -1;
        continue;
      }
      at_ = save;
      if (!n.params.empty())
        return fail("operands go before the parameters"), -1;
      const int a = expr(depth + 1);
      if (a < 0)
        return -1;
      args.push_back(a);
    }
    const size_t want = n.kind == EpiKind::Activation ? 1 : n.kind == EpiKind::Rope ? 3 : 2;
    if (args.size() != want) {
      at_ = start;
      return fail("'" + id + "' takes " + std::to_string(want) + " operand" +
                  (want == 1 ? "" : "s") + ", not " + std::to_string(args.size())),
             -1;
    }
    if (n.kind == EpiKind::Rope) {
      // rope(x, $cos, $sin, begin = B, end = E): the tables are operands read whole, not
      // values of the expression; their nodes (the last two parsed) are dropped.
      const size_t last = out_.nodes.size();
      for (size_t i = 1; i < 3; ++i)
        if (out_.nodes[static_cast<size_t>(args[i])].kind != EpiKind::Operand ||
            static_cast<size_t>(args[i]) != last - 3 + i) {
          at_ = start;
          return fail("rope's cosines and sines are operands, written $N"), -1;
        }
      n.operand = out_.nodes[last - 2].operand;
      n.operand2 = out_.nodes[last - 1].operand;
      out_.nodes.resize(last - 2);
      for (const char* k : {"begin", "end"})
        if (!n.params.count(k)) {
          at_ = start;
          return fail(std::string("rope needs its columns' ") + k + " (" + k + " = N)"), -1;
        }
      n.lhs = args[0];
      return out_.add(std::move(n));
    }
    n.lhs = args[0];
    n.rhs = want == 2 ? args[1] : -1;
    if (n.kind == EpiKind::Activation)
      n.fn = id;
    return out_.add(std::move(n));
  }

  std::string_view s_;
  Epilogue& out_;
  size_t at_ = 0;
  std::string error_;
  size_t errAt_ = 0;
};

} // namespace

Epilogue canonicalize(const Epilogue& e) {
  Epilogue out;
  if (e.nodes.empty())
    return out;
  std::vector<std::string> text(e.nodes.size());
  std::vector<bool> readsAcc(e.nodes.size(), false);
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    Epilogue one = e;
    one.nodes.resize(i + 1);
    text[i] = printEpilogue(one);
    const EpilogueNode& n = e.nodes[i];
    readsAcc[i] = n.kind == EpiKind::Acc || (n.lhs >= 0 && readsAcc[static_cast<size_t>(n.lhs)]) ||
                  (n.rhs >= 0 && readsAcc[static_cast<size_t>(n.rhs)]);
  }
  std::vector<int> done(e.nodes.size(), -1);
  std::function<int(int)> emit = [&](int i) {
    const auto u = static_cast<size_t>(i);
    if (done[u] >= 0)
      return done[u];
    EpilogueNode n = e.nodes[u];
    if (n.kind == EpiKind::Add || n.kind == EpiKind::Mul) {
      const auto l = static_cast<size_t>(n.lhs), r = static_cast<size_t>(n.rhs);
      if (readsAcc[l] != readsAcc[r] ? readsAcc[r] : text[r] < text[l])
        std::swap(n.lhs, n.rhs);
    }
    if (n.lhs >= 0)
      n.lhs = emit(n.lhs);
    if (n.rhs >= 0)
      n.rhs = emit(n.rhs);
    return done[u] = out.add(std::move(n));
  };
  emit(static_cast<int>(e.nodes.size()) - 1);
  return out;
}

std::string printEpilogue(const Epilogue& e) {
  if (e.nodes.empty())
    return "acc";
  std::string out;
  print(e, static_cast<int>(e.nodes.size()) - 1, out);
  return out;
}

bool parseEpilogue(std::string_view text, Epilogue& out, std::string& error, size_t& column) {
  out.nodes.clear();
  EpilogueParser p(text, out);
  if (!p.parse(error, column))
    return false;
  if (out.nodes.size() == 1 && out.nodes[0].kind == EpiKind::Acc)
    out.nodes.clear(); // "acc": the identity
  return true;
}

std::string checkEpilogueStructure(const Epilogue& e) {
  const int n = static_cast<int>(e.nodes.size());
  std::vector<bool> reached(e.nodes.size(), false);
  if (n == 0)
    return "";
  reached.back() = true;
  bool usesAcc = false;
  for (int i = n - 1; i >= 0; --i) {
    const EpilogueNode& x = e.nodes[static_cast<size_t>(i)];
    const bool binary =
        x.kind == EpiKind::BiasAdd || x.kind == EpiKind::Add || x.kind == EpiKind::Mul;
    const bool unary = x.kind == EpiKind::Activation || x.kind == EpiKind::Rope;
    if ((binary || unary) && (x.lhs < 0 || x.lhs >= i || (binary && (x.rhs < 0 || x.rhs >= i))))
      return "epilogue node " + std::to_string(i) + " reads a node that is not computed before it";
    if ((x.kind == EpiKind::Operand || x.kind == EpiKind::Rope) &&
        (x.operand < 0 || (x.kind == EpiKind::Rope && x.operand2 < 0)))
      return "epilogue node " + std::to_string(i) + " reads no operand";
    if (x.kind == EpiKind::Acc && x.operand != -1 && x.operand != 1)
      return "epilogue node " + std::to_string(i) + " reads an accumulator other than acc or acc2";
    if (!reached[static_cast<size_t>(i)])
      return "epilogue node " + std::to_string(i) + " does not contribute to the result";
    usesAcc = usesAcc || (x.kind == EpiKind::Acc && x.operand != 1);
    if (binary || unary)
      reached[static_cast<size_t>(x.lhs)] = true;
    if (binary)
      reached[static_cast<size_t>(x.rhs)] = true;
  }
  return usesAcc ? "" : "the epilogue does not use the accumulator (acc)";
}

} // namespace fpat::ir
