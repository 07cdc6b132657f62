// Helpers the C++ test folders share (config/, sys/, wire/); a folder's own
// stay beside its tests (tests/config/test_util.hpp).
#pragma once

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

namespace gpupool::test {

// A file's whole contents ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh directory of the test's own, /tmp/gpupool-NAME-XXXXXX, removed
// with everything in it when the object goes. A directory that cannot be
// made throws (the test fails before it writes anywhere); one that cannot
// be removed fails the test.
struct TempDir {
  const std::string path;

  explicit TempDir(const std::string& name) : path(make(name)) {}
  ~TempDir() {
    const auto remove_one = [](const char* p, const struct stat*, int, FTW*) {
      return ::remove(p);
    };
    if (nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
      ADD_FAILURE() << "cannot remove " << path << ": " << strerror(errno);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

 private:
  static std::string make(const std::string& name) {
    std::string tmpl = "/tmp/gpupool-" + name + "-XXXXXX";
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp " + tmpl + ": " + strerror(errno));
    return tmpl;
  }
};

}  // namespace gpupool::test
