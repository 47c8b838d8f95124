#include "options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <unordered_map>

#include "stage.h"

namespace fa {

namespace {

// Each thread's option values, one vector per table, created with the defaults on first use.
thread_local std::unordered_map<uint64_t, std::vector<int64_t>> t_values;

std::atomic<uint64_t> g_next_table_id{1};

// "--block-q" for "block_q".
std::string flag_name(const std::string& name) {
  std::string flag = "--" + name;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const auto& w : words) s += (s.empty() ? "" : ",") + w;
  return s;
}

bool in_range(const Option& o, int64_t v) { return v >= o.min && v <= o.max; }

// Whether `v` may be set (0, the default, always may).
bool allows(const Option& o, int64_t v) {
  if (v == 0) return true;
  if (!o.values.empty()) return std::find(o.values.begin(), o.values.end(), v) != o.values.end();
  return in_range(o, v);
}

// A command-line word for option `o`: one of its value names, or a number it allows.
// Returns false when the word is neither.
bool parse_word(const Option& o, const std::string& word, int64_t& value) {
  for (size_t i = 0; i < o.value_names.size(); ++i)
    if (o.value_names[i] == word) {
      value = o.values[i];
      return true;
    }
  try {
    size_t used = 0;
    const long long v = std::stoll(word, &used);
    if (used != word.size()) return false;
    value = v;
    return allows(o, value);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

Option Option::range(std::string name, int64_t min, int64_t max, int64_t default_value,
                     std::string help) {
  Option o;
  o.name = std::move(name);
  o.help = std::move(help);
  o.min = min;
  o.max = max;
  o.default_value = default_value;
  return o;
}

Option Option::choice(std::string name, std::vector<std::string> names, std::string help) {
  std::vector<std::pair<int64_t, std::string>> values;
  for (size_t i = 0; i < names.size(); ++i) values.emplace_back(int64_t(i), std::move(names[i]));
  return choice(std::move(name), std::move(values), std::move(help));
}

Option Option::choice(std::string name, std::vector<std::pair<int64_t, std::string>> values,
                      std::string help) {
  Option o;
  o.name = std::move(name);
  o.help = std::move(help);
  for (auto& [v, n] : values) {
    o.values.push_back(v);
    o.value_names.push_back(std::move(n));
  }
  return o;
}

Option Option::flag_option(std::string name, std::string help) {
  Option o = choice(std::move(name), std::vector<std::string>{"off", "on"}, std::move(help));
  o.flag = true;
  return o;
}

std::string Option::allowed() const {
  if (flag) return "0 or 1";
  if (!values.empty()) {
    std::string s;
    for (size_t i = 0; i < values.size(); ++i)
      s += (i ? ", " : "") + std::to_string(values[i]) +
           (value_names[i] == std::to_string(values[i]) ? "" : " " + value_names[i]);
    return s;
  }
  std::string s = std::to_string(min) + " to " + std::to_string(max);
  if (!in_range(*this, 0))
    s += default_value == 0 ? ", or 0 for the default" : ", or 0 for the default (" + std::to_string(default_value) + ")";
  return s;
}

OptionTable::OptionTable(std::string stage, std::vector<Option> options, std::vector<Counter> counters)
    : stage_(std::move(stage)), options_(std::move(options)), counters_(std::move(counters)),
      id_(g_next_table_id++) {
  const auto broken = [&](const std::string& name, const std::string& why) {
    throw std::logic_error(stage_ + ": option table: '" + name + "' " + why);
  };
  std::vector<std::string> names;
  for (const Option& o : options_) names.push_back(o.name);
  for (const Counter& c : counters_) names.push_back(c.name);
  for (size_t i = 0; i < names.size(); ++i)
    if (std::count(names.begin(), names.end(), names[i]) > 1) broken(names[i], "is declared twice");
  for (const Option& o : options_) {
    if (o.values.empty() && o.min > o.max) broken(o.name, "has an empty range");
    if (!o.values.empty() && std::find(o.values.begin(), o.values.end(), 0) == o.values.end())
      broken(o.name, "has no value 0 (0 selects the default)");
    if (!o.values.empty() && o.default_value != 0) broken(o.name, "must default to its value 0");
    if (o.values.empty() && o.default_value != 0 && !in_range(o, o.default_value))
      broken(o.name, "has a default outside its range");
    if (o.values.empty() && o.default_value != 0 && in_range(o, 0))
      broken(o.name, "allows 0, which is reserved for the default");
  }
}

std::vector<int64_t>& OptionTable::values() const {
  auto [it, created] = t_values.try_emplace(id_);
  if (created)
    for (const Option& o : options_) it->second.push_back(o.default_value);
  return it->second;
}

const Option& OptionTable::find(std::string_view name) const {
  for (const Option& o : options_)
    if (o.name == name) return o;
  std::string list;
  for (const Option& o : options_) list += (list.empty() ? "" : ", ") + o.name;
  throw std::invalid_argument(stage_ + ": no option '" + std::string(name) + "' (options: " +
                              (list.empty() ? "none" : list) + ")");
}

int64_t OptionTable::get(std::string_view name) const {
  const Option& o = find(name);
  return values()[size_t(&o - options_.data())];
}

const std::vector<std::string>& OptionTable::value_names(std::string_view name) const {
  const Option& o = find(name);
  if (o.value_names.empty())
    throw std::logic_error(stage_ + ": option '" + o.name + "' has no value names (it is a range or a flag)");
  return o.value_names;
}

void OptionTable::set(std::string_view name, int64_t value) const {
  const Option& o = find(name);
  if (!allows(o, value))
    throw std::invalid_argument(stage_ + ": " + o.name + " = " + std::to_string(value) +
                                " is not allowed (allowed: " + o.allowed() + ")");
  values()[size_t(&o - options_.data())] = value == 0 ? o.default_value : value;
}

void OptionTable::reset() const {
  std::vector<int64_t>& v = values();
  for (size_t i = 0; i < options_.size(); ++i) v[i] = options_[i].default_value;
}

int64_t OptionTable::read(std::string_view name) const {
  for (const Counter& c : counters_)
    if (c.name == name) return c.read();
  for (const Option& o : options_)
    if (o.name == name) return get(name);
  std::string list;
  for (const Counter& c : counters_) list += (list.empty() ? "" : ", ") + c.name;
  for (const Option& o : options_) list += (list.empty() ? "" : ", ") + o.name;
  throw std::invalid_argument(stage_ + ": no counter '" + std::string(name) + "' (counters: " +
                              (list.empty() ? "none" : list) + ")");
}

std::string OptionTable::describe() const {
  std::string text;
  for (const Option& o : options_)
    text += o.name + "\t" + std::to_string(o.default_value) + "\t" + o.allowed() + "\t" + o.help + "\n";
  return text;
}

void OptionTable::add_to(CLI::App& app) const {
  for (const Option& o : options_) {
    const std::string name = o.name;
    if (o.flag) {
      app.add_flag_callback(flag_name(name), [this, name] { set(name, 1); }, o.help);
      continue;
    }
    std::string default_name = std::to_string(o.default_value);
    for (size_t i = 0; i < o.values.size(); ++i)
      if (o.values[i] == 0) default_name = o.value_names[i];
    // The range and the default, or (named values, listed as the type) the default's name.
    const std::string help =
        o.help + " [" + (!o.values.empty() ? "default " + default_name
                         : in_range(o, 0) ? o.allowed() + "; default " + default_name
                                          : o.allowed()) + "]";
    const Option* opt = &o;
    app.add_option_function<std::string>(
           flag_name(name),
           [this, opt](const std::string& word) {
             int64_t v = 0;
             parse_word(*opt, word, v);  // the check below has accepted the word
             set(opt->name, v);
           },
           help)
        ->check(CLI::Validator(
            [opt](std::string& word) -> std::string {
              int64_t v = 0;
              if (parse_word(*opt, word, v)) return {};
              return opt->name + " = " + word + " is not allowed (allowed: " + opt->allowed() + ")";
            },
            "", ""))
        ->type_name(o.values.empty() ? "INT" : "{" + join(o.value_names) + "}");
  }
}

void OptionTable::attach(StageInfo& s) const {
  s.add_options = [this](CLI::App& app) { add_to(app); };
  s.set_option = [this](const std::string& name, int64_t value) { set(name, value); };
  s.get_counter = [this](const std::string& name) { return read(name); };
  s.options = this;
}

}  // namespace fa
