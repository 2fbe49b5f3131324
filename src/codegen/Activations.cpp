// CUDA lowering of the activation bodies of .fpat files: each body becomes a device function
// `fpat_act_<name>`, with the fewest parentheses, exp as ex2 with log2 e folded into its
// argument's constants, and divisions whose denominator is provably >= 1 without the range
// handling (fpat_common.cuh).
#include "fpat/codegen/Activations.h"

#include "fpat/codegen/Codegen.h"
#include "fpat/dsl/Records.h"
#include "fpat/support/Diagnostics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace fpat::codegen {

using dsl::ActivationDef;
using dsl::Expr;
using dsl::namedConstants;

namespace {

/// The CUDA function an intrinsic of the bodies lowers to (exp has its own lowering below).
std::string cudaFunction(const std::string& intrinsic) {
  static const std::map<std::string, std::string> t = {
      {"log", "logf"},  {"tanh", "tanhf"}, {"erf", "erff"},  {"sqrt", "sqrtf"}, {"rsqrt", "rsqrtf"},
      {"abs", "fabsf"}, {"min", "fminf"},  {"max", "fmaxf"}, {"pow", "powf"}};
  auto it = t.find(intrinsic);
  if (it == t.end())
    throw CodegenError("no CUDA lowering for the body function '" + intrinsic + "'");
  return it->second;
}

// CUDA lowering of an expression, with the fewest parentheses.
int cudaPrec(const Expr& e) {
  if (e.kind == Expr::Select)
    return 1;
  if (e.kind == Expr::Binary)
    return e.s == "/" ? 6 : e.s == "*" ? 4 : e.s == "+" || e.s == "-" ? 3 : 2;
  if (e.kind == Expr::Unary)
    return 5;
  return 6;
}

std::string cudaFloat(double v) {
  if (std::isnan(v))
    return "__int_as_float(0x7fffffff)";
  if (std::isinf(v))
    return v > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  // Negative literals get parentheses so that "x - -1.0f" never reads as "x --1.0f".
  std::string s = formatDouble(v) + "f";
  return v < 0 ? "(" + s + ")" : s;
}

std::string lowerCuda(const Expr& e, const ActivationDef& a, const std::set<std::string>& locals);

/// The value of `e` when it is a constant: literals, named constants and their arithmetic.
std::optional<double> constantValue(const Expr& e, const ActivationDef& a,
                                    const std::set<std::string>& locals) {
  switch (e.kind) {
  case Expr::Int:
    return static_cast<double>(e.i);
  case Expr::Float:
    return e.f;
  case Expr::Name:
    if (e.s == "x" || locals.count(e.s) ||
        std::count(a.paramNames.begin(), a.paramNames.end(), e.s))
      return std::nullopt;
    return namedConstants().at(e.s);
  case Expr::Unary:
    if (auto v = constantValue(*e.kids[0], a, locals))
      return -*v;
    return std::nullopt;
  case Expr::Binary: {
    if (e.s != "+" && e.s != "-" && e.s != "*" && e.s != "/")
      return std::nullopt;
    auto l = constantValue(*e.kids[0], a, locals), r = constantValue(*e.kids[1], a, locals);
    if (!l || !r)
      return std::nullopt;
    return e.s == "+" ? *l + *r : e.s == "-" ? *l - *r : e.s == "*" ? *l * *r : *l / *r;
  }
  default:
    return std::nullopt;
  }
}

/// Bounds of an expression's value over every input (NaN aside), by interval arithmetic; wide
/// where unsure. The lowering uses them to drop a division's range handling.
struct Range {
  double lo = -INFINITY, hi = INFINITY;
};

Range rangeOf(const Expr& e, const ActivationDef& a) {
  const Range all;
  auto finite = [&](double lo, double hi) {
    return std::isnan(lo) || std::isnan(hi) ? all : Range{lo, hi};
  };
  switch (e.kind) {
  case Expr::Int:
    return {static_cast<double>(e.i), static_cast<double>(e.i)};
  case Expr::Float:
    return {e.f, e.f};
  case Expr::Name: {
    for (const auto& [n, v] : a.body->lets)
      if (n == e.s)
        return rangeOf(*v, a);
    if (e.s == "x" || std::count(a.paramNames.begin(), a.paramNames.end(), e.s))
      return all;
    const double c = namedConstants().at(e.s);
    return {c, c};
  }
  case Expr::Unary: {
    const Range r = rangeOf(*e.kids[0], a);
    return {-r.hi, -r.lo};
  }
  case Expr::Binary: {
    const Range l = rangeOf(*e.kids[0], a), r = rangeOf(*e.kids[1], a);
    if (e.s == "+")
      return finite(l.lo + r.lo, l.hi + r.hi);
    if (e.s == "-")
      return finite(l.lo - r.hi, l.hi - r.lo);
    if (e.s == "*") {
      const double p[] = {l.lo * r.lo, l.lo * r.hi, l.hi * r.lo, l.hi * r.hi};
      for (double v : p)
        if (std::isnan(v))
          return all;
      return {*std::min_element(p, p + 4), *std::max_element(p, p + 4)};
    }
    if (e.s == "/")
      return all;
    return {0, 1}; // comparisons
  }
  case Expr::Select: {
    const Range t = rangeOf(*e.kids[1], a), f = rangeOf(*e.kids[2], a);
    return {std::min(t.lo, f.lo), std::max(t.hi, f.hi)};
  }
  case Expr::Call: {
    const Range r = rangeOf(*e.kids[0], a);
    if (e.s == "exp")
      return {std::exp(r.lo), std::exp(r.hi)};
    if (e.s == "tanh")
      return {std::tanh(r.lo), std::tanh(r.hi)};
    if (e.s == "erf")
      return {std::erf(r.lo), std::erf(r.hi)};
    if (e.s == "abs")
      return r.lo >= 0 ? r : Range{0, std::max(-r.lo, r.hi)};
    if (e.s == "sqrt")
      return {std::sqrt(std::max(r.lo, 0.0)), std::sqrt(std::max(r.hi, 0.0))};
    if (e.s == "min" || e.s == "max") {
      const Range q = rangeOf(*e.kids[1], a);
      return e.s == "min" ? Range{std::min(r.lo, q.lo), std::min(r.hi, q.hi)}
                          : Range{std::max(r.lo, q.lo), std::max(r.hi, q.hi)};
    }
    return all;
  }
  default:
    return all;
  }
}

/// The division a / b: fpat_divf_ge1 where b is at least 1 (as 1 + exp(y)), fpat_divf
/// otherwise (fpat_common.cuh).
std::string lowerDivision(const std::string& num, const Expr& den, const ActivationDef& a,
                          const std::set<std::string>& locals);

/// Whether k * e can take the factor k into a constant of e at no cost: e is a constant, or a
/// product, quotient or negation with a factor that can.
bool absorbsFactor(const Expr& e, const ActivationDef& a, const std::set<std::string>& locals) {
  if (constantValue(e, a, locals))
    return true;
  if (e.kind == Expr::Unary)
    return absorbsFactor(*e.kids[0], a, locals);
  if (e.kind == Expr::Binary && (e.s == "*" || e.s == "/"))
    return absorbsFactor(*e.kids[0], a, locals) ||
           (e.s == "*" && absorbsFactor(*e.kids[1], a, locals)) ||
           (e.s == "/" && constantValue(*e.kids[1], a, locals));
  if (e.kind == Expr::Binary && (e.s == "+" || e.s == "-"))
    return absorbsFactor(*e.kids[0], a, locals) || absorbsFactor(*e.kids[1], a, locals);
  return false;
}

/// CUDA for k * e, the factor folded into e's constants where that costs no operation: exp's
/// argument times log2(e) becomes ex2's, so GeLU's -2 sqrt(2/pi) (x + 0.044715 x^3) log2(e)
/// takes four f32 operations instead of six. Rounding differs from the written order by f32
/// ulps (a constant product rounded once); no cancellation is introduced, as only constant
/// factors move, never terms. Returns the code and its precedence (as cudaPrec).
std::pair<std::string, int> lowerScaled(const Expr& e, double k, const ActivationDef& a,
                                        const std::set<std::string>& locals) {
  auto paren = [](const std::pair<std::string, int>& c, int minPrec) {
    return c.second < minPrec ? "(" + c.first + ")" : c.first;
  };
  auto plain = [&](const Expr& x) { return std::pair{lowerCuda(x, a, locals), cudaPrec(x)}; };
  auto scaled = [&](const Expr& x, double f) { return lowerScaled(x, f, a, locals); };
  if (auto c = constantValue(e, a, locals))
    return {cudaFloat(k * *c), 6};
  if (e.kind == Expr::Unary)
    return scaled(*e.kids[0], -k);
  if (e.kind == Expr::Binary && e.s == "*") {
    const Expr &l = *e.kids[0], &r = *e.kids[1];
    if (auto c = constantValue(l, a, locals))
      return scaled(r, k * *c);
    if (auto c = constantValue(r, a, locals))
      return scaled(l, k * *c);
    if (absorbsFactor(l, a, locals))
      return {paren(scaled(l, k), 4) + " * " + paren(plain(r), 5), 4};
    if (absorbsFactor(r, a, locals))
      return {paren(plain(l), 4) + " * " + paren(scaled(r, k), 5), 4};
  }
  if (e.kind == Expr::Binary && e.s == "/") {
    const Expr &l = *e.kids[0], &r = *e.kids[1];
    if (auto c = constantValue(r, a, locals); c && *c != 0)
      return scaled(l, k / *c);
    if (absorbsFactor(l, a, locals))
      return {lowerDivision(scaled(l, k).first, r, a, locals), 6};
  }
  if (e.kind == Expr::Binary && (e.s == "+" || e.s == "-") && absorbsFactor(e, a, locals))
    return {paren(scaled(*e.kids[0], k), 3) + " " + e.s + " " + paren(scaled(*e.kids[1], k), 4), 3};
  if (k == 1.0)
    return plain(e);
  return {cudaFloat(k) + " * " + paren(plain(e), 5), 4};
}

std::string lowerDivision(const std::string& num, const Expr& den, const ActivationDef& a,
                          const std::set<std::string>& locals) {
  return std::string(rangeOf(den, a).lo >= 1 ? "fpat_divf_ge1<kFma>(" : "fpat_divf(") + num + ", " +
         lowerCuda(den, a, locals) + ")";
}

std::string lowerCuda(const Expr& e, const ActivationDef& a, const std::set<std::string>& locals) {
  auto sub = [&](const Expr& k, int minPrec) {
    std::string s = lowerCuda(k, a, locals);
    return cudaPrec(k) < minPrec ? "(" + s + ")" : s;
  };
  switch (e.kind) {
  case Expr::Int:
    return cudaFloat(static_cast<double>(e.i));
  case Expr::Float:
    return cudaFloat(e.f);
  case Expr::Name:
    if (e.s == "x")
      return "x";
    if (locals.count(e.s))
      return "l_" + e.s;
    if (std::count(a.paramNames.begin(), a.paramNames.end(), e.s))
      return "p_" + e.s;
    return cudaFloat(namedConstants().at(e.s));
  case Expr::Unary: {
    std::string operand = sub(*e.kids[0], 5);
    // "--x" would be a decrement in C.
    return operand[0] == '-' ? "-(" + operand + ")" : "-" + operand;
  }
  case Expr::Binary: {
    // Division through fpat_divf or fpat_divf_ge1 (fpat_common.cuh): a multiply by the
    // approximate reciprocal, without a branch; measured faster than `/` (div.full.f32) in
    // GeLU/SiLU epilogues.
    if (e.s == "/")
      return lowerDivision(lowerCuda(*e.kids[0], a, locals), *e.kids[1], a, locals);
    int p = cudaPrec(e);
    std::string l = sub(*e.kids[0], p), r = sub(*e.kids[1], p + 1);
    // A comparison yields 1.0f/0.0f, as the CPU evaluator does.
    if (p == 2)
      return "(float)(" + l + " " + e.s + " " + r + ")";
    return l + " " + e.s + " " + r;
  }
  case Expr::Select: {
    const Expr& c = *e.kids[0];
    std::string cond = c.kind == Expr::Binary && cudaPrec(c) == 2
                           ? sub(*c.kids[0], 3) + " " + c.s + " " + sub(*c.kids[1], 3)
                           : sub(c, 2) + " != 0.0f";
    return cond + " ? " + sub(*e.kids[1], 2) + " : " + sub(*e.kids[2], 1);
  }
  case Expr::Call: {
    // exp(y) as ex2(y log2 e) (fpat_common.cuh), the factor folded into y's constants.
    if (e.s == "exp")
      return "fpat_exp2f<kFma>(" + lowerScaled(*e.kids[0], M_LOG2E, a, locals).first + ")";
    std::string s = cudaFunction(e.s) + "(";
    for (size_t i = 0; i < e.kids.size(); ++i)
      s += (i ? ", " : "") + lowerCuda(*e.kids[i], a, locals);
    return s + ")";
  }
  default:
    return "0.0f";
  }
}

} // namespace

