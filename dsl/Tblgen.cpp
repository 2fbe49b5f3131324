#include "fpat/dsl/Tblgen.h"

#include "fpat/dsl/Matcher.h"
#include "fpat/support/Verify.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

namespace fpat::dsl {
namespace {

nlohmann::ordered_json toJson(const Value& v) {
  using J = nlohmann::ordered_json;
  switch (v.kind) {
  case Value::Unset:
    return nullptr;
  case Value::Int:
    return v.i;
  case Value::Float:
    return v.f;
  case Value::String:
    return v.s;
  case Value::Bit:
    return v.i != 0;
  case Value::List: {
    J a = J::array();
    for (const ValuePtr& i : v.items)
      a.push_back(toJson(*i));
    return a;
  }
  case Value::Rec: {
    if (!v.rec->anonymous)
      return J{{"def", v.rec->name}};
    J o = J::object();
    o["instance"] = v.rec->name;
    for (const Field& f : v.rec->fields)
      o[f.name] = toJson(*f.value);
    return o;
  }
  case Value::Dag: {
    J o = J::object();
    o["op"] = v.items[0]->rec->name;
    J args = J::array();
    for (size_t i = 1; i < v.items.size(); ++i)
      args.push_back(toJson(*v.items[i]));
    o["args"] = args;
    if (!v.dagName.empty())
      o["name"] = v.dagName;
    return o;
  }
  case Value::Binding:
    return J{{"binding", v.s}};
  case Value::Body:
    return J{{"expr", printExpr(*v.body)}};
  }
  return nullptr;
}

std::string dumpJson(const RecordKeeper& rk, const SourceManager& sm) {
  using J = nlohmann::ordered_json;
  J root = J::object();
  J classes = J::array(), defs = J::object();
  for (const Record* c : rk.classes())
    classes.push_back(c->name);
  for (const Record* r : rk.defs()) {
    J o = J::object();
    J supers = J::array();
    for (const Record* s : r->supers)
      supers.push_back(s->name);
    o["!superclasses"] = supers;
    o["!location"] = sm.file(r->loc.file).name + ":" + std::to_string(r->loc.line);
    for (const Field& f : r->fields)
      o[f.name] = toJson(*f.value);
    defs[r->name] = o;
  }
  root["!classes"] = classes;
  root["!defs"] = defs;
  return root.dump(2) + "\n";
}

std::string depEscape(const std::string& p) {
  std::string o;
  for (char c : p) {
    if (c == ' ' || c == '#')
      o += '\\';
    if (c == '$')
      o += '$';
    o += c;
  }
  return o;
}

bool writeOutput(const std::string& path, const std::string& text, bool ifChanged,
                 std::ostream& err) {
  if (ifChanged) {
    std::string old;
    if (readFile(path, old) && old == text)
      return true;
  }
  // Write to a temporary and rename, so readers never see a half-written file.
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << text;
    if (!f) {
      err << "fpat-tblgen: error: cannot write '" << tmp << "'\n";
      return false;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    err << "fpat-tblgen: error: cannot write '" << path << "': " << ec.message() << "\n";
    return false;
  }
  return true;
}

} // namespace

int runTblgen(const TblgenOptions& opts, std::ostream& out, std::ostream& err) {
  std::string text;
  if (std::string why; !readInput(opts.input, text, &why)) {
    err << "fpat-tblgen: error: cannot read '" << inputName(opts.input) << "': " << why << "\n";
    return 1;
  }
  SourceManager sm;
  int fileId = sm.addBuffer(inputName(opts.input), std::move(text));
  DiagEngine diags(sm, opts.verifyDiagnostics ? nullptr : &err);
  diags.setErrorLimit(opts.verifyDiagnostics ? 0 : opts.errorLimit);
  diags.setWarningsAsErrors(opts.warningsAsErrors);
  CompileOptions copts;
  copts.includeDirs = opts.includeDirs;
  copts.defines = opts.defines;
  std::optional<Compilation> c = compileFpat(fileId, sm, diags, copts);
  MatcherTable table;
  if (c &&
      (opts.action == TblgenOptions::GenMatcherTable || opts.action == TblgenOptions::PrintTable ||
       opts.action == TblgenOptions::Check || opts.verifyDiagnostics))
    table = compileMatcherTable(c->library, sm, diags);
  diags.flush();
  if (opts.verifyDiagnostics) {
    auto problems = verifyDiagnostics(diags, fileId);
    for (const std::string& p : problems)
      err << opts.input << ": verify: " << p << "\n";
    if (problems.empty())
      out << opts.input << ": " << diags.diagnostics().size() << " diagnostic(s) as expected\n";
    return problems.empty() ? 0 : 1;
  }
  if (!c || diags.hasErrors()) {
    err << diags.errorCount() << " error" << (diags.errorCount() == 1 ? "" : "s")
        << " generated.\n";
    return 1;
  }

  std::string result;
  switch (opts.action) {
  case TblgenOptions::PrintRecords:
    result = printRecords(*c->records);
    break;
  case TblgenOptions::DumpJson:
    result = dumpJson(*c->records, sm);
    break;
  case TblgenOptions::GenMatcherTable:
    result = emitMatcherTableInc(table, opts.input, opts.tableFunction);
    break;
  case TblgenOptions::GenEpilogues:
    if (!opts.genEpilogues) {
      err << "fpat-tblgen: --gen-epilogues needs the CUDA lowering, which this caller did not "
             "provide\n";
      return 1;
    }
    result = opts.genEpilogues(c->library.activations, opts.input);
    break;
  case TblgenOptions::PrintTable:
    result = disassemble(table);
    break;
  case TblgenOptions::Check:
    break;
  }
  const bool toStdout = opts.output.empty() || opts.output == "-";
  if (opts.action == TblgenOptions::Check)
    ; // nothing to write
  else if (toStdout)
    out << result;
  else if (!writeOutput(opts.output, result, opts.writeIfChanged, err))
    return 1;
  if (!opts.depfile.empty()) {
    std::string deps = depEscape(toStdout ? "-" : opts.output) + ":";
    for (const std::string& d : c->dependencies)
      deps += " " + depEscape(d);
    if (!writeOutput(opts.depfile, deps + "\n", opts.writeIfChanged, err))
      return 1;
  }
  return 0;
}

} // namespace fpat::dsl
