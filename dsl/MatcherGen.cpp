// The pattern compiler: patterns -> matcher programs -> ordered, prefix-factored byte code.
#include "fpat/dsl/Matcher.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>

namespace fpat::dsl {

const char* opcodeName(uint8_t opc) {
  static const char* names[] = {"?",
                                "OPC_Scope",
                                "OPC_CheckKind",
                                "OPC_CheckActivation",
                                "OPC_Record",
                                "OPC_MoveChild",
                                "OPC_MoveParent",
                                "OPC_CheckSame",
                                "OPC_CheckOneUse",
                                "OPC_CheckDtype",
                                "OPC_CheckDivisible",
                                "OPC_Complete",
                                "OPC_CheckConstant",
                                "OPC_CheckRank",
                                "OPC_CheckHalf",
                                "OPC_CheckWeight",
                                "OPC_CheckLayout",
                                "OPC_CheckPairs"};
  return opc <= OPC_CheckPairs ? names[opc] : "?";
}

bool constantMatches(double graphValue, double literal) {
  return std::fabs(graphValue - literal) <= 1e-6 * std::max(1.0, std::fabs(literal));
}

namespace {

struct Instr {
  std::vector<uint8_t> bytes; // opcode and operands
  std::string comment;
  bool operator==(const Instr& o) const { return bytes == o.bytes; }
};
using Program = std::vector<Instr>;

void put16(std::vector<uint8_t>& b, unsigned v) {
  b.push_back(static_cast<uint8_t>(v & 0xff));
  b.push_back(static_cast<uint8_t>(v >> 8));
}

/// Scope alternatives are sized in 32 bits: 16 overflowed once a few patterns had their 256
/// operand orders each (the raise table passed 64 KB in one scope and matching crashed).
void put32(std::vector<uint8_t>& b, size_t v) {
  for (int k = 0; k < 4; ++k)
    b.push_back(static_cast<uint8_t>((v >> (8 * k)) & 0xff));
}

/// Commutative ops whose operand orders are tried (a variant bit each, in pre-order).
constexpr int kMaxCommutative = 8;

class ProgramBuilder {
public:
  ProgramBuilder(const PatternDef& p, unsigned patternIdx, uint32_t variant,
                 std::vector<std::string>& strings)
      : p_(p), idx_(patternIdx), variant_(variant), strings_(strings) {}

