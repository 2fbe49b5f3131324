// The registry of kernel families: one per line of fpat/ir/Families.def, each made by its
// implementation's IR part (src/families/<impl>/Ir.cpp).
#include "fpat/ir/Family.h"

#include "fpat/ir/Graph.h"
#include "fpat/support/Diagnostics.h"

#include <memory>

namespace fpat::ir {

namespace {

/// Owns every family; their order is Family's.
const std::vector<std::unique_ptr<KernelFamily>>& registry() {
  static const std::vector<std::unique_ptr<KernelFamily>> all = [] {
    std::vector<std::unique_ptr<KernelFamily>> out;
#define FPAT_KERNEL_FAMILY(Id, name, impl) out.push_back(families::impl##Ir(Family::Id, name));
#include "fpat/ir/Families.def"
    for (size_t i = 0; i < out.size(); ++i)
      if (static_cast<size_t>(out[i]->family) != i)
        throw std::logic_error(std::string("kernel family '") + out[i]->name +
                               "' was made with another family's id");
    return out;
  }();
  return all;
}

} // namespace

const std::vector<const KernelFamily*>& kernelFamilies() {
  static const std::vector<const KernelFamily*> view = [] {
    std::vector<const KernelFamily*> out;
    for (const auto& f : registry())
      out.push_back(f.get());
    return out;
  }();
  return view;
}

const KernelFamily* findFamily(std::string_view name) {
  for (const KernelFamily* f : kernelFamilies())
    if (name == f->name)
      return f;
  return nullptr;
}

const KernelFamily& kernelFamily(Family f) {
  return *kernelFamilies().at(static_cast<size_t>(f));
}

const KernelFamily* familyOf(const Op& op) {
  if (op.kind == OpKind::Gemm)
    return &kernelFamily(Family::Gemm);
  return op.kind == OpKind::Fused ? findFamily(op.fused.family) : nullptr;
}

std::string familyDidYouMean(std::string_view name) {
  std::vector<std::string> names;
  for (const KernelFamily* f : kernelFamilies())
    names.push_back(f->name);
  return didYouMean(name, names);
}

std::string kernelFamilyList() {
  std::string s;
  const size_t n = kernelFamilies().size();
  for (size_t i = 0; i < n; ++i)
    s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kernelFamilies()[i]->name;
  return s;
}

} // namespace fpat::ir
