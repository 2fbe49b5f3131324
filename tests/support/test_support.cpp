// Diagnostics engine, golden-expectation verifier and small utilities.
#define BOOST_TEST_MODULE support
#include "fpat/support/Diagnostics.h"
#include "fpat/support/Verify.h"

#include <boost/test/unit_test.hpp>
#include <cstdlib>
#include <sstream>

using namespace fpat;

BOOST_AUTO_TEST_CASE(renders_location_source_line_and_caret) {
  SourceManager sm;
  int f = sm.addBuffer("a.fgraph", "graph g {\n  %h = gemm %q, %w\n}\n");
  std::ostringstream os;
  DiagEngine d(sm, &os);
  d.error(SourceLoc{f, 2, 13, 2}, "use of undefined value '%q'");
  d.note(SourceLoc{f, 1, 7, 1}, "in graph 'g'");
  d.flush();
  BOOST_TEST(os.str() == "a.fgraph:2:13: error: use of undefined value '%q'\n"
                         "  %h = gemm %q, %w\n"
                         "            ^~\n"
                         "a.fgraph:1:7: note: in graph 'g'\n"
                         "graph g {\n"
                         "      ^\n");
  BOOST_TEST(d.errorCount() == 1);
}

BOOST_AUTO_TEST_CASE(error_limit_stops_reporting) {
  SourceManager sm;
  int f = sm.addBuffer("x", "a\n");
  std::ostringstream os;
  DiagEngine d(sm, &os);
  d.setErrorLimit(2);
  for (int i = 0; i < 5; ++i)
    d.error(SourceLoc{f, 1, 1, 1}, "e" + std::to_string(i));
  d.flush();
  BOOST_TEST(d.errorCount() == 2);
  BOOST_TEST(d.limitReached());
  BOOST_TEST(os.str().find("too many errors") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(werror_promotes_warnings) {
  SourceManager sm;
  DiagEngine d(sm);
  d.setWarningsAsErrors(true);
  d.warning({}, "w");
  BOOST_TEST(d.errorCount() == 1);
}

BOOST_AUTO_TEST_CASE(utf8_validation) {
  size_t bad = 0;
  BOOST_TEST(validateUtf8("plain ascii", &bad));
  BOOST_TEST(validateUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", &bad));
  BOOST_TEST(!validateUtf8("ab\xff", &bad));
  BOOST_TEST(bad == 2u);
  BOOST_TEST(!validateUtf8("x\xc3", &bad)); // truncated sequence
  BOOST_TEST(bad == 1u);
  BOOST_TEST(!validateUtf8("\xc0\xaf", &bad));     // overlong
  BOOST_TEST(!validateUtf8("\xed\xa0\x80", &bad)); // surrogate
}

BOOST_AUTO_TEST_CASE(format_double_round_trips) {
  for (double v : {1e-5, 0.1, 1.0, 3.0, 0.7978845608, 1e300, -2.5e-310, 123456789.0}) {
    std::string s = formatDouble(v);
    BOOST_TEST(std::strtod(s.c_str(), nullptr) == v, s);
    BOOST_TEST(s.find_first_of(".en") != std::string::npos, s);
  }
  BOOST_TEST(formatDouble(1e-5) == "1e-05");
  BOOST_TEST(formatDouble(2.0) == "2.0");
}

namespace {
std::vector<std::string> verifyText(const std::string& text,
                                    const std::vector<std::pair<int, std::string>>& errors) {
  SourceManager sm;
  int f = sm.addBuffer("t", text);
  DiagEngine d(sm);
  for (auto& [line, msg] : errors)
    d.error(SourceLoc{f, line, 1, 1}, msg);
  return verifyDiagnostics(d, f);
}
} // namespace

BOOST_AUTO_TEST_CASE(verify_matches_expectations) {
  std::string text = "// expected-error@+1 {{undefined}}\n"
                     "bad line\n"
                     "other // expected-error {{arity}}\n";
  BOOST_TEST(verifyText(text, {{2, "use of undefined value"}, {3, "wrong arity"}}).empty());
}

BOOST_AUTO_TEST_CASE(verify_reports_missing_and_unexpected) {
  std::string text = "// expected-error@+1 {{undefined}}\nbad line\n";
  auto wrongLine = verifyText(text, {{1, "undefined"}});
  BOOST_TEST(wrongLine.size() == 2u); // unexpected on line 1, expected on line 2 not seen
  auto missing = verifyText(text, {});
  BOOST_REQUIRE(missing.size() == 1u);
  BOOST_TEST(missing[0].find("not seen") != std::string::npos);
  auto wrongText = verifyText(text, {{2, "something else"}});
  BOOST_TEST(wrongText.size() == 2u);
}

BOOST_AUTO_TEST_CASE(verify_any_line_and_notes) {
  SourceManager sm;
  int f = sm.addBuffer("t", "// expected-error@* {{boom}}\n// expected-note@+1 {{here}}\nx\n");
  DiagEngine d(sm);
  d.error(SourceLoc{f, 3, 1, 1}, "boom");
  d.note(SourceLoc{f, 3, 1, 1}, "defined here");
  BOOST_TEST(verifyDiagnostics(d, f).empty());
}