  Program build(PatternMeta* meta) {
    node(p_.root, true);
    for (const Constraint& c : p_.constraints) {
      uint8_t slot = static_cast<uint8_t>(slots_.at(c.binding));
      if (c.kind == Constraint::Dtype) {
        prog_.push_back({{OPC_CheckDtype, slot, static_cast<uint8_t>(c.dtype)},
                         "$" + c.binding + " is " + ir::dtypeName(c.dtype)});
      } else if (c.kind == Constraint::Half) {
        prog_.push_back(
            {{OPC_CheckHalf, slot, static_cast<uint8_t>(c.dim)},
             "$" + c.binding + " is the " + (c.dim ? "second" : "first") + " half of its operand"});
      } else if (c.kind == Constraint::Weight) {
        prog_.push_back({{OPC_CheckWeight, slot}, "$" + c.binding + " is computed from weights"});
      } else if (c.kind == Constraint::Pairs) {
        prog_.push_back({{OPC_CheckPairs, slot, static_cast<uint8_t>(c.dim)},
                         "$" + c.binding + " rotates " + (c.dim ? "pairs" : "halves")});
      } else if (c.kind == Constraint::Layout) {
        prog_.push_back({{OPC_CheckLayout, slot, static_cast<uint8_t>(c.dim)},
                         "$" + c.binding + " reads B as " + (c.dim ? "[N, K]" : "[K, N]")});
      } else if (c.kind == Constraint::Rank) {
        prog_.push_back({{OPC_CheckRank, slot, static_cast<uint8_t>(c.dim)},
                         "$" + c.binding + " has rank " + std::to_string(c.dim)});
      } else {
        Instr in{{OPC_CheckDivisible, slot, static_cast<uint8_t>(c.dim)},
                 "$" + c.binding + ".shape[" + std::to_string(c.dim) + "] % " +
                     std::to_string(c.divisor) + " == 0"};
        for (int k = 0; k < 4; ++k)
          in.bytes.push_back(static_cast<uint8_t>((c.divisor >> (8 * k)) & 0xff));
        prog_.push_back(in);
      }
    }
    Instr done{{OPC_Complete}, p_.name};
    put16(done.bytes, idx_);
    prog_.push_back(done);
    if (meta)
      meta->slots = slotInfo_;
    return prog_;
  }

private:
  void node(const MatchNode& n, bool root) {
    if (n.kind == ir::OpKind::Activation) {
      auto it = std::find(strings_.begin(), strings_.end(), n.fn);
      unsigned s = static_cast<unsigned>(it - strings_.begin());
      if (it == strings_.end())
        strings_.push_back(n.fn);
      Instr in{{OPC_CheckActivation}, "activation " + n.fn};
      put16(in.bytes, s);
      prog_.push_back(in);
    } else {
      prog_.push_back({{OPC_CheckKind, static_cast<uint8_t>(n.kind)}, ir::opKindName(n.kind)});
    }
    if (!root && p_.singleUse)
      prog_.push_back({{OPC_CheckOneUse}, ""});
    record(root ? SlotInfo::Root : SlotInfo::Internal, n.binding);
    // Commutative binary nodes consume one variant bit, in pre-order; those past the first
    // kMaxCommutative keep their written order (a shift past the variant's width was UB).
    bool swap = false;
    if (n.commutative && n.operands.size() == 2) {
      swap = commBit_ < kMaxCommutative && ((variant_ >> commBit_) & 1);
      ++commBit_;
    }
    for (size_t i = 0; i < n.operands.size(); ++i) {
      size_t phys = swap ? 1 - i : i;
      prog_.push_back(
          {{OPC_MoveChild, static_cast<uint8_t>(phys)}, "operand " + std::to_string(phys)});
      const MatchNode& c = n.operands[i];
      if (c.leaf && c.constant) {
        Instr in{{OPC_CheckConstant}, "constant " + formatDouble(c.value)};
        uint64_t bits;
        std::memcpy(&bits, &c.value, sizeof bits);
        for (int k = 0; k < 8; ++k)
          in.bytes.push_back(static_cast<uint8_t>((bits >> (8 * k)) & 0xff));
        prog_.push_back(in);
        record(SlotInfo::Input, "");
      } else if (c.leaf) {
        if (auto it = slots_.find(c.binding); it != slots_.end())
          prog_.push_back({{OPC_CheckSame, static_cast<uint8_t>(it->second)}, "$" + c.binding});
        else
          record(SlotInfo::Input, c.binding);
      } else {
        node(c, false);
      }
      prog_.push_back({{OPC_MoveParent}, ""});
    }
  }

  void record(SlotInfo::Role role, const std::string& binding) {
    int slot = static_cast<int>(slotInfo_.size());
    if (!binding.empty())
      slots_[binding] = slot;
    slotInfo_.push_back({role, binding});
    prog_.push_back(
        {{OPC_Record}, "slot " + std::to_string(slot) + (binding.empty() ? "" : " = $" + binding)});
  }

