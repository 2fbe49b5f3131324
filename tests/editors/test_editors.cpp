// The editor grammars (editors/) against the languages: every keyword of both ANTLR grammars,
// every op of the .fpat vocabulary and of the IR, and every expression intrinsic must be
// highlighted by the VS Code (TextMate) grammar and the Vim syntax file, and the TextMate files
// must be valid JSON whose patterns compile. A keyword added to a grammar without a highlight
// fails here.
#define BOOST_TEST_MODULE editors
#include "fpat/dsl/Library.h"
#include "fpat/ir/Graph.h"

#include <boost/test/unit_test.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

namespace {

std::string slurp(const std::string& rel) {
  std::ifstream in(std::string(FPAT_SOURCE_DIR) + "/" + rel, std::ios::binary);
  BOOST_TEST_REQUIRE(static_cast<bool>(in), "cannot read " << rel);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Quoted word literals of an ANTLR grammar: its keywords ('def', 'graph', ...).
std::set<std::string> grammarKeywords(const std::string& g4) {
  std::set<std::string> out;
  const std::string text = slurp(g4);
  const std::regex lit("'([A-Za-z_][A-Za-z0-9_]*)'");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), lit); it != std::sregex_iterator();
       ++it)
    out.insert((*it)[1]);
  return out;
}

/// Every "match" regex of a TextMate grammar, with the scope name it gives.
void collectMatches(const nlohmann::json& j,
                    std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_object()) {
    if (j.contains("match"))
      out.emplace_back(j.value("name", ""), j["match"].get<std::string>());
    for (auto& [key, value] : j.items())
      collectMatches(value, out);
  } else if (j.is_array()) {
    for (const auto& v : j)
      collectMatches(v, out);
  }
}

struct TextMate {
  std::vector<std::pair<std::string, std::regex>> rules; // scope name, pattern

  explicit TextMate(const std::string& rel) {
    nlohmann::json j;
    BOOST_REQUIRE_NO_THROW(j = nlohmann::json::parse(slurp(rel)));
    BOOST_TEST(j.value("scopeName", "").rfind("source.", 0) == 0u);
    std::vector<std::pair<std::string, std::string>> matches;
    collectMatches(j, matches);
    BOOST_TEST(!matches.empty());
    for (auto& [name, re] : matches)
      try {
        rules.emplace_back(name, std::regex(re));
      } catch (const std::regex_error& e) {
        BOOST_ERROR(rel << ": pattern '" << re << "' does not compile: " << e.what());
      }
  }

  /// The scope a whole word gets: the first rule (in file order) that matches all of it.
  std::string scopeOf(const std::string& word) const {
    for (auto& [name, re] : rules)
      if (std::regex_match(word, re))
        return name;
    return "";
  }
};

/// `syntax keyword GROUP words...` lines of a Vim syntax file: word -> group.
std::map<std::string, std::string> vimKeywords(const std::string& rel) {
  std::map<std::string, std::string> out;
  std::istringstream in(slurp(rel));
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string syntax, keyword, group;
    if (!(words >> syntax >> keyword >> group) || syntax != "syntax" || keyword != "keyword")
      continue;
    for (std::string w; words >> w;)
      out[w] = group;
  }
  return out;
}

/// Names defined in patterns/fpat.fpat as ops, epilogue ops and predicates.
std::set<std::string> fpatVocabulary() {
  std::set<std::string> out;
  const std::string text = slurp("patterns/fpat.fpat");
  const std::regex def(R"(def\s+([a-z_]+)\s*:\s*(Op|EpilogueOp|Predicate)<)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), def); it != std::sregex_iterator();
       ++it)
    out.insert((*it)[1]);
  return out;
}

