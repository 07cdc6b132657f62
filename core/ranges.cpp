// The range cache (ranges.hpp).
#include "core/ranges.hpp"

#include <algorithm>

#include "core/binned.hpp"

namespace gpupool::core_detail {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
std::size_t round_down(std::size_t n, std::size_t to) { return n / to * to; }

// Granules a range gave back in two steps of one call, as one Held (a
// range's Held is already given back: only its size is counted).
void add_given_back(Held& into, const Held& more) {
  if (!more.size) return;
  if (!into.size) into = more;
  else into.size += more.size;
}

}  // namespace

RangeCache::RangeCache(Backend& backend, HeldCap& cap, BinnedCache& binned, std::size_t granule,
                       std::size_t reserve, std::size_t min_rest, std::size_t pending_growth,
                       const std::atomic<bool>& retired, std::uint64_t (*clock)())
    : backend_(backend),
      cap_(cap),
      binned_(binned),
      granule_(granule),
      reserve_(round_up(reserve, granule)),
      min_rest_(min_rest),
      pending_growth_(pending_growth),
      retired_(retired),
      clock_(clock) {}

// The arena goes: pieces still in use (a pool destroyed under a program,
// in tests) go with the range.
RangeCache::~RangeCache() {
  LockGuard lock(mu_);
  if (base_) backend_.unreserve(base_, reserve_, data_, retired_.load(std::memory_order_acquire));
}

void RangeCache::make_spares() {
  while (spares_.size() < kSpares) {
    spares_.reserve(kSpares);
    Pieces one;
    FreeSet node;
    node.emplace(0, 0);
    Piece p;
    p.node = node.extract(node.begin());
    one.emplace(0, std::move(p));
    spares_.push_back(one.extract(one.begin()));
  }
}

// A piece cut in three needs two more; one that keeps an end, one.
bool RangeCache::spares_for(Handle at, const Piece& p) const {
  Handle from = 0;
  const std::size_t n = whole_granules(at, p, &from);
  return spares_.size() >= std::size_t(from != at) + std::size_t(from + n != at + p.size);
}

RangeCache::Pieces::iterator RangeCache::place(Handle at, std::size_t size, State state) {
  Pieces::node_type n = std::move(spares_.back());
  spares_.pop_back();
  n.key() = at;
  n.mapped().size = size;
  n.mapped().state = state;
  n.mapped().fence = 0;
  n.mapped().freed_at_ns = 0;
  return pieces_.insert(std::move(n)).position;
}

void RangeCache::add_free(Handle at, Piece& p) {
  p.state = State::free;
  p.node.value() = {p.size, at};
  free_.insert(std::move(p.node));
  c_.add_held(p.size);
  cap_.hold(p.size);
}

void RangeCache::remove_free(Handle at, Piece& p) {
  p.state = State::used;
  p.node = free_.extract({p.size, at});
  c_.remove_held(p.size);
  cap_.unhold(p.size);
}

void RangeCache::add_unmapped(Handle at, Piece& p) {
  p.state = State::unmapped;
  p.fence = 0;
  p.node.value() = {p.size, at};
  unmapped_.insert(std::move(p.node));
}

void RangeCache::remove_unmapped(Handle at, Piece& p) {
  p.state = State::used;
  p.node = unmapped_.extract({p.size, at});
}

void RangeCache::detach(Handle at, Piece& p) {
  switch (p.state) {
    case State::free:
      remove_free(at, p);
      break;
    case State::unmapped:
      remove_unmapped(at, p);
      break;
    case State::dead:
      p.node = dead_.extract({p.size, at});
      p.state = State::used;
      break;
    case State::used:
      break;
  }
}

void RangeCache::attach(Handle at, Piece& p, State s) {
  switch (s) {
    case State::free:
      add_free(at, p);
      break;
    case State::unmapped:
      add_unmapped(at, p);
      break;
    case State::dead:
      p.state = State::dead;
      p.node.value() = {p.size, at};
      dead_.insert(std::move(p.node));
      break;
    case State::used:
      p.state = State::used;
      break;
  }
}