  const PatternDef& p_;
  unsigned idx_;
  uint32_t variant_;
  std::vector<std::string>& strings_;
  Program prog_;
  std::map<std::string, int> slots_;
  std::vector<SlotInfo> slotInfo_;
  int commBit_ = 0;
};

int countCommutative(const MatchNode& n) {
  int c = n.commutative && n.operands.size() == 2 ? 1 : 0;
  for (const MatchNode& k : n.operands)
    c += countCommutative(k);
  return c;
}

/// Does every tree `b` matches also match `a`? (`a` is at least as general as `b`.)
bool subsumes(const MatchNode& a, const MatchNode& b,
              std::map<std::string, const MatchNode*>& bindA) {
  if (a.leaf && a.constant)
    return b.leaf && b.constant && b.value == a.value;
  if (a.leaf) {
    auto [it, fresh] = bindA.emplace(a.binding, &b);
    if (fresh)
      return true;
    // `a` needs the same node twice: `b` must bind the same leaf there too.
    return b.leaf && it->second->leaf && it->second->binding == b.binding;
  }
  if (b.leaf || a.kind != b.kind || a.fn != b.fn || a.operands.size() != b.operands.size())
    return false;
  auto tryOrder = [&](bool swap) {
    auto saved = bindA;
    for (size_t i = 0; i < a.operands.size(); ++i)
      if (!subsumes(a.operands[swap ? 1 - i : i], b.operands[i], bindA)) {
        bindA = saved;
        return false;
      }
    return true;
  };
  return tryOrder(false) || (a.commutative && a.operands.size() == 2 && tryOrder(true));
}

bool patternSubsumes(const PatternDef& a, const PatternDef& b) {
  if (a.singleUse && !b.singleUse)
    return false;
  std::map<std::string, const MatchNode*> bind;
  if (!subsumes(a.root, b.root, bind))
    return false;
  if (a.constraints.empty())
    return true;
  // With constraints, only identical trees with identical constraints are compared.
  std::map<std::string, const MatchNode*> back;
  return subsumes(b.root, a.root, back) && a.constraints == b.constraints;
}

struct Line {
  std::vector<uint8_t> bytes;
  std::string comment;
  int indent = 0;
};

/// Factors the shared prefixes of adjacent programs and encodes the result.
std::vector<Line> encode(std::vector<Program> progs, int indent) {
  std::vector<Line> out;
  size_t common = progs[0].size();
  if (progs.size() > 1) {
    size_t minLen = common;
    for (const Program& p : progs)
      minLen = std::min(minLen, p.size());
    common = 0;
    while (common < minLen && std::all_of(progs.begin(), progs.end(), [&](const Program& p) {
             return p[common] == progs[0][common];
           }))
      ++common;
  }
  for (size_t i = 0; i < common; ++i)
    out.push_back({progs[0][i].bytes, progs[0][i].comment, indent});
  if (progs.size() == 1)
    return out;
  for (Program& p : progs)
    p.erase(p.begin(), p.begin() + static_cast<long>(common));
  // Group adjacent programs that start alike; each group is one child of a Scope.
  std::vector<std::vector<Program>> groups;
  for (Program& p : progs) {
    if (!groups.empty() && !groups.back()[0].empty() && !p.empty() && groups.back()[0][0] == p[0])
      groups.back().push_back(std::move(p));
    else
      groups.push_back({std::move(p)});
  }
  out.push_back({{OPC_Scope}, std::to_string(groups.size()) + " alternatives", indent});
  for (size_t g = 0; g < groups.size(); ++g) {
    std::vector<Line> child = encode(std::move(groups[g]), indent + 1);
    size_t size = 0;
    for (const Line& l : child)
      size += l.bytes.size();
    Line head;
    put32(head.bytes, size);
    head.comment = "alternative " + std::to_string(g + 1) + ": " + std::to_string(size) + " bytes";
    head.indent = indent + 1;
    out.push_back(head);
    out.insert(out.end(), child.begin(), child.end());
  }
  out.push_back({{0, 0, 0, 0}, "end of scope", indent});
  return out;
}

std::string relFile(const SourceManager& sm, const SourceLoc& loc) {
  return loc.file >= 0 ? sm.file(loc.file).name : "?";
}

} // namespace

namespace {

/// Warns when `first`, tried before `later`, matches everything `later` matches.
bool warnIfShadowed(const PatternDef& first, const PatternDef& later, DiagEngine& diags) {
  if (!patternSubsumes(first, later))
    return false;
  if (patternSubsumes(later, first))
    diags.warning(later.loc, "duplicate match tree: '" + later.name + "' matches exactly what '" +
                                 first.name + "' matches, and '" + first.name + "' is tried first");
  else
    diags.warning(later.loc, "pattern '" + later.name + "' can never be selected: '" + first.name +
                                 "' (benefit " + std::to_string(first.benefit) +
                                 ") matches everything it matches and is tried first");
  diags.note(first.loc, "'" + first.name + "' is defined here");
  return true;
}

} // namespace

void warnShadowedBy(const PatternLibrary& earlier, const PatternLibrary& later, DiagEngine& diags) {
  for (const PatternDef& l : later.patterns)
    for (const PatternDef& e : earlier.patterns)
      if (e.benefit >= l.benefit && warnIfShadowed(e, l, diags))
        break;
}

MatcherTable compileMatcherTable(const PatternLibrary& lib, const SourceManager& sm,
                                 DiagEngine& diags) {
  MatcherTable t;
  std::vector<const PatternDef*> order;
  for (const PatternDef& p : lib.patterns)
    order.push_back(&p);
  std::stable_sort(order.begin(), order.end(), [](const PatternDef* a, const PatternDef* b) {
    if (a->benefit != b->benefit)
      return a->benefit > b->benefit;
    return a->order < b->order;
  });

  for (size_t j = 0; j < order.size(); ++j)
    for (size_t i = 0; i < j; ++i)
      if (warnIfShadowed(*order[i], *order[j], diags))
        break;

  std::vector<Program> programs;
  for (size_t k = 0; k < order.size(); ++k) {
    const PatternDef& p = *order[k];
    PatternMeta meta;
    meta.name = p.name;
    meta.file = relFile(sm, p.loc);
    meta.line = p.loc.line;
    meta.benefit = p.benefit;
    meta.family = p.family;
    meta.singleUse = p.singleUse;
    meta.inputs = p.inputs;
    // Each commutative op doubles the programs: up to 8 of them (256 programs) are matched in
    // either operand order, the rest as written, and the pattern says so.
    const int comm = std::min(countCommutative(p.root), kMaxCommutative);
    if (countCommutative(p.root) > kMaxCommutative)
      diags.warning(p.loc, "'" + p.name + "' has " + std::to_string(countCommutative(p.root)) +
                               " commutative ops (add, mul); the first " +
                               std::to_string(kMaxCommutative) +
                               " in pre-order match either operand order, the rest only as "
                               "written");
    std::vector<Program> variants;
    for (uint32_t v = 0; v < (1u << comm); ++v) {
      Program prog =
          ProgramBuilder(p, static_cast<unsigned>(k), v, t.strings).build(v == 0 ? &meta : nullptr);
      if (std::find(variants.begin(), variants.end(), prog) == variants.end())
        variants.push_back(prog);
    }
    meta.numVariants = static_cast<int>(variants.size());
    for (Program& v : variants)
      programs.push_back(std::move(v));
    t.patterns.push_back(std::move(meta));
  }
  if (programs.empty())
    return t;
  for (const Line& l : encode(std::move(programs), 0))
    t.bytes.insert(t.bytes.end(), l.bytes.begin(), l.bytes.end());
  return t;
}

namespace {

/// Walks encoded bytes and renders one line per instruction.
void listing(const MatcherTable& t, std::ostream& os, bool asCpp) {
  // `slot` follows Record instructions along the current path, so the listing can say which
  // slot each one fills; every alternative of a scope starts from the same count.
  std::function<size_t(size_t, size_t, int, int)> walk = [&](size_t pos, size_t end, int indent,
                                                             int slot) {
    while (pos < end) {
      const uint8_t opc = t.bytes[pos];
      std::string pad(static_cast<size_t>(2 * indent), ' ');
      auto line = [&](size_t len, const std::string& comment) {
        os << "  /*" << std::setw(5) << pos << "*/ " << pad;
        if (asCpp) {
          os << opcodeName(t.bytes[pos]);
          for (size_t k = 1; k < len; ++k)
            os << ", " << unsigned(t.bytes[pos + k]);
          os << ",";
        } else {
          os << opcodeName(t.bytes[pos]) + 4;
          for (size_t k = 1; k < len; ++k)
            os << " " << unsigned(t.bytes[pos + k]);
        }
        if (!comment.empty())
          os << (asCpp ? " // " : "  ; ") << comment;
        os << "\n";
        pos += len;
      };
      auto u16 = [&](size_t at) { return unsigned(t.bytes[at]) | unsigned(t.bytes[at + 1]) << 8; };
      auto u32 = [&](size_t at) { return scopeSize(t.bytes, at); };
      switch (opc) {
      case OPC_Scope: {
        line(1, "");
        int alt = 1;
        while (true) {
          const size_t size = u32(pos);
          os << "  /*" << std::setw(5) << pos << "*/ " << pad << "  ";
          if (asCpp)
            for (int k = 0; k < 4; ++k)
              os << unsigned(t.bytes[pos + k]) << (k < 3 ? ", " : ",");
          else
            os << "size " << size;
          os << (asCpp ? " // " : "  ; ")
             << (size ? "alternative " + std::to_string(alt++) + ", " + std::to_string(size) +
                            " bytes"
                      : std::string("end of scope"))
             << "\n";
          pos += 4;
          if (!size)
            break;
          walk(pos, pos + size, indent + 2, slot);
          pos += size;
        }
        break;
      }
      case OPC_CheckKind:
        line(2, ir::opKindName(static_cast<ir::OpKind>(t.bytes[pos + 1])));
        break;
      case OPC_CheckActivation:
        line(3, "activation " + t.strings.at(u16(pos + 1)));
        break;
      case OPC_Record:
        line(1, "slot " + std::to_string(slot++));
        break;
      case OPC_MoveParent:
      case OPC_CheckOneUse:
        line(1, "");
        break;
      case OPC_MoveChild:
        line(2, "");
        break;
      case OPC_CheckSame:
        line(2, "same node as slot " + std::to_string(t.bytes[pos + 1]));
        break;
      case OPC_CheckDtype:
        line(3, ir::dtypeName(static_cast<ir::DType>(t.bytes[pos + 2])));
        break;
      case OPC_CheckDivisible:
        line(7, "");
        break;
      case OPC_CheckConstant: {
        double v;
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k)
          bits |= uint64_t{t.bytes[pos + 1 + static_cast<size_t>(k)]} << (8 * k);
        std::memcpy(&v, &bits, sizeof v);
        line(9, "constant " + formatDouble(v));
        break;
      }
      case OPC_CheckRank:
        line(3, "rank " + std::to_string(t.bytes[pos + 2]));
        break;
      case OPC_CheckHalf:
        line(3, t.bytes[pos + 2] ? "second half" : "first half");
        break;
      case OPC_CheckWeight:
        line(2, "weight");
        break;
      case OPC_CheckLayout:
        line(3, t.bytes[pos + 2] ? "B [N, K]" : "B [K, N]");
        break;
      case OPC_CheckPairs:
        line(3, t.bytes[pos + 2] ? "rotates pairs" : "rotates halves");
        break;
      case OPC_Complete: {
        const PatternMeta& m = t.patterns.at(u16(pos + 1));
        line(3, m.name + ": " + m.file + ":" + std::to_string(m.line) + ", benefit " +
                    std::to_string(m.benefit));
        break;
      }
      default:
        line(1, "invalid opcode");
        return end;
      }
    }
    return pos;
  };
  walk(0, t.bytes.size(), 0, 0);
}

std::string cppString(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\';
    o += c;
  }
  return o + "\"";
}

} // namespace

