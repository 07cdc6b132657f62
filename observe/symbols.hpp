// Code addresses named for people, read from the ELF files themselves:
// function names from .symtab, else .dynsym (dladdr knows exported ones
// only), and source files and lines from the DWARF debug information, read
// through elfutils' libdw where it is installed. libdw is loaded with
// dlopen when a file's lines are first asked for, so neither the preloaded
// library nor the launcher needs it to start; without it, or without debug
// information, frames are named as functions and offsets. Used after the
// fact, never on an allocation: by the leak report at exit and by `gpupool
// report`.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace gpupool::symbols {

struct Function {
  std::string name;          // demangled; empty when no symbol covers the address
  std::uint64_t offset = 0;  // from the function's start
};

// Loads elfutils' libdw (dlopen) where it is installed, once. describe()
// does on first need; a caller holding a lock that code run by the loader
// could wait for (an allocation in a library's constructor, with its lock
// held) calls this first, outside that lock.
void load_line_reader();

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
  // The frames the return address `return_vaddr` (as function_at numbers
  // it) stands for, innermost first. With line information: one per call
  // inlined there, "FUNC (FILE:LINE) [inlined]", then the function itself,
  // "FUNC (FILE:LINE)". Without: "FUNC+0xOFF (MODULE)" from the symbol
  // table, else "MODULE+0xOFF". The debug information is the file's own,
  // else the separate file named by its build id under
  // /usr/lib/debug/.build-id/ (Debian's -dbgsym packages).
  const std::vector<std::string>& describe(const std::string& path, std::uint64_t return_vaddr);

  struct File;  // opaque; public so the reader in symbols.cpp can fill it

 private:
  File& load(const std::string& path);
  std::map<std::string, std::unique_ptr<File>> files_;
};

}  // namespace gpupool::symbols
