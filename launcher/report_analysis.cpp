// `gpupool report`'s figures (report_model.hpp) from traces: exact figures
// (peaks, tables) are computed from every record, the plotted series
// downsampled to kPoints points each, keeping each bucket's maximum so
// that no peak disappears. Sites are named here, from the modules' files
// (site_names.hpp).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "launcher/report_model.hpp"
#include "launcher/site_names.hpp"
#include "launcher/trace_tools.hpp"

namespace gpupool::launcher {
namespace {

using report::Group;
using report::Moment;
using report::SiteName;
using report::SiteRow;
using report::View;

// One trace in a view: its records on the view's clock (offset: from the
// earliest trace's start), its slots at slot_base in the view's arrays.
struct Source {
  const trace::TraceFile* tr = nullptr;
  Namer* namer = nullptr;
  std::uint64_t offset = 0;
  std::size_t slot_base = 0;
  std::vector<std::uint32_t> name_of_site;  // View::names index, or UINT32_MAX; kNoSite last
  // The process's exit on the view's clock ('# end'; never its last record's
  // time), or UINT64_MAX when the trace does not say.
  std::uint64_t end = UINT64_MAX;
};

// Calls f(source, record, t) for every record of every source in time
// order (t on the view's clock), and ended(source, t) at each source's
// end, after its records.
template <class F, class E>
void in_time_order(const std::vector<Source>& src, F&& f, E&& ended) {
  if (src.size() == 1) {
    const std::vector<trace::Record>& recs = src[0].tr->records;
    for (const trace::Record& r : recs) f(std::size_t(0), r, r.t_ns + src[0].offset);
    if (src[0].end != UINT64_MAX)
      ended(std::size_t(0),
            std::max(src[0].end, recs.empty() ? 0 : recs.back().t_ns + src[0].offset));
    return;
  }
  using Head = std::pair<std::uint64_t, std::size_t>;  // t, source
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  std::vector<std::size_t> pos(src.size(), 0);
  // The next event of source k: its next record, else its end (if any).
  auto push_next = [&](std::size_t k) {
    const std::vector<trace::Record>& recs = src[k].tr->records;
    if (pos[k] < recs.size()) heads.push({recs[pos[k]].t_ns + src[k].offset, k});
    else if (pos[k] == recs.size() && src[k].end != UINT64_MAX)
      heads.push({std::max(src[k].end, recs.empty() ? 0 : recs.back().t_ns + src[k].offset), k});
  };
  for (std::size_t k = 0; k < src.size(); ++k) push_next(k);
  while (!heads.empty()) {
    const auto [t, k] = heads.top();
    heads.pop();
    const std::vector<trace::Record>& recs = src[k].tr->records;
    if (pos[k] < recs.size()) f(k, recs[pos[k]], t);
    else ended(k, t);
    ++pos[k];
    push_next(k);
  }
}

class Analysis {
 public:
  // several: the view of all the sources' processes together.
  // max_points: per plotted series.
  Analysis(std::vector<Source> src, bool several, std::size_t max_points = report::kPoints)
      : src_(std::move(src)), several_(several), max_points_(max_points) {}

  View run() {
    setup();
    pass_counters();
    sum_up_others();
    pass_sites();
    return std::move(v_);
  }