size_t instructionLength(const std::vector<uint8_t>& b, size_t pos) {
  switch (b.at(pos)) {
  case OPC_Scope:
  case OPC_Record:
  case OPC_MoveParent:
  case OPC_CheckOneUse:
    return 1;
  case OPC_CheckKind:
  case OPC_MoveChild:
  case OPC_CheckSame:
  case OPC_CheckWeight:
    return 2;
  case OPC_CheckActivation:
  case OPC_CheckDtype:
  case OPC_CheckRank:
  case OPC_CheckHalf:
  case OPC_CheckLayout:
  case OPC_CheckPairs:
  case OPC_Complete:
    return 3;
  case OPC_CheckDivisible:
    return 7;
  case OPC_CheckConstant:
    return 9;
  default:
    return 0;
  }
}

std::vector<std::vector<uint8_t>> flattenPrograms(const MatcherTable& t) {
  std::vector<std::vector<uint8_t>> out;
  std::function<void(size_t, size_t, std::vector<uint8_t>)> walk =
      [&](size_t pos, size_t end, std::vector<uint8_t> prefix) {
        while (pos < end) {
          if (t.bytes[pos] == OPC_Scope) {
            ++pos;
            while (true) {
              const size_t size = scopeSize(t.bytes, pos);
              pos += 4;
              if (!size)
                return; // a scope ends its sequence
              walk(pos, pos + size, prefix);
              pos += size;
            }
          }
          size_t len = instructionLength(t.bytes, pos);
          if (!len)
            return;
          prefix.insert(prefix.end(), t.bytes.begin() + static_cast<long>(pos),
                        t.bytes.begin() + static_cast<long>(pos + len));
          if (t.bytes[pos] == OPC_Complete) {
            out.push_back(prefix);
            return;
          }
          pos += len;
        }
      };
  walk(0, t.bytes.size(), {});
  return out;
}