// The piece `it` (used, not in a set) joins its set, merged with its
// neighbours of the same state. Fences are ordered: the later covers both.
RangeCache::Pieces::iterator RangeCache::merge(Pieces::iterator it) {
  Piece& p = it->second;
  const State s = p.state;
  const bool is_ready = s == State::unmapped || ready(p);
  // Where the device is made to wait for pending pieces (Backend::orders),
  // a pending neighbour costs the host nothing: free pieces merge whatever
  // their readiness, as they would reusing at once.
  const bool any = backend_.orders();
  it = merge_neighbours(
      pieces_, it,
      [&](const Piece& n) {
        return n.state == s && (s == State::unmapped || any || ready(n) == is_ready);
      },
      [&](Handle at, Piece& n) GPUPOOL_REQUIRES(mu_) { detach(at, n); });
  attach(it->first, it->second, s);
  return it;
}

bool RangeCache::coalesce(bool pending_too) {
  // As in merge(): where the backend orders, readiness does not matter.
  const bool any = pending_too || backend_.orders();
  return coalesce_free(
      pieces_,
      [&](const Piece& p, const Piece& n) {
        return p.state == State::free && n.state == State::free && (any || (ready(p) && ready(n)));
      },
      [&](Handle at, Piece& p) GPUPOOL_REQUIRES(mu_) { remove_free(at, p); },
      [&](Handle at, Piece& p) GPUPOOL_REQUIRES(mu_) { add_free(at, p); });
}

std::size_t RangeCache::whole_granules(Handle at, const Piece& p, Handle* from) const {
  const Handle a = base_ + round_up(at - base_, granule_);
  const Handle b = base_ + round_down(at + p.size - base_, granule_);
  *from = a;
  return b > a ? b - a : 0;
}

Held RangeCache::give_back(Pieces::iterator it, bool drop) {
  Handle from = 0;
  const Handle at = it->first;
  Piece& p = it->second;
  const std::size_t n = whole_granules(at, p, &from);
  if (n == 0 || !spares_for(at, p)) return {};
  const std::uint64_t fence = p.fence, freed_at = p.freed_at_ns;
  const std::size_t size = p.size;
  if (!drop) backend_.unmap(from, n, data_, done(p) ? 0 : fence);
  mapped_ -= n;
  remove_free(at, p);
  // Lead and tail stay free (and mapped); the granules between go unmapped.
  auto middle = it;
  if (from != at) {
    p.size = from - at;
    add_free(at, p);
    middle = place(from, n, State::used);
  } else {
    p.size = n;
  }
  if (from + n != at + size) {
    auto tail = place(from + n, at + size - from - n, State::used);
    tail->second.fence = fence;
    tail->second.freed_at_ns = freed_at;
    add_free(tail->first, tail->second);
  }
  middle->second.state = State::unmapped;
  middle->second.fence = 0;
  // merge() wants it out of the sets; it is.
  merge(middle);
  Held h;
  h.handle = from;
  h.size = n;
  h.data = data_;
  h.unmapped = true;
  return h;
}

RangeCache::Cut RangeCache::cut(Pieces::iterator it, std::size_t want, bool from_end) {
  const Handle at = it->first;
  Piece& p = it->second;
  remove_free(at, p);
  if (from_end && p.size - want >= min_rest_ && !spares_.empty()) {
    // The rest keeps its place, fence and node; the part handed out is new.
    auto mine = place(at + p.size - want, want, State::used);
    p.size -= want;
    add_free(at, p);
    return {mine->first, want, 0, data_};
  }
  if (p.size - want >= min_rest_ && !spares_.empty()) {
    auto rest = place(at + want, p.size - want, State::used);
    rest->second.fence = p.fence;
    rest->second.freed_at_ns = p.freed_at_ns;
    add_free(rest->first, rest->second);
    p.size = want;
  }
  return {at, p.size, 0, data_};
}

RangeCache::Cut RangeCache::serve(FreeSet::iterator best, std::size_t want) {
  auto it = pieces_.find(best->second);
  const bool top = want >= kTopRequest && 2 * want >= *std::max_element(std::begin(recent_large_),
                                                                        std::end(recent_large_));
  // The piece the range grows from: the last mapped before unmapped space.
  auto grows = [&](Pieces::iterator q) GPUPOOL_REQUIRES(mu_) {
    auto next = std::next(q);
    return next == pieces_.end() || next->second.state == State::unmapped;
  };
  if (top) {
    for (auto q = pieces_.rbegin(); q != pieces_.rend(); ++q)
      if (q->second.state == State::free && q->second.size >= want && ready(q->second)) {
        it = std::prev(q.base());
        break;
      }
  } else if (grows(it)) {
    // A smaller request takes it only when no other ready piece fits, so
    // that a large one finds it whole, or grows from it.
    for (auto f = std::next(best); f != free_.end(); ++f)
      if (auto q = pieces_.find(f->second); ready(q->second) && !grows(q)) {
        it = q;
        break;
      }
  }
  const Cut c = cut(it, want, top);
  refill();
  return c;
}