 private:
  void setup() {
    std::size_t records = 0;
    for (Source& s : src_) {
      s.slot_base = slots_;
      slots_ += s.tr->slots;
      records += s.tr->records.size();
      if (!s.tr->records.empty())
        v_.duration_ns = std::max(v_.duration_ns, s.tr->records.back().t_ns + s.offset);
      if (s.end != UINT64_MAX) v_.duration_ns = std::max(v_.duration_ns, s.end);
      v_.sites_recorded |= !s.tr->sites.empty();
      s.name_of_site.assign(s.tr->sites.size() + 1, UINT32_MAX);
    }
    v_.span_ns = std::max<std::uint64_t>(v_.duration_ns, 1);
    v_.points = std::min<std::size_t>(max_points_, std::max<std::size_t>(records, 1));
    v_.rate_hits.assign(report::kRateBuckets, 0);
    v_.rate_misses.assign(report::kRateBuckets, 0);
    std::map<std::string, std::size_t> group_index;
    group_of_arena_.resize(src_.size());
    for (std::size_t k = 0; k < src_.size(); ++k) {
      for (const trace::ArenaDecl& a : src_[k].tr->arenas) {
        auto [it, fresh] = group_index.try_emplace(a.group, v_.groups.size());
        if (fresh) {
          Group g;
          g.name = a.group;
          v_.groups.push_back(std::move(g));
        }
        group_of_arena_[k].push_back(it->second);
      }
    }
    if (several_) {
      v_.total_active.assign(v_.points, 0);
      v_.process_active.resize(src_.size());
      for (std::size_t k = 0; k < src_.size(); ++k) {
        v_.process_active[k].pid = src_[k].tr->pid;
        v_.process_active[k].v.assign(v_.points, 0);
      }
    }
  }

  std::size_t bucket(std::uint64_t t, std::size_t n) const {
    return std::min<std::size_t>(
        n - 1, static_cast<std::size_t>((static_cast<double>(t) / v_.span_ns) * n));
  }

  // Pass 1: counters, peaks, series, rates, sizes; the moment of the peak
  // of all groups' active bytes together.
  void pass_counters() {
    requested_.assign(slots_, 0);
    size_.assign(slots_, 0);
    p1_.open.assign(v_.groups.size(), kNone);
    p1_.proc_filled.assign(src_.size(), 0);
    p1_.proc_active.assign(src_.size(), 0);
    if (several_) {
      p1_.own.resize(src_.size());
      for (std::size_t k = 0; k < src_.size(); ++k)
        p1_.own[k].assign(src_[k].tr->arenas.size(), {});
    }
    in_time_order(
        src_, [&](std::size_t k, const trace::Record& r, std::uint64_t t) { count(k, r, t); },
        [&](std::size_t k, std::uint64_t t) { process_ended(k, t); });
    for (std::size_t gi = 0; gi < v_.groups.size(); ++gi) end_series(v_.groups[gi], p1_.open[gi]);
    if (several_) {
      for (std::size_t k = 0; k < src_.size(); ++k) carry(k, v_.points - 1);
      keep_top_processes();
    }
    p1_ = {};
  }

  // A group's series (Group::at): `open` is the bucket of its last event
  // (kNone before the first). A point holds its bucket's maximum, the level
  // carried in included; where buckets without events follow, a point at
  // the next one holds the level the group stays at.
  static constexpr std::size_t kNone = SIZE_MAX;
  static void add_point(Group& g, std::size_t b) {
    g.at.push_back(static_cast<std::uint32_t>(b));
    g.active.push_back(g.c.active);
    g.in_blocks.push_back(g.c.in_blocks);
    g.managed.push_back(g.c.managed());
  }
  static bool at_level(const Group& g) {
    return g.active.back() == g.c.active && g.in_blocks.back() == g.c.in_blocks &&
           g.managed.back() == g.c.managed();
  }
  // Before an event of g in bucket b.
  static void start_bucket(Group& g, std::size_t& open, std::size_t b) {
    if (open == b) return;
    if (open == kNone ? b > 0 : b > open + 1 && !at_level(g))
      add_point(g, open == kNone ? 0 : open + 1);
    add_point(g, b);
    open = b;
  }
  // After the end of the records.
  void end_series(Group& g, std::size_t open) const {
    if (open == kNone) add_point(g, 0);
    else if (open + 1 < v_.points && !at_level(g)) add_point(g, open + 1);
  }