namespace {

/// Splits a linear byte program into instructions (comments are regenerated by listings).
Program splitProgram(const std::vector<uint8_t>& bytes) {
  Program p;
  for (size_t pos = 0; pos < bytes.size();) {
    size_t len = instructionLength(bytes, pos);
    p.push_back({std::vector<uint8_t>(bytes.begin() + static_cast<long>(pos),
                                      bytes.begin() + static_cast<long>(pos + len)),
                 ""});
    pos += len;
  }
  return p;
}

unsigned completeIndex(const std::vector<uint8_t>& prog) {
  size_t n = prog.size();
  return unsigned(prog[n - 2]) | unsigned(prog[n - 1]) << 8;
}

} // namespace

bool mergeMatcherTables(const MatcherTable& a, const MatcherTable& b, MatcherTable& out,
                        std::string& clash) {
  for (const PatternMeta& pa : a.patterns)
    for (const PatternMeta& pb : b.patterns)
      if (pa.name == pb.name) {
        clash = pa.name;
        return false;
      }
  out = MatcherTable{};
  out.strings = a.strings;
  std::vector<unsigned> stringMap;
  for (const std::string& s : b.strings) {
    auto it = std::find(out.strings.begin(), out.strings.end(), s);
    stringMap.push_back(static_cast<unsigned>(it - out.strings.begin()));
    if (it == out.strings.end())
      out.strings.push_back(s);
  }
  // Stable merge of the two pattern orders by benefit; ties keep `a` first.
  struct Ref {
    const MatcherTable* t;
    size_t idx;
  };
  std::vector<Ref> order;
  size_t i = 0, j = 0;
  while (i < a.patterns.size() || j < b.patterns.size()) {
    bool takeA = j >= b.patterns.size() ||
                 (i < a.patterns.size() && a.patterns[i].benefit >= b.patterns[j].benefit);
    order.push_back(takeA ? Ref{&a, i++} : Ref{&b, j++});
  }
  auto progsA = flattenPrograms(a), progsB = flattenPrograms(b);
  std::vector<Program> programs;
  for (size_t k = 0; k < order.size(); ++k) {
    const Ref& r = order[k];
    out.patterns.push_back(r.t->patterns[r.idx]);
    for (const auto& bytes : r.t == &a ? progsA : progsB) {
      if (completeIndex(bytes) != r.idx)
        continue;
      Program p = splitProgram(bytes);
      for (Instr& in : p) {
        if (in.bytes[0] == OPC_Complete) {
          in.bytes[1] = static_cast<uint8_t>(k & 0xff);
          in.bytes[2] = static_cast<uint8_t>(k >> 8);
        } else if (in.bytes[0] == OPC_CheckActivation && r.t == &b) {
          unsigned s = stringMap.at(unsigned(in.bytes[1]) | unsigned(in.bytes[2]) << 8);
          in.bytes[1] = static_cast<uint8_t>(s & 0xff);
          in.bytes[2] = static_cast<uint8_t>(s >> 8);
        }
      }
      programs.push_back(std::move(p));
    }
  }
  if (!programs.empty())
    for (const Line& l : encode(std::move(programs), 0))
      out.bytes.insert(out.bytes.end(), l.bytes.begin(), l.bytes.end());
  return true;
}

