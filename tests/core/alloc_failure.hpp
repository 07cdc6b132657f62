// Allocation failure on demand for core tests: while a FailNthAllocation is
// alive, the n-th allocation (operator new) its thread makes throws
// std::bad_alloc; other threads are not affected. The operators are replaced
// for the whole test program (alloc_failure.cpp).
#pragma once

namespace gpupool::testing {

class FailNthAllocation {
 public:
  explicit FailNthAllocation(int n);
  ~FailNthAllocation();
  FailNthAllocation(const FailNthAllocation&) = delete;
  FailNthAllocation& operator=(const FailNthAllocation&) = delete;
  bool failed() const;  // the n-th allocation came, and threw
};

}  // namespace gpupool::testing
