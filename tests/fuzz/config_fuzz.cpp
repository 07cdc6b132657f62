// libFuzzer target for the configuration parser.
//
// Input: lines, each an environ entry "NAME=value"; a line starting with '@'
// names the variable by its next byte (index into options()), so the fuzzer
// reaches every parser without guessing names. Checks that parse() never
// crashes and that what it returns is sane: values in range, distinct
// signals, one-line bounded diagnostics, and every value reads back (its
// value_text parses to itself with no diagnostic).
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/config.hpp"

using namespace gpupool::config;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

bool refused_signal(int s) {
  return s == SIGKILL || s == SIGSTOP || s == SIGSEGV || s == SIGBUS || s == SIGILL ||
         s == SIGFPE || s == SIGABRT || s == SIGTRAP || s == SIGSYS || s < 0 || s > SIGRTMAX ||
         (s > SIGSYS && s < SIGRTMIN);
}

void check_config(const Config& c) {
  check(c.leading_bits >= 1 && c.leading_bits <= 8, "leading_bits in 1..8");
  for (const SizeSpec* s : {&c.max_held, &c.max_pooled}) {
    if (s->percent) check(s->fraction >= 0 && s->fraction <= 1, "fraction in [0, 1]");
    if (!s->unlimited)
      check(s->resolve(std::size_t{1} << 40) <= (s->percent ? std::size_t{1} << 40 : SIZE_MAX),
            "resolve");
    else check(s->resolve(0) == SIZE_MAX, "unlimited resolves to SIZE_MAX");
  }
  for (unsigned i = 0; i < kActions; ++i) {
    const int s = c.*kActionInfo[i].signal;
    if (s == 0) continue;
    check(!refused_signal(s), "no refused signal");
    for (unsigned j = 0; j < i; ++j) check(s != c.*kActionInfo[j].signal, "one action per signal");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& opts = options();
  std::vector<std::string> lines;
  std::string cur;
  auto finish = [&] {
    if (!cur.empty() && cur[0] == '@') {
      const std::size_t k = cur.size() > 1 ? static_cast<std::uint8_t>(cur[1]) % opts.size() : 0;
      cur = std::string(opts[k].name) + "=" + (cur.size() > 2 ? cur.substr(2) : "");
    }
    lines.push_back(cur);
    cur.clear();
  };
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == '\n') finish();
    else cur += static_cast<char>(data[i]);
  }
  finish();
  std::vector<const char*> envp;
  for (const std::string& l : lines)
    envp.push_back(l.c_str());  // cut at any NUL, like a real environ
  envp.push_back(nullptr);

  std::vector<Diagnostic> diags;
  const Config c = parse(envp.data(), &diags);
  check_config(c);
  for (const Diagnostic& d : diags) {
    check(!d.message.empty(), "diagnostic has a message");
    check(d.message.size() < 1024, "diagnostic is bounded");
    for (char ch : d.message)
      check(static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f, "diagnostic is one clean line");
  }
  check(load(envp.data(), true, nullptr).leading_bits == 4, "secure load ignores the environment");

  // Every value reads back as itself.
  std::vector<std::string> shown;
  for (const OptionInfo& o : opts)
    shown.push_back(std::string(o.name) + "=" + value_text(c, o.name));
  std::vector<const char*> env2;
  for (const std::string& s : shown) env2.push_back(s.c_str());
  env2.push_back(nullptr);
  std::vector<Diagnostic> diags2;
  const Config c2 = parse(env2.data(), &diags2);
  check(diags2.empty(), "shown values parse without complaint");
  for (const OptionInfo& o : opts)
    check(value_text(c2, o.name) == value_text(c, o.name), "round trip");

  // The exposed parsers agree with themselves.
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string why;
  const int s = parse_signal(text, &why);
  check(s >= -1, "signal result");
  if (s > 0) check(parse_signal(signal_name(s), nullptr) == s, "signal name round trip");
  if (s < 0) check(!why.empty(), "signal refusal says why");
  SizeSpec sz;
  if (parse_size(text, false, &sz, &why)) check(!sz.percent, "no percent unless allowed");
  std::uint64_t ns = 0;
  (void)parse_duration(text, &ns, &why);
  return 0;
}