  // Record r (its allocation's slot) moves group g, and own (a process's
  // part of it, or null), at t.
  void move(Group& g, std::size_t& open, Counters* own, const trace::Record& r, std::size_t slot,
            std::uint64_t t) {
    start_bucket(g, open, bucket(t, v_.points));
    apply_record(g.c, r, requested_[slot], size_[slot]);
    if (own) apply_record(*own, r, requested_[slot], size_[slot]);
    if (r.alloc) {
      ++g.allocs;
      g.hits += r.hit;
    }
    if (g.c.active > g.peak_active.bytes) g.peak_active = {g.c.active, t};
    if (g.c.managed() > g.peak_managed.bytes) g.peak_managed = {g.c.managed(), t};
    g.active.back() = std::max(g.active.back(), g.c.active);
    g.in_blocks.back() = std::max(g.in_blocks.back(), g.c.in_blocks);
    g.managed.back() = std::max(g.managed.back(), g.c.managed());
  }

  // A process that exited takes its part `own` of group g away, at t.
  void take_away(Group& g, std::size_t& open, Counters& own, std::uint64_t t) {
    if (!own.active && !own.in_blocks && !own.held) return;
    start_bucket(g, open, bucket(t, v_.points));
    g.c.active -= std::min(g.c.active, own.active);
    g.c.in_blocks -= std::min(g.c.in_blocks, own.in_blocks);
    g.c.held -= std::min(g.c.held, own.held);
    own = {};
  }

  // The process's and the total's series: buckets up to b started at the
  // levels carried in (carry, before an event), then b's maximum (mark,
  // after it).
  void carry(std::size_t k, std::size_t b) {
    report::View::Series& pa = v_.process_active[k];
    for (std::size_t& f = p1_.proc_filled[k]; f <= b; ++f) pa.v[f] = p1_.proc_active[k];
    for (; p1_.total_filled <= b; ++p1_.total_filled)
      v_.total_active[p1_.total_filled] = p1_.total_active;
  }
  void mark(std::size_t k, std::size_t b) {
    report::View::Series& pa = v_.process_active[k];
    pa.v[b] = std::max(pa.v[b], p1_.proc_active[k]);
    pa.peak = std::max(pa.peak, p1_.proc_active[k]);
    v_.total_active[b] = std::max(v_.total_active[b], p1_.total_active);
  }

  // An allocation's part of the view's figures: counts, hits over time,
  // sizes.
  void count_allocation(const trace::Record& r, std::uint64_t t) {
    ++v_.allocations;
    (r.hit ? v_.rate_hits : v_.rate_misses)[bucket(t, report::kRateBuckets)]++;
    if (r.hit) ++v_.hits;
    if (r.outside) ++(r.unpooled ? v_.unpooled : v_.outside);
    int lg = 0;
    while (lg < 63 && (std::uint64_t(2) << lg) <= r.requested) ++lg;
    auto& s = v_.sizes[r.requested ? lg : -1];
    ++s.first;
    s.second += r.requested;
  }

  // One record of source k at t.
  void count(std::size_t k, const trace::Record& r, std::uint64_t t) {
    const std::size_t gi = group_of_arena_[k][r.arena];
    Group& g = v_.groups[gi];
    const std::size_t b = bucket(t, v_.points);
    if (several_) carry(k, b);
    const std::size_t slot = src_[k].slot_base + r.slot;
    if (r.alloc) {
      requested_[slot] = r.requested;
      size_[slot] = r.size;
      count_allocation(r, t);
    } else {
      ++v_.frees;
    }
    const std::uint64_t before = g.c.active;
    move(g, p1_.open[gi], several_ ? &p1_.own[k][r.arena] : nullptr, r, slot, t);
    p1_.total_active = p1_.total_active + g.c.active - before;
    if (p1_.total_active > v_.peak.at.bytes) {
      v_.peak.at = {p1_.total_active, t};
      peak_step_ = p1_.step;
    }
    if (several_) {
      p1_.proc_active[k] = p1_.proc_active[k] + g.c.active - before;
      mark(k, b);
    }
    ++p1_.step;
  }

