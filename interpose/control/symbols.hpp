// Function names for code addresses, read from the ELF files themselves
// (.symtab, else .dynsym), so functions that are not exported are named too
// (dladdr knows exported ones only). Used after the fact, never on an
// allocation: by the leak report at exit and by `gpupool report`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpupool::symbols {

struct Function {
  std::string name;         // demangled; empty when no symbol covers the address
  std::uint64_t offset = 0; // from the function's start
};

// ELF files read once each (a file that cannot be read names nothing).
class Files {
 public:
  Files();
  ~Files();
  // The function containing `vaddr` (an address as the file's program
  // headers number them: pc minus the load bias) in the file at `path`.
  Function function_at(const std::string& path, std::uint64_t vaddr);
  // The file's GNU build id in hex; empty when it has none or cannot be read.
  std::string build_id(const std::string& path);

  struct File;  // opaque; public so the reader in symbols.cpp can fill it

 private:
  File& load(const std::string& path);
  std::map<std::string, std::unique_ptr<File>> files_;
};

}  // namespace gpupool::symbols