RangeCache::Pieces::iterator RangeCache::split(Pieces::iterator it, Handle at) {
  Piece& p = it->second;
  const State s = p.state;
  const std::size_t size = p.size;
  detach(it->first, p);
  p.size = at - it->first;
  attach(it->first, p, s);
  auto rest = place(at, it->first + size - at, State::used);
  rest->second.fence = p.fence;
  rest->second.freed_at_ns = p.freed_at_ns;
  attach(at, rest->second, s);
  return rest;
}

void RangeCache::unmap_span(Handle from, Handle to) {
  auto first = std::prev(pieces_.upper_bound(from));
  std::uint64_t fence = 0;
  for (auto q = first; q != pieces_.end() && q->first < to; ++q)
    if (!done(q->second)) fence = std::max(fence, q->second.fence);
  if (!retired_.load(std::memory_order_acquire)) backend_.unmap(from, to - from, data_, fence);
  mapped_ -= to - from;
  if (first->first < from) first = split(first, from);
  if (auto last = std::prev(pieces_.lower_bound(to)); last->first + last->second.size > to)
    split(last, to);
  // The pieces of [from, to): the first becomes the unmapped piece, the
  // others go.
  detach(from, first->second);
  for (auto q = std::next(first); q != pieces_.end() && q->first < to;) {
    detach(q->first, q->second);
    q = pieces_.erase(q);
  }
  first->second.size = to - from;
  first->second.state = State::unmapped;
  merge(first);
}

// The granules around the dead piece at `at`: its own, and those it shares
// with free or dead pieces only (a piece in use keeps the granules it
// shares mapped).
bool RangeCache::reap_one(Handle at, std::size_t* unmapped) {
  const Piece& p = pieces_.find(at)->second;
  const Handle end = at + p.size;
  const Handle lo = base_ + round_down(at - base_, granule_);
  const Handle hi = base_ + round_up(end - base_, granule_);
  auto in_use = [&](Handle from, Handle to) GPUPOOL_REQUIRES(mu_) {
    if (from >= to) return false;
    for (auto q = std::prev(pieces_.upper_bound(from)); q != pieces_.end() && q->first < to; ++q)
      if (q->second.state == State::used) return true;
    return false;
  };
  const Handle from = in_use(lo, at) ? lo + granule_ : lo;
  const Handle to = in_use(end, hi) ? hi - granule_ : hi;
  if (from >= to || spares_.size() < 2) return false;
  unmap_span(from, to);
  *unmapped += to - from;
  return true;
}

Held RangeCache::reap() {
  refill();  // (a failure leaves a split for a later reap)
  std::size_t unmapped = 0;
  // Each reap changes the pieces: look again from the start (dead pieces
  // are the few the program shared).
  for (bool again = true; again;) {
    again = false;
    for (const auto& [size, at] : dead_)
      if (reap_one(at, &unmapped)) {
        again = true;
        break;
      }
  }
  refill();
  any_dead_.store(!dead_.empty(), std::memory_order_relaxed);
  Held h;
  if (unmapped == 0) return h;
  h.handle = base_;
  h.size = unmapped;
  h.data = data_;
  h.unmapped = true;
  return h;
}

std::size_t RangeCache::pending_bytes(std::uint64_t* last_fence) const {
  std::size_t n = 0;
  for (const auto& [size, at] : free_)
    if (const Piece& p = pieces_.find(at)->second; !ready(p)) {
      n += size;
      *last_fence = std::max(*last_fence, p.fence);
    }
  return n;
}

bool RangeCache::fits_once_ready(std::size_t want) const {
  std::size_t run = 0;
  bool pending = false, fits = false;
  for (const auto& [at, p] : pieces_) {
    if (p.state != State::free) {
      run = 0;
      continue;
    }
    run += p.size;
    pending = pending || !ready(p);
    fits = fits || run >= want;
  }
  return fits && pending;
}

