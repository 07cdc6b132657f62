// fmt, compiled once. Every other file of gpupool's sees only its
// declarations (fmt without FMT_HEADER_ONLY; see CMakeLists.txt), which
// halves the time to compile each file that logs. Here, with the rest of
// gpupool_config, it keeps hidden visibility: a host program carrying its
// own fmt is unaffected.
#include <fmt/format-inl.h>

// The instantiations gpupool uses and the headers declare without defining:
// fmt's locale-free separators (FMT_STATIC_THOUSANDS_SEPARATOR).
namespace fmt::detail {
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;
}  // namespace fmt::detail