  // Together, a process that exited holds nothing from then on: its
  // blocks and held memory went with it.
  void process_ended(std::size_t k, std::uint64_t t) {
    if (!several_) return;
    const std::size_t b = bucket(t, v_.points);
    carry(k, b);
    for (std::size_t a = 0; a < p1_.own[k].size(); ++a) {
      const std::size_t gi = group_of_arena_[k][a];
      take_away(v_.groups[gi], p1_.open[gi], p1_.own[k][a], t);
    }
    p1_.total_active -= std::min(p1_.total_active, p1_.proc_active[k]);
    p1_.proc_active[k] = 0;
    mark(k, b);
  }

  // Past kTopGroups pool groups, those with the largest peaks are kept
  // (in their order) and the others replaced by one group that sums them
  // up: their records again, as one group's (exact figures of them
  // together, and a page of a sane size whatever the count).
  void sum_up_others() {
    std::vector<Group>& groups = v_.groups;
    if (groups.size() <= report::kTopGroups) return;
    std::vector<std::size_t> order(groups.size());
    for (std::size_t gi = 0; gi < order.size(); ++gi) order[gi] = gi;
    std::partial_sort(order.begin(), order.begin() + report::kTopGroups, order.end(),
                      [&](std::size_t a, std::size_t b) {
                        const Group &x = groups[a], &y = groups[b];
                        if (x.peak_managed.bytes != y.peak_managed.bytes)
                          return x.peak_managed.bytes > y.peak_managed.bytes;
                        if (x.peak_active.bytes != y.peak_active.bytes)
                          return x.peak_active.bytes > y.peak_active.bytes;
                        return a < b;
                      });
    std::vector<std::uint8_t> shown(groups.size(), 0);
    for (std::size_t i = 0; i < report::kTopGroups; ++i) shown[order[i]] = 1;
    Group rest;
    rest.others = groups.size() - report::kTopGroups;
    rest.name = std::to_string(rest.others) + " other pool groups";
    std::size_t open = kNone;
    std::vector<Counters> own(src_.size());  // each process's part of them
    in_time_order(
        src_,
        [&](std::size_t k, const trace::Record& r, std::uint64_t t) {
          if (shown[group_of_arena_[k][r.arena]]) return;
          move(rest, open, &own[k], r, src_[k].slot_base + r.slot, t);
        },
        [&](std::size_t k, std::uint64_t t) {
          if (several_) take_away(rest, open, own[k], t);
        });
    end_series(rest, open);
    std::size_t kept = 0;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      if (!shown[gi]) continue;
      // Not onto itself: a moved-from group is left empty.
      if (kept != gi) groups[kept] = std::move(groups[gi]);
      ++kept;
    }
    groups.resize(kept);
    groups.push_back(std::move(rest));
  }

  // The processes that held the most, each a line; the total has all.
  void keep_top_processes() {
    std::vector<report::View::Series>& pa = v_.process_active;
    if (pa.size() <= report::kProcessLines) return;
    std::vector<std::uint64_t> peaks;
    for (const auto& x : pa) peaks.push_back(x.peak);
    std::nth_element(peaks.begin(), peaks.begin() + (report::kProcessLines - 1), peaks.end(),
                     std::greater<std::uint64_t>());
    const std::uint64_t least = peaks[report::kProcessLines - 1];
    std::size_t ties = report::kProcessLines -
                       static_cast<std::size_t>(std::count_if(
                           pa.begin(), pa.end(), [&](const auto& x) { return x.peak > least; }));
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pa.size(); ++i) {
      if (pa[i].peak < least || (pa[i].peak == least && ties == 0)) continue;
      if (pa[i].peak == least) --ties;
      if (kept != i) pa[kept] = std::move(pa[i]);
      ++kept;
    }
    pa.resize(kept);
  }

