// The test clients' checks: each prints what failed, where, and exits 1.
#pragma once

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_EQ(a, b)                                                                             \
  do {                                                                                             \
    const auto va_ = (a);                                                                          \
    const auto vb_ = (b);                                                                          \
    if (!(va_ == vb_)) {                                                                           \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, \
              #b, (long long)va_, (long long)vb_);                                                 \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define OK(call) CHECK_EQ((call), CUDA_SUCCESS)