std::string emitActivationFunction(const ActivationDef& a) {
  std::ostringstream os;
  os << "// " << a.name << ": " << printExpr(*a.body) << "\n";
  if (!a.where.empty())
    os << "// from " << a.where << "\n";
  // kFma: the caller's choice of pipe for exp and division (fpat_common.cuh).
  os << "template <bool kFma = false>\n__device__ __forceinline__ float fpat_act_" << a.name
     << "(float x";
  for (const std::string& p : a.paramNames)
    os << ", float p_" << p;
  os << ") {\n";
  std::set<std::string> locals;
  for (auto& [n, v] : a.body->lets) {
    os << "  const float l_" << n << " = " << lowerCuda(*v, a, locals) << ";\n";
    locals.insert(n);
  }
  os << "  return " << lowerCuda(*a.body->kids[0], a, locals) << ";\n}\n";
  return os.str();
}

std::string emitEpilogueFunctions(const std::vector<ActivationDef>& activations,
                                  const std::string& source) {
  std::ostringstream os;
  os << "// fpat epilogue functions, generated by fpat-tblgen from " << source << ". Do not edit.\n"
     << "// Each activation body of the .fpat sources lowered to a CUDA device function.\n"
     << "#pragma once\n\n";
  for (const ActivationDef& a : activations)
    os << emitActivationFunction(a) << "\n";
  return os.str();
}

} // namespace fpat::codegen
