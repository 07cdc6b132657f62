// spdlog and fmt, compiled once. Every other file of gpupool's sees only
// their declarations (SPDLOG_COMPILED_LIB, fmt without FMT_HEADER_ONLY; see
// CMakeLists.txt), which halves the time to compile each file that logs.
// Here, with the rest of gpupool_config, they keep hidden visibility: a host
// program carrying its own spdlog or fmt is unaffected.
#include <fmt/format-inl.h>
#include <spdlog/common-inl.h>
#include <spdlog/details/backtracer-inl.h>
#include <spdlog/details/log_msg-inl.h>
#include <spdlog/details/log_msg_buffer-inl.h>
#include <spdlog/details/os-inl.h>
#include <spdlog/details/periodic_worker-inl.h>
#include <spdlog/details/registry-inl.h>
#include <spdlog/logger-inl.h>
#include <spdlog/pattern_formatter-inl.h>
#include <spdlog/sinks/ansicolor_sink-inl.h>
#include <spdlog/sinks/base_sink-inl.h>
#include <spdlog/sinks/sink-inl.h>
#include <spdlog/spdlog-inl.h>

#include <mutex>

#include "core/lock_rank.hpp"

// The instantiations gpupool uses and the headers declare without defining:
// its own sink's base (its lock ranked: log.cpp), the registry's default
// logger's sink, and fmt's locale-free separators
// (FMT_STATIC_THOUSANDS_SEPARATOR).
template class spdlog::sinks::base_sink<gpupool::Ranked<gpupool::LockRank::log_sink>>;
template class spdlog::sinks::ansicolor_stdout_sink<spdlog::details::console_mutex>;
template class spdlog::sinks::ansicolor_sink<spdlog::details::console_mutex>;
namespace fmt::detail {
template auto thousands_sep_impl<char>(locale_ref) -> thousands_sep_result<char>;
template auto decimal_point_impl<char>(locale_ref) -> char;
}  // namespace fmt::detail
