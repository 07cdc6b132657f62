// Helpers shared by the config tests.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "tests/test_util.hpp"

namespace gpupool::config::test {

using gpupool::test::slurp;

struct Parsed {
  Config config;
  std::vector<Diagnostic> diags;
  std::string value(const std::string& name) const { return value_text(config, name); }
};

inline Parsed parse_env(std::initializer_list<std::string> entries) {
  std::vector<std::string> owned(entries);
  std::vector<const char*> envp;
  for (const std::string& e : owned) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  Parsed p;
  p.config = parse(envp.data(), &p.diags);
  return p;
}

// Parses NAME=value alone: the value as the variable then reads, with no
// diagnostic expected.
inline std::string good(const std::string& name, const std::string& value) {
  Parsed p = parse_env({name + "=" + value});
  EXPECT_TRUE(p.diags.empty()) << name << "=" << value << ": " << p.diags.front().message;
  return p.value(name);
}

inline const OptionInfo& info(const std::string& name) {
  for (const OptionInfo& o : options())
    if (name == o.name) return o;
  ADD_FAILURE() << "no option " << name;
  return options().front();
}

// NAME=value alone is refused: exactly one diagnostic that names the
// variable, the value, what is accepted and the default, and the variable
// keeps its default. Returns the message.
inline std::string bad(const std::string& name, const std::string& value) {
  Parsed p = parse_env({name + "=" + value});
  EXPECT_EQ(p.diags.size(), 1u) << name << "=" << value;
  if (p.diags.size() != 1) return "";
  const Diagnostic& d = p.diags.front();
  const OptionInfo& o = info(name);
  const std::string def = *o.default_value ? o.default_value : "unset";
  EXPECT_EQ(d.variable, name);
  EXPECT_EQ(d.level, LogLevel::warn);
  EXPECT_EQ(d.message.rfind(name + "=\"", 0), 0u) << d.message;
  bool plain = value.size() <= 80;
  for (char c : value) plain = plain && c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
  if (plain) {
    EXPECT_EQ(d.message.rfind(name + "=\"" + value + "\" ", 0), 0u) << d.message;
  }
  EXPECT_NE(d.message.find(" (accepted: "), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("; using the default (" + def + ")"), std::string::npos) << d.message;
  EXPECT_EQ(p.value(name), value_text(parse(nullptr, nullptr), name)) << name << "=" << value;
  return d.message;
}

}  // namespace gpupool::config::test
