// The option registry (common/options.h) on a table of its own: the rules a table must keep,
// what set/get/read do, the command line it makes, and that values belong to one thread.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "options.h"
#include "stage.h"
#include "stage_list.h"

namespace {

using fa::Option;
using fa::OptionTable;

const OptionTable& table() {
  static int64_t calls = 0;
  static const OptionTable t{"99_example",
                             {Option::choice("step", {"auto", "99a", "99b"}, "the step that runs"),
                              Option::range("threads", 1, 64, 4, "worker threads"),
                              Option::range("block", 16, 128, 0, "rows per tile (0: from the budget)"),
                              Option::choice("block_k", {{0, "auto"}, {32, "32"}, {64, "64"}}, "keys per tile"),
                              Option::flag_option("count", "count the traffic")},
                             {{"calls", "how often `calls` was read", [] { return ++calls; }}}};
  return t;
}

std::string refusal(const std::string& name, int64_t value) {
  try {
    table().set(name, value);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(accepted)";
}

// Parses `args` (without the program name) with the table's flags; returns CLI11's error
// message, or "" when the line was accepted.
std::string parse(std::vector<std::string> args) {
  CLI::App app{"test"};
  table().add_to(app);
  std::vector<const char*> argv{"test"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("option registry: defaults, set, get, 0 restores the default, refusals name everything") {
  table().reset();
  CHECK(table().get("step") == 0);
  CHECK(table().get("threads") == 4);
  CHECK(table().get("block") == 0);
  table().set("step", 2);
  table().set("threads", 64);
  table().set("block_k", 32);
  CHECK(table().get("step") == 2);
  CHECK(table().read("threads") == 64);  // an option reads back as a counter too
  table().set("threads", 0);
  CHECK(table().get("threads") == 4);
  CHECK(refusal("threads", 65) == "99_example: threads = 65 is not allowed (allowed: 1 to 64, or 0 for the default (4))");
  CHECK(refusal("block", 8) == "99_example: block = 8 is not allowed (allowed: 16 to 128, or 0 for the default)");
  CHECK(refusal("step", 3) == "99_example: step = 3 is not allowed (allowed: 0 auto, 1 99a, 2 99b)");
  CHECK(refusal("block_k", 48) == "99_example: block_k = 48 is not allowed (allowed: 0 auto, 32, 64)");
  CHECK(refusal("count", -1) == "99_example: count = -1 is not allowed (allowed: 0 or 1)");
  CHECK(refusal("steps", 1) == "99_example: no option 'steps' (options: step, threads, block, block_k, count)");
  // A stage's step_names() are its "step" option's names; a range has none.
  CHECK(table().value_names("step") == std::vector<std::string>{"auto", "99a", "99b"});
  CHECK(table().value_names("block_k") == std::vector<std::string>{"auto", "32", "64"});
  CHECK_THROWS_AS(table().value_names("threads"), std::logic_error);
  CHECK(table().get("block_k") == 32);  // a refusal changes nothing
  CHECK(table().read("calls") == 1);
  CHECK(table().read("calls") == 2);
  try {
    table().read("nope");
    FAIL("read(nope) was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "99_example: no counter 'nope' (counters: calls, step, threads, block, block_k, count)");
  }
  table().reset();
  CHECK(table().get("block_k") == 0);
}

TEST_CASE("option registry: a table that breaks the rules is refused when it is made") {
  CHECK_THROWS_AS(OptionTable("t", {Option::range("a", 1, 4, 0, ""), Option::range("a", 1, 4, 0, "")}),
                  std::logic_error);
  CHECK_THROWS_AS(OptionTable("t", {Option::range("a", 0, 4, 2, "")}), std::logic_error);  // 0 is not the default
  CHECK_THROWS_AS(OptionTable("t", {Option::range("a", 1, 4, 9, "")}), std::logic_error);  // default outside
  CHECK_THROWS_AS(OptionTable("t", {Option::choice("a", {{1, "x"}, {2, "y"}}, "")}), std::logic_error);  // no 0
  CHECK_THROWS_AS(OptionTable("t", {Option::flag_option("a", "")}, {{"a", "", [] { return int64_t(0); }}}),
                  std::logic_error);  // an option and a counter of one name
  CHECK_NOTHROW(OptionTable("t", {Option::range("a", 0, 4, 0, "")}));
}

TEST_CASE("option registry: the command line takes value names and numbers, and refuses the rest") {
  table().reset();
  CHECK(parse({"--step", "99b", "--threads", "8", "--block-k", "64", "--count"}) == "");
  CHECK(table().get("step") == 2);
  CHECK(table().get("threads") == 8);
  CHECK(table().get("block_k") == 64);
  CHECK(table().get("count") == 1);
  CHECK(parse({"--step", "1", "--threads", "0"}) == "");
  CHECK(table().get("step") == 1);
  CHECK(table().get("threads") == 4);
  CHECK(parse({"--step", "99c"}) ==
        "--step: step = 99c is not allowed (allowed: 0 auto, 1 99a, 2 99b)");
  CHECK(parse({"--threads", "65"}).find("threads = 65 is not allowed (allowed: 1 to 64, or 0 for the default (4))") !=
        std::string::npos);
  CHECK(parse({"--threads", "4x"}).find("threads = 4x is not allowed") != std::string::npos);
  CHECK(table().get("threads") == 4);
  CHECK(parse({"--block-k", "48"}).find("block_k = 48 is not allowed") != std::string::npos);
  CLI::App app{"test"};
  table().add_to(app);
  const std::string help = app.help();
  CHECK(help.find("--step {auto,99a,99b}") != std::string::npos);
  CHECK(help.find("[16 to 128, or 0 for the default]") != std::string::npos);
  table().reset();
}

TEST_CASE("option registry: each thread has its own values") {
  table().reset();
  table().set("threads", 16);
  int64_t seen = -1, after = -1;
  std::thread t([&] {
    seen = table().get("threads");  // this thread never set it: the default
    table().set("threads", 2);
    after = table().get("threads");
  });
  t.join();
  CHECK(seen == 4);
  CHECK(after == 2);
  CHECK(table().get("threads") == 16);  // unchanged by the other thread
  table().reset();
}

TEST_CASE("option registry: the stages that declare a table are wired to it") {
  for (const fa::StageInfo& s : fa::all_stages()) {
    if (s.options == nullptr) continue;
    INFO(s.name);
    CHECK(s.options->stage() == s.name);
    CHECK(bool(s.set_option));
    CHECK(bool(s.get_counter));
    CHECK(bool(s.add_options));
    for (const Option& o : s.options->options()) CHECK(s.get_counter(o.name) == o.default_value);
  }
  CHECK(fa::find_stage("06").options != nullptr);
}