RangeCache::Cut RangeCache::take(std::size_t want, bool first_attempt, std::uint64_t* wait) {
  LockGuard lock(mu_);
  if (first_attempt && want >= kTopRequest) {
    recent_large_[recent_next_] = want;
    recent_next_ = (recent_next_ + 1) % kTopWindow;
  }
  make_spares();
  auto best = free_.end();
  for (int pass = 0; pass < 2 && best == free_.end(); ++pass) {
    if (pass == 1 && !coalesce()) break;
    for (auto it = free_.lower_bound({want, 0}); it != free_.end(); ++it)
      if (ready(pieces_.find(it->second)->second)) {
        best = it;
        break;
      }
  }
  // The best fit waits for the device: wait for it too, rather than cut a
  // larger ready piece (the sizes a program reuses would scatter over the
  // larger pieces, which later requests would then find cut up: the CNN
  // trace takes 1.68x its peak active so, 1.29x waiting; bench_replay).
  if (first_attempt && best != free_.end())
    if (auto fit = free_.lower_bound({want, 0}); best->first > fit->first) {
      *wait = pieces_.find(fit->second)->second.fence;
      return {};
    }
  if (best != free_.end()) return serve(best, want);
  // None ready: map more, unless the pending pieces would serve and hold
  // more than the bound. Where the device is made to wait for them instead
  // of the host (Backend::orders), no bound: the best fit, ordered after
  // its own free only (not the newest pending piece's).
  if (first_attempt && fits_once_ready(want)) {
    if (backend_.orders()) {
      if (auto fit = free_.lower_bound({want, 0}); fit != free_.end()) {
        *wait = pieces_.find(fit->second)->second.fence;
        return {};
      }
    }
    const std::size_t bound = std::min(pending_growth_, mapped_ / kPendingShare);
    std::uint64_t last = 0;
    if (pending_bytes(&last) + round_up(want, granule_) > bound) *wait = last;
  }
  return {};
}

void RangeCache::refill() {
  try {
    make_spares();
  } catch (...) {
    // The next allocation tries again; meanwhile a free piece that needs a
    // split is given back later.
  }
}

BackendResult RangeCache::grow(std::size_t want, Cut* cut_out, bool* no_room) {
  LockGuard lock(mu_);
  make_spares();
  // Another thread may have freed a piece that fits since take(), or its
  // fence passed (at any time: other threads' waits end).
  auto fitting_ready = [&]() GPUPOOL_REQUIRES(mu_) {
    for (auto it = free_.lower_bound({want, 0}); it != free_.end(); ++it)
      if (ready(pieces_.find(it->second)->second)) {
        *cut_out = serve(it, want);
        return true;
      }
    return false;
  };
  BackendResult ok;
  ok.status = BackendStatus::ok;
  if (fitting_ready()) return ok;
  if (!base_) {
    if (unreservable_) {
      *no_room = true;
      return {};
    }
    const BackendResult r = backend_.reserve(reserve_);
    if (r.status != BackendStatus::ok) {
      unreservable_ = true;
      *no_room = true;
      return {};
    }
    base_ = r.handle;
    data_ = r.data;
    auto whole = place(base_, reserve_, State::used);
    add_unmapped(whole->first, whole->second);
    make_spares();
  }
  // The unmapped piece whose mapping serves `want` with the fewest new
  // bytes, joined with the ready free pieces either side; of equals, the
  // lowest.
  auto usable = [&](Pieces::iterator n) GPUPOOL_REQUIRES(mu_) {
    return n != pieces_.end() && n->second.state == State::free && ready(n->second);
  };
  Pieces::iterator best = pieces_.end();
  std::size_t best_map = SIZE_MAX;
  for (const auto& [size, at] : unmapped_) {
    auto u = pieces_.find(at);
    std::size_t lead = 0, tail = 0;
    if (u != pieces_.begin())
      if (auto prev = std::prev(u); usable(prev)) lead = prev->second.size;
    if (auto next = std::next(u); usable(next)) tail = next->second.size;
    // One of them became ready since the look above and fits alone: it
    // serves, with nothing mapped (readiness never goes back).
    if (lead >= want || tail >= want) {
      if (fitting_ready()) return ok;
      continue;  // not reached: a ready free piece that fits is in free_
    }
    std::size_t map = 0;
    if (lead + size >= want) {
      map = std::min(size, round_up(want - lead, granule_));
    } else if (lead + size + tail >= want) {
      map = size;
    } else {
      continue;
    }
    if (map < best_map || (map == best_map && at < best->first)) best = u, best_map = map;
  }
  if (best == pieces_.end()) {
    *no_room = true;
    return {};
  }
  const Handle at = best->first;
  BackendResult r = backend_.map(at, best_map, data_);
  if (r.status != BackendStatus::ok) return r;
  mapped_ += best_map;
  // The mapped granules: a ready free piece, merged with the ready free
  // pieces either side, cut for the request.
  Piece& u = best->second;
  remove_unmapped(at, u);
  if (best_map < u.size) {
    auto rest = place(at + best_map, u.size - best_map, State::used);
    add_unmapped(rest->first, rest->second);
    u.size = best_map;
  }
  u.state = State::free;
  u.fence = 0;
  u.freed_at_ns = clock_();
  auto merged = merge(best);
  // From the start even when large: the granules were mapped for it, and
  // a rest would stay above it (replayed: the CNN trace 1.350x, not 1.288x).
  *cut_out = cut(merged, want, /*from_end=*/false);
  cut_out->mapped = best_map;
  refill();
  return r;
}

