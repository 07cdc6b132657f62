// options.def made into the parser's table, Config's defaults, and the
// table as `gpupool env` and docs/configuration.md show it.
#include <type_traits>

#include "config/table.hpp"
#include "config/values.hpp"

namespace gpupool::config {
namespace {

template <class K, class F>
bool apply_kind(F field, Config& c, std::string_view text, std::string* reason) {
  typename K::T value{};
  if (!K::parse(text, &value, reason)) return false;
  c.*field = value;
  return true;
}

#define GPUPOOL_OPTION(name, field, member_type, kind, def, doc) \
  static_assert(std::is_same_v<member_type, values::kind::T>,    \
                "options.def: " #name "'s type is not its kind's (" #kind ")");
#include "config/options.def"

}  // namespace

const std::vector<Option>& table() {
  static const std::vector<Option> t = {
#define GPUPOOL_OPTION(name, field, member_type, kind, def, doc)                  \
  Option{OptionInfo{#name, values::kind::type, def, doc}, values::kind::accepted, \
         [](Config& c, std::string_view v, std::string* r) {                      \
           return apply_kind<values::kind>(&Config::field, c, v, r);              \
         },                                                                       \
         [](const Config& c) { return values::kind::show(c.field); }},
#include "config/options.def"
  };
  return t;
}

const Option* find(std::string_view name) {
  for (const Option& o : table())
    if (name == o.info.name) return &o;
  return nullptr;
}

Config::Config() {
  for (const Option& o : table()) {
    std::string reason;
    // The table's defaults parse (a unit test checks it); this only guards
    // against a bad edit of options.def.
    (void)o.apply(*this, o.info.default_value, &reason);
  }
}

const Config& defaults() {
  static const Config c;
  return c;
}

Action action_of_verb(std::string_view verb) {
  for (unsigned a = 0; a < kActions; ++a)
    if (verb == kActionInfo[a].verb) return static_cast<Action>(a);
  return kActions;
}

const std::vector<OptionInfo>& options() {
  static const std::vector<OptionInfo> v = [] {
    std::vector<OptionInfo> r;
    for (const Option& o : table()) r.push_back(o.info);
    return r;
  }();
  return v;
}

std::uint64_t split_min(const Config& c) {
  if (c.split) return c.split;
  return c.segments == Segments::expandable ? kSplitOn : 0;
}

std::string options_markdown() {
  std::string r = "| Variable | Type | Default | Description |\n|---|---|---|---|\n";
  for (const OptionInfo& o : options()) {
    r += "| `";
    r += o.name;
    r += "` | ";
    r += o.type;
    r += " | ";
    if (*o.default_value) {
      r += '`';
      r += o.default_value;
      r += '`';
    }
    r += " | ";
    r += o.doc;
    r += " |\n";
  }
  return r;
}

std::string value_text(const Config& config, const std::string& name) {
  const Option* o = find(name);
  return o ? o->show(config) : std::string();
}

std::string value_problem(const std::string& name, const std::string& value) {
  const Option* o = find(name);
  Config scratch = defaults();
  std::string reason;
  if (!o || o->apply(scratch, value, &reason)) return {};
  return reason + " (accepted: " + o->accepted + ")";
}

}  // namespace gpupool::config