  std::uint32_t name_of(std::size_t k, std::uint32_t site) {
    Source& s = src_[k];
    std::uint32_t& cached = s.name_of_site[site == trace::kNoSite ? s.tr->sites.size() : site];
    if (cached != UINT32_MAX) return cached;
    const NamedSite& n = s.namer->site(site);
    std::string key = n.label;
    for (const std::string& f : n.frames) key += "\x1f" + f;
    auto [it, fresh] = name_index_.try_emplace(key, static_cast<std::uint32_t>(v_.names.size()));
    if (fresh) {
      SiteName sn;
      sn.label = n.label;
      sn.frames = n.frames;
      sn.flame = report::flame_path(n);
      sn.across_builds = report::across_builds(key);
      sn.key = std::move(key);
      v_.names.push_back(std::move(sn));
    }
    cached = it->second;
    return cached;
  }

  static void add_pid(std::vector<std::uint64_t>* pids, std::uint64_t pid) {
    const auto at = std::lower_bound(pids->begin(), pids->end(), pid);
    if (at == pids->end() || *at != pid) pids->insert(at, pid);
  }

  // Pass 2: the blocks active at the peak and at the end, by site. Together,
  // the end is each process's own: a process that exited (a forked child)
  // holds nothing from then on, but what it never freed is among what was
  // still held at the end, as in its own view.
  void pass_sites() {
    std::vector<std::uint32_t> site_of(slots_, trace::kNoSite), arena_of(slots_, 0);
    std::vector<std::uint8_t> live(slots_, 0), at_own_end(slots_, 0);
    std::uint64_t step = 0;
    std::map<std::uint32_t, SiteRow> at_peak;  // by name
    auto take_peak = [&] {
      for (std::size_t k = 0; k < src_.size(); ++k)
        for (std::size_t s = src_[k].slot_base; s < src_[k].slot_base + src_[k].tr->slots; ++s) {
          if (!live[s]) continue;
          const std::uint32_t name = name_of(k, site_of[s]);
          SiteRow& row = at_peak[name];
          row.name = name;
          ++row.held.blocks;
          row.held.bytes += requested_[s];
          if (several_) add_pid(&row.pids, src_[k].tr->pid);
        }
    };
    in_time_order(
        src_,
        [&](std::size_t k, const trace::Record& r, std::uint64_t) {
          const std::size_t slot = src_[k].slot_base + r.slot;
          if (r.alloc) {
            site_of[slot] = r.site;
            arena_of[slot] = r.arena;
            live[slot] = 1;
          } else {
            live[slot] = 0;
          }
          if (step++ == peak_step_ && v_.peak.at.bytes > 0) take_peak();
        },
        [&](std::size_t k, std::uint64_t) {
          if (!several_) return;
          for (std::size_t s = src_[k].slot_base; s < src_[k].slot_base + src_[k].tr->slots; ++s) {
            at_own_end[s] = live[s];
            live[s] = 0;
          }
        });
    v_.peak.total = {0, v_.peak.at.bytes};
    for (auto& [name, row] : at_peak) {
      v_.peak.total.blocks += row.held.blocks;
      v_.peak.rows.push_back(std::move(row));
    }
    // The end: by site and arena (one process), or site and pool group.
    std::map<std::pair<std::uint32_t, std::string>, SiteRow> at_end;
    for (std::size_t k = 0; k < src_.size(); ++k)
      for (std::size_t s = src_[k].slot_base; s < src_[k].slot_base + src_[k].tr->slots; ++s) {
        if (!live[s] && !at_own_end[s]) continue;
        const trace::ArenaDecl& a = src_[k].tr->arenas[arena_of[s]];
        const std::uint32_t name = name_of(k, site_of[s]);
        SiteRow& row = at_end[{name, several_ ? a.group : std::to_string(arena_of[s])}];
        row.name = name;
        row.group = a.group;
        if (!several_) row.arena = a.name;
        else add_pid(&row.pids, src_[k].tr->pid);
        ++row.held.blocks;
        row.held.bytes += requested_[s];
        ++v_.end.total.blocks;
        v_.end.total.bytes += requested_[s];
      }
    v_.end.at = {v_.end.total.bytes, v_.duration_ns};
    for (auto& [key, row] : at_end) v_.end.rows.push_back(std::move(row));
    for (Moment* m : {&v_.peak, &v_.end}) {
      std::stable_sort(m->rows.begin(), m->rows.end(), [](const SiteRow& a, const SiteRow& b) {
        return a.held.bytes > b.held.bytes;
      });
      m->flame = report::flame_of(v_.names, m->rows);
    }
  }

