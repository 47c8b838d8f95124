/// \file options.h
/// \brief The option registry: a stage declares its options once, in a table, and the table
/// serves the command line (flags and `--help`), the C ABI (`fa_set_option`,
/// `fa_get_counter`) and the benchmark.
///
/// An option is an int64 with a name, a default, and either a range or a list of named
/// values. The command line spells the name with dashes (`block_q` → `--block-q`) and takes
/// a value's name or its number; the C ABI takes the number. Value 0 always means "the
/// default" (fa_c.h), so an option whose default is not 0 must not allow 0 as a value.
///
/// Values are per thread: `set` changes the calling thread's value, `get` reads it, and a
/// stage reads its options with `get` at the start of each call. Two threads can run the
/// same stage with different options at once; a thread that never set an option sees its
/// default. Counters (what a run measured, e.g. stage 06's traffic) are per thread too: the
/// stage keeps them in `thread_local` storage and declares how to read them.
///
/// A stage writes, in its register.cpp:
/// \code
/// const fa::OptionTable& options() {
///   static const fa::OptionTable table{"10_hopper_fwd", {
///       fa::Option::choice("step", {"auto", "10a", "10b", "10c", "10d"},
///                          "the step that runs (auto: the stage's main kernel)"),
///   }};
///   return table;
/// }
/// ...
///   options().attach(s);  // in info(): fills s.add_options, s.set_option, s.get_counter
///   ... int(options().get("step")) ...  // at call time, in the stage's forward
/// \endcode
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace fa {

struct StageInfo;

/// One option of a stage.
struct Option {
  std::string name;  ///< the C ABI's name, e.g. "block_q"; the command line's is --block-q
  std::string help;  ///< one line for --help (the allowed values and the default are added)
  int64_t default_value = 0;
  int64_t min = 0, max = 0;             ///< the allowed range, when `value_names` is empty
  std::vector<int64_t> values;          ///< the allowed values, when given by name
  std::vector<std::string> value_names; ///< value_names[i] names values[i]
  bool flag = false;                    ///< 0 or 1, a bare flag on the command line

  /// Values min … max (and 0 for the default, which may lie outside the range).
  static Option range(std::string name, int64_t min, int64_t max, int64_t default_value,
                      std::string help);
  /// Values 0 … n−1 named `names` (the command line takes either); the default is 0.
  static Option choice(std::string name, std::vector<std::string> names, std::string help);
  /// Named values that are not 0 … n−1 (e.g. tile sizes {0 auto, 32, 64}); 0 must be one.
  static Option choice(std::string name, std::vector<std::pair<int64_t, std::string>> values,
                       std::string help);
  /// 0 (the default) or 1; on the command line a flag without a value.
  static Option flag_option(std::string name, std::string help);

  /// "1 to 1024 (0: the default, 1)" or "0 none, 1 no_pipeline, …": what a refusal and
  /// --help print.
  std::string allowed() const;
};

/// Something a run measured or chose, read back through fa_get_counter on the same thread.
struct Counter {
  std::string name;
  std::string help;
  std::function<int64_t()> read;  ///< throws std::invalid_argument when there is nothing yet
};

/// A stage's options and counters, and the calling thread's values of the options.
class OptionTable {
 public:
  /// Throws std::logic_error for a table that breaks the rules above (a duplicate name, a
  /// default that is not allowed, 0 allowed besides a default that is not 0).
  OptionTable(std::string stage, std::vector<Option> options, std::vector<Counter> counters = {});

  const std::string& stage() const { return stage_; }
  const std::vector<Option>& options() const { return options_; }
  const std::vector<Counter>& counters() const { return counters_; }

  /// The calling thread's value of option `name` (its default until the thread sets it).
  int64_t get(std::string_view name) const;
  /// The value names of option `name`, a choice: a stage's step names are its "step"
  /// option's, declared once in its table. Throws std::logic_error for an option without names.
  const std::vector<std::string>& value_names(std::string_view name) const;
  /// Sets the calling thread's value; 0 restores the default. Throws std::invalid_argument
  /// naming the stage, the option, the value and what is allowed.
  void set(std::string_view name, int64_t value) const;
  /// Every option of the calling thread back to its default.
  void reset() const;
  /// An option's current value, or a counter's reading (fa_get_counter).
  int64_t read(std::string_view name) const;

  /// One line per option, "name<TAB>default<TAB>allowed<TAB>help" (allowed as in
  /// Option::allowed), for tools that list or label the options (fa_stage_options).
  std::string describe() const;

  /// Adds one command-line flag per option to `app` (value names, range and default in
  /// the help); a value the option does not allow is a parse error naming it.
  void add_to(CLI::App& app) const;
  /// Makes `stage` use this table: its add_options, set_option and get_counter call it.
  void attach(StageInfo& stage) const;

 private:
  const Option& find(std::string_view name) const;
  std::vector<int64_t>& values() const;  ///< the calling thread's, indexed like options_

  std::string stage_;
  std::vector<Option> options_;
  std::vector<Counter> counters_;
  uint64_t id_;  ///< which entry of the thread-local store holds this table's values
};

}  // namespace fa
