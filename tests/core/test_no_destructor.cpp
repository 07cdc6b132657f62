// NoDestructor<T> (core/no_destructor.hpp): what gpupool's objects outside
// the runtime rely on. Made once, at first use or at compile time, and
// still there while the process exits: T's destructor never runs.
#include "core/no_destructor.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

using gpupool::NoDestructor;

namespace {

// Its destructor ends the process with code 42: a death test that exits
// normally sees 42 if it ran during exit.
struct EndsProcessIfDestroyed {
  explicit EndsProcessIfDestroyed(std::string n) : name(std::move(n)) {}
  ~EndsProcessIfDestroyed() { _exit(42); }
  std::string name;
};

std::atomic<int> g_made{0};
struct Counted {
  Counted(int a, std::string b) : number(a), text(std::move(b)) { g_made.fetch_add(1); }
  int number;
  std::string text;
};

Counted& shared_counted() {
  static NoDestructor<Counted> c(7, "seven");
  return *c;
}

EndsProcessIfDestroyed& local_tracker() {
  static NoDestructor<EndsProcessIfDestroyed> t("local");
  return *t;
}
NoDestructor<EndsProcessIfDestroyed> g_tracker("namespace scope");

// A literal type: constructed at compile time, no initialiser at run time.
struct Literal {
  constexpr explicit Literal(int v) : value(v) {}
  int value;
  std::atomic<int> uses{0};
};
constinit NoDestructor<Literal> g_literal(3);
constinit NoDestructor<std::atomic<int>> g_atomic(5);

struct Aggregate {
  int a;
  const char* b;
};

}  // namespace

// The control: a plain static's destructor runs at exit, and the death
// tests below would see it.
TEST(NoDestructorDeathTest, APlainStaticIsDestroyedAtExit) {
  EXPECT_EXIT(
      {
        static EndsProcessIfDestroyed plain("plain");
        (void)plain;
        std::exit(0);
      },
      testing::ExitedWithCode(42), "");
}

TEST(NoDestructorDeathTest, AFunctionLocalOneOutlivesExit) {
  EXPECT_EXIT(
      {
        EXPECT_EQ(local_tracker().name, "local");
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

TEST(NoDestructorDeathTest, ANamespaceScopeOneOutlivesExit) {
  EXPECT_EXIT(
      {
        EXPECT_EQ(g_tracker->name, "namespace scope");
        std::exit(0);
      },
      testing::ExitedWithCode(0), "");
}

TEST(NoDestructor, MadeOnceWithItsArgumentsByTheFirstOfManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<Counted*> seen[8] = {};
  for (auto& s : seen) threads.emplace_back([&s] { s = &shared_counted(); });
  for (auto& t : threads) t.join();
  for (auto& s : seen) EXPECT_EQ(s.load(), &shared_counted());
  EXPECT_EQ(g_made.load(), 1);
  EXPECT_EQ(shared_counted().number, 7);
  EXPECT_EQ(shared_counted().text, "seven");
}

TEST(NoDestructor, ConstinitWhereTIsALiteralType) {
  EXPECT_EQ(g_literal->value, 3);
  g_literal->uses.fetch_add(1);
  EXPECT_EQ((*g_literal).uses.load(), 1);
  EXPECT_EQ(g_atomic->load(), 5);
  static_assert(std::is_trivially_destructible_v<NoDestructor<std::string>>,
                "nothing registered to run at exit, whatever T");
}

TEST(NoDestructor, AggregatesTakeBraces) {
  static NoDestructor<Aggregate> x(1, "one");
  EXPECT_EQ(x->a, 1);
  EXPECT_STREQ(x->b, "one");
  static const NoDestructor<std::vector<int>> v(3, 9);
  EXPECT_EQ(*v, (std::vector<int>{9, 9, 9}));
  EXPECT_EQ(&v.get(), &*v);
}