  std::vector<Source> src_;
  bool several_;
  std::size_t max_points_;
  View v_;
  std::size_t slots_ = 0;
  std::vector<std::vector<std::size_t>> group_of_arena_;
  std::vector<std::uint64_t> requested_, size_;  // per slot: its allocation's
  std::uint64_t peak_step_ = UINT64_MAX;
  // Pass 1's working state. The process's and the total's buckets [0,
  // filled) are started, each at the level it inherits from before its
  // first record, so a bucket without records shows the level it stayed at.
  struct Pass1 {
    std::vector<std::size_t> open;  // per group: its series' last bucket (kNone: none)
    std::vector<std::size_t> proc_filled;
    std::size_t total_filled = 0;
    std::vector<std::uint64_t> proc_active;
    // Together, each process's part of each group, by its arenas: what its
    // end takes away.
    std::vector<std::vector<Counters>> own;
    std::uint64_t total_active = 0, step = 0;
  } p1_;
  std::unordered_map<std::string, std::uint32_t> name_index_;
};

}  // namespace

namespace report {

// The figures of a set of traces: each process's, and all together.
Report analyse(const std::vector<trace::TraceFile>& traces,
               std::vector<std::unique_ptr<Namer>>* namers) {
  report::Report out;
  std::uint64_t t0 = UINT64_MAX;
  for (const trace::TraceFile& tr : traces) {
    t0 = std::min(t0, tr.start_unix_ns);
    out.files.push_back(tr.path);
    namers->push_back(std::make_unique<Namer>(tr));
  }
  // Processes in the order they started.
  std::vector<std::size_t> order(traces.size());
  for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return traces[a].start_unix_ns < traces[b].start_unix_ns;
  });
  // own_clock: a process's view counts from its own trace's start.
  auto source = [&](std::size_t k, bool own_clock) {
    Source s;
    s.tr = &traces[k];
    s.namer = (*namers)[k].get();
    s.offset = own_clock ? 0 : traces[k].start_unix_ns - t0;
    if (traces[k].ended) s.end = traces[k].end_ns + s.offset;
    return s;
  };
  auto describe = [&](View* v, std::size_t k) {
    v->pid = traces[k].pid;
    v->cmdline = traces[k].cmdline;
    v->path = traces[k].path;
    v->start_unix_ns = traces[k].start_unix_ns;
    v->offset_ns = traces[k].start_unix_ns - t0;
    v->unclosed = !traces[k].ended;
  };
  if (traces.size() == 1) {
    out.all = Analysis({source(0, true)}, false).run();
    describe(&out.all, 0);
    return out;
  }
  // Many processes' plots: fewer points each, for a page of a sane size.
  const std::size_t points = traces.size() <= 4 ? report::kPoints : report::kPoints / 4;
  std::vector<Source> all;
  for (std::size_t k : order) {
    all.push_back(source(k, false));
    out.processes.push_back(Analysis({source(k, true)}, false, points).run());
    describe(&out.processes.back(), k);
  }
  out.all = Analysis(std::move(all), true).run();
  out.all.start_unix_ns = t0;
  return out;
}

}  // namespace report
}  // namespace gpupool::launcher