Held RangeCache::free(Handle at, std::uint64_t fence, std::uint64_t t_ns, bool reusable,
                      const std::atomic<bool>& keep, bool* over_cap) {
  LockGuard lock(mu_);
  auto it = pieces_.find(at);
  it->second.fence = fence;
  it->second.freed_at_ns = t_ns;
  if (!reusable) {
    attach(at, it->second, State::dead);
    const Held gone = reap();  // any_dead_ set, under mu_
    dyings_.fetch_sub(1, std::memory_order_release);
    return gone;
  }
  it->second.state = State::free;
  it = merge(it);
  const bool held = keep.load(std::memory_order_acquire);
  Held gone;
  if (!held) gone = give_back(it, /*drop=*/false);
  // A piece freed beside a dead one may leave the dead one's granules free
  // of pieces in use.
  if (!dead_.empty()) add_given_back(gone, reap());
  if (held) *over_cap = cap_.over();
  return gone;
}

// As free() does for a reusable piece that is held, without its reap:
// nothing is parked while dead pieces remain (parking()).
RangeCache::Pieces::iterator RangeCache::unpark_locked(Block* b) {
  auto it = pieces_.find(b->handle);
  it->second.fence = b->fence;
  it->second.freed_at_ns = b->freed_at_ns;
  it->second.state = State::free;
  return merge(it);
}

Held RangeCache::unpark(Block* b, const std::atomic<bool>& keep) {
  cap_.unhold(b->size);  // held again as a free piece (add_free)
  // The cap's count is as it was: the park that held it looked at the cap.
  bool over_cap = false;
  const Held gone = free(b->handle, b->fence, b->freed_at_ns, /*reusable=*/true, keep, &over_cap);
  delete b;
  return gone;
}

std::size_t RangeCache::stock_budget() const { return pending_growth_ / binned_.shard_count(); }

void RangeCache::dying() {
  dyings_.fetch_add(1, std::memory_order_seq_cst);
  unpark_all();
}

bool RangeCache::unpark_all(bool hinted, std::uint64_t freed_by_ns, const std::atomic<bool>* keep,
                            Held* gone) {
  bool any = false;
  for (unsigned i = 0; i < binned_.shard_count(); ++i) {
    Shard& s = binned_.shard(i);
    if (hinted && s.parked_any.load(std::memory_order_relaxed) == 0) continue;
    any =
        unpark_shard(s, freed_by_ns, /*pending_from=*/0, keep, gone, /*spare_stock=*/hinted) || any;
  }
  return any;
}

Held RangeCache::unpark_slot(unsigned shard, std::size_t want, const std::atomic<bool>& keep) {
  Shard& s = binned_.shard(shard);
  Held gone;
  if (s.parked_any.load(std::memory_order_relaxed) != 0)
    unpark_shard(s, UINT64_MAX, /*pending_from=*/want, &keep, &gone);
  return gone;
}

bool RangeCache::unpark_shard(Shard& s, std::uint64_t freed_by_ns, std::size_t pending_from,
                              const std::atomic<bool>* keep, Held* gone, bool spare_stock) {
  Block* out[Shard::kParkSlots];
  unsigned n = 0;
  {
    LockGuard lock(s.mu);
    if (spare_stock && s.keeps_stock(stock_budget())) pending_from = SIZE_MAX;
    for (unsigned k = 0; k < s.parked_n;) {
      const Block* b = s.parked[k];
      if (b->freed_at_ns <= freed_by_ns &&
          (b->size >= pending_from || b->fence == 0 || backend_.reusable(b->fence)))
        out[n++] = s.unpark_at(k, granule_);
      else ++k;
    }
  }
  if (n == 0) return false;
  if (keep) {
    for (unsigned k = 0; k < n; ++k) add_given_back(*gone, unpark(out[k], *keep));
    return true;
  }
  for (unsigned k = 0; k < n; ++k) cap_.unhold(out[k]->size);
  {
    LockGuard lock(mu_);
    for (unsigned k = 0; k < n; ++k) unpark_locked(out[k]);
  }
  for (unsigned k = 0; k < n; ++k) delete out[k];
  return true;
}