void expectHighlighted(const TextMate& tm, const std::map<std::string, std::string>& vim,
                       const std::string& word, const std::string& scopePrefix,
                       const std::string& what) {
  BOOST_TEST_CONTEXT(what << " '" << word << "'") {
    const std::string scope = tm.scopeOf(word);
    BOOST_TEST(scope.rfind(scopePrefix, 0) == 0u,
               "TextMate scope '" << scope << "', want " << scopePrefix << "*");
    BOOST_TEST(vim.count(word) == 1u, "missing from the Vim syntax keywords");
  }
}

} // namespace

BOOST_AUTO_TEST_CASE(fpat_grammar_covers_the_language) {
  const TextMate tm("editors/vscode/syntaxes/fpat.tmLanguage.json");
  const auto vim = vimKeywords("editors/vim/syntax/fpat.vim");
  const auto keywords = grammarKeywords("grammar/Fpat.g4");
  BOOST_TEST(keywords.count("multiclass") == 1u); // the extraction itself works
  for (const std::string& k : keywords) {
    const bool boolean = k == "true" || k == "false";
    const bool type = k == "list";
    expectHighlighted(tm, vim, k,
                      boolean ? "constant.language"
                      : type  ? "storage.type"
                              : "keyword",
                      "grammar keyword");
  }
  const auto ops = fpatVocabulary();
  BOOST_TEST(ops.count("gemm") == 1u);
  for (const std::string& op : ops)
    expectHighlighted(tm, vim, op, "support.function", ".fpat op");
  for (const std::string& f : fpat::dsl::intrinsicNames())
    expectHighlighted(tm, vim, f, "support.function", "intrinsic");
  // Not keywords: ordinary names and bindings.
  BOOST_TEST(tm.scopeOf("my_pattern") == "");
  BOOST_TEST(tm.scopeOf("$x").rfind("variable", 0) == 0u);
  BOOST_TEST(tm.scopeOf("Pattern").rfind("entity.name.type", 0) == 0u);
}

BOOST_AUTO_TEST_CASE(fgraph_grammar_covers_the_language) {
  const TextMate tm("editors/vscode/syntaxes/fgraph.tmLanguage.json");
  const auto vim = vimKeywords("editors/vim/syntax/fgraph.vim");
  for (const std::string& k : grammarKeywords("grammar/FGraph.g4")) {
    const bool boolean = k == "true" || k == "false";
    expectHighlighted(tm, vim, k, boolean ? "constant.language" : "keyword", "grammar keyword");
  }
  for (const fpat::ir::OpKindInfo& op : fpat::ir::opKinds())
    expectHighlighted(tm, vim, op.name, "support.function", "IR op");
  // Every element type the IR has (bf16 had been left out).
  for (fpat::ir::DType t : {fpat::ir::DType::F16, fpat::ir::DType::F32, fpat::ir::DType::BF16})
    expectHighlighted(tm, vim, fpat::ir::dtypeName(t), "storage.type", "dtype");
  BOOST_TEST(tm.scopeOf("%x.1").rfind("variable", 0) == 0u);
  BOOST_TEST(tm.scopeOf("gelu") == "");
}

BOOST_AUTO_TEST_CASE(vscode_extension_is_complete) {
  nlohmann::json pkg;
  BOOST_REQUIRE_NO_THROW(pkg = nlohmann::json::parse(slurp("editors/vscode/package.json")));
  std::set<std::string> languages;
  for (const auto& l : pkg["contributes"]["languages"]) {
    languages.insert(l["id"].get<std::string>());
    const std::string conf = l["configuration"].get<std::string>();
    BOOST_REQUIRE_NO_THROW(nlohmann::json::parse(slurp("editors/vscode/" + conf.substr(2))));
  }
  BOOST_TEST((languages == std::set<std::string>{"fpat", "fgraph"}));
  for (const auto& g : pkg["contributes"]["grammars"]) {
    const std::string path = g["path"].get<std::string>();
    const nlohmann::json grammar = nlohmann::json::parse(slurp("editors/vscode/" + path.substr(2)));
    BOOST_TEST(grammar["scopeName"] == g["scopeName"]);
  }
}