std::string disassemble(const MatcherTable& t) {
  std::ostringstream os;
  listing(t, os, false);
  return os.str();
}

std::string emitMatcherTableInc(const MatcherTable& t, const std::string& source,
                                const std::string& function) {
  std::ostringstream os;
  size_t programs = 0;
  for (const PatternMeta& p : t.patterns)
    programs += static_cast<size_t>(p.numVariants);
  os << "// fpat matcher table, generated by fpat-tblgen from " << source << ". Do not edit.\n"
     << "// " << t.patterns.size() << " patterns, " << programs << " programs, " << t.bytes.size()
     << " bytes. Patterns are tried in this order:\n";
  for (size_t i = 0; i < t.patterns.size(); ++i) {
    const PatternMeta& p = t.patterns[i];
    os << "//   " << i << ". " << p.name << "  (" << p.file << ":" << p.line << ", benefit "
       << p.benefit << ", " << p.numVariants << " program" << (p.numVariants == 1 ? "" : "s")
       << ")\n";
  }
  os << "\nfpat::dsl::MatcherTable " << function << "() {\n"
     << "  using namespace fpat::dsl;\n"
     << "  MatcherTable t;\n"
     << "  t.bytes = {\n";
  listing(t, os, true);
  os << "  };\n  t.strings = {";
  for (size_t i = 0; i < t.strings.size(); ++i)
    os << (i ? ", " : "") << cppString(t.strings[i]);
  os << "};\n  t.patterns.resize(" << t.patterns.size() << ");\n";
  for (size_t i = 0; i < t.patterns.size(); ++i) {
    const PatternMeta& p = t.patterns[i];
    os << "  { // " << p.name << ": " << p.file << ":" << p.line << ", benefit " << p.benefit
       << "\n    PatternMeta& p = t.patterns[" << i << "];\n"
       << "    p.name = " << cppString(p.name) << ";\n"
       << "    p.file = " << cppString(p.file) << ";\n"
       << "    p.line = " << p.line << ";\n"
       << "    p.benefit = " << p.benefit << ";\n"
       << "    p.family = " << cppString(p.family) << ";\n"
       << "    p.singleUse = " << (p.singleUse ? "true" : "false") << ";\n"
       << "    p.numVariants = " << p.numVariants << ";\n"
       << "    p.slots = {";
    static const char* roles[] = {"SlotInfo::Root", "SlotInfo::Internal", "SlotInfo::Input"};
    for (size_t k = 0; k < p.slots.size(); ++k)
      os << (k ? ", " : "") << "{" << roles[p.slots[k].role] << ", "
         << cppString(p.slots[k].binding) << "}";
    os << "};\n    p.inputs = {";
    for (size_t k = 0; k < p.inputs.size(); ++k)
      os << (k ? ", " : "") << cppString(p.inputs[k]);
    os << "};\n  }\n";
  }
  os << "  return t;\n}\n";
  return os.str();
}

} // namespace fpat::dsl