Held RangeCache::forget(Handle at, std::uint64_t t_ns) {
  LockGuard lock(mu_);
  auto it = pieces_.find(at);
  it->second.state = State::free;
  it->second.fence = 0;
  it->second.freed_at_ns = t_ns;
  return give_back(merge(it), /*drop=*/true);
}

// Largest: the free piece with the most whole granules (the first of equals
// by address). Oldest: the one freed first, the largest of those freed at
// once.
void RangeCache::offer(Victims order, Offer& best) {
  unpark_all();
  LockGuard lock(mu_);
  try {
    make_spares();
  } catch (...) {
    return;  // nothing given back that would need a split: next time
  }
  Handle mine = 0;
  std::size_t size = 0;
  std::uint64_t freed_at = 0;
  for (const auto& [at, p] : pieces_) {
    if (p.state != State::free) continue;
    Handle from = 0;
    const std::size_t n = whole_granules(at, p, &from);
    if (n == 0) continue;
    const bool better =
        !mine || (order == Victims::largest
                      ? n > size
                      : p.freed_at_ns < freed_at || (p.freed_at_ns == freed_at && n > size));
    if (better) mine = from, size = n, freed_at = p.freed_at_ns;
  }
  if (mine && best.beaten_by(order, size, freed_at)) best = {this, size, freed_at, {mine, size}};
}

// The offered granules, if the free piece around them still has them all.
Held RangeCache::take_offered(const Offer& offer) {
  LockGuard lock(mu_);
  const Handle from = offer.place[0];
  auto it = pieces_.upper_bound(from);
  if (it == pieces_.begin()) return {};
  --it;
  if (it->second.state != State::free) return {};
  Handle a = 0;
  if (whole_granules(it->first, it->second, &a) < offer.place[1] || a > from) return {};
  return give_back(it, retired_.load(std::memory_order_acquire));
}

// The free piece with the most whole granules that the spares can split,
// free neighbours merged first whatever their fences (all of it goes: a
// granule astride a ready piece and a pending one would stay otherwise).
Held RangeCache::take_any() {
  unpark_all();
  LockGuard lock(mu_);
  if (!dead_.empty())
    if (const Held h = reap(); h.size) return h;
  coalesce(/*pending_too=*/true);
  auto best = pieces_.end();
  std::size_t size = 0;
  for (auto it = pieces_.begin(); it != pieces_.end(); ++it) {
    if (it->second.state != State::free || !spares_for(it->first, it->second)) continue;
    Handle from = 0;
    const std::size_t n = whole_granules(it->first, it->second, &from);
    if (n > size) best = it, size = n;
  }
  return size ? give_back(best, retired_.load(std::memory_order_acquire)) : Held{};
}

void RangeCache::take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) {
  // Only what idle release may take: the periodic trim would otherwise
  // empty the parks every time it looks.
  unpark_all(/*hinted=*/false, freed_by_ns);
  LockGuard lock(mu_);
  const bool drop = retired_.load(std::memory_order_acquire);
  for (auto it = pieces_.begin(); it != pieces_.end();) {
    const Piece& p = it->second;
    Handle from = 0;
    if (p.state != State::free || p.freed_at_ns > freed_by_ns ||
        whole_granules(it->first, p, &from) == 0) {
      ++it;
      continue;
    }
    // Room first: once unmapped, the granules must be counted.
    make_room(out, 1);
    make_spares();
    const Handle at = it->first;
    const Held h = give_back(it, drop);
    out.push_back(h);
    // What follows the unmapped granules (a free tail, or the next piece).
    it = pieces_.upper_bound(h.size ? h.handle : at);
  }
}

std::size_t RangeCache::releasable_bytes() const {
  LockGuard lock(mu_);
  std::size_t n = 0;
  for (const auto& [at, p] : pieces_) {
    Handle from = 0;
    if (p.state == State::free) n += whole_granules(at, p, &from);
  }
  return n;
}

}  // namespace gpupool::core_detail
