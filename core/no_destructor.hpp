// NoDestructor<T>: a T made in place and never destroyed, for the few
// objects gpupool keeps outside the runtime (docs/globals.md lists each,
// with its reason).
//
// Why never destroyed: gpupool's hooks may run while the process exits,
// from atexit handlers and other threads, after static destructors ran,
// and before gpupool's own static initializers (from another library's
// constructor). So such an object is made at its first use (a
// function-local `static NoDestructor<T> x;`, whose initialisation the
// compiler makes thread-safe) or at compile time (constinit, below), and it
// outlives every caller. Unlike the `static T* p = new T;` it replaces, it
// takes no heap memory and no pointer load on each use: T lies in the
// object itself.
//
// A T that is trivially destructible is held as is: constructing it is a
// constant expression when T's is, so a namespace-scope
// `constinit NoDestructor<T>` needs no initialiser at run time. Any other T
// is built in aligned storage, which no destructor touches.
//
// A fork() child handler may make a member of T new in place
// (`new (&x->mu) std::mutex`), as with any T&.
#pragma once

#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace gpupool {

template <class T>
class NoDestructor {
 public:
  // T's own constructor, with these arguments (braces where T is an
  // aggregate).
  template <class... Args>
  constexpr explicit NoDestructor(Args&&... args) : store_(std::forward<Args>(args)...) {}

  NoDestructor(const NoDestructor&) = delete;
  NoDestructor& operator=(const NoDestructor&) = delete;

  constexpr T& get() noexcept { return store_.get(); }
  constexpr const T& get() const noexcept { return store_.get(); }
  constexpr T& operator*() noexcept { return get(); }
  constexpr const T& operator*() const noexcept { return get(); }
  constexpr T* operator->() noexcept { return &get(); }
  constexpr const T* operator->() const noexcept { return &get(); }

 private:
  // Trivially destructible: nothing would run at exit anyway.
  struct Direct {
    template <class... Args>
    constexpr explicit Direct(Args&&... args) : value(make_value(std::forward<Args>(args)...)) {}
    constexpr T& get() noexcept { return value; }
    constexpr const T& get() const noexcept { return value; }
    T value;
  };
  // Bytes with T built in them: the bytes' end runs nothing.
  struct InPlace {
    template <class... Args>
    explicit InPlace(Args&&... args) {
      construct(bytes, std::forward<Args>(args)...);
    }
    T& get() noexcept { return *std::launder(reinterpret_cast<T*>(bytes)); }
    const T& get() const noexcept { return *std::launder(reinterpret_cast<const T*>(bytes)); }
    alignas(T) unsigned char bytes[sizeof(T)];
  };

  template <class... Args>
  static void construct(void* where, Args&&... args) {
    if constexpr (std::is_constructible_v<T, Args&&...>)
      ::new (where) T(std::forward<Args>(args)...);
    else ::new (where) T{std::forward<Args>(args)...};
  }
  template <class... Args>
  static constexpr T make_value(Args&&... args) {
    if constexpr (std::is_constructible_v<T, Args&&...>) return T(std::forward<Args>(args)...);
    else return T{std::forward<Args>(args)...};
  }

  std::conditional_t<std::is_trivially_destructible_v<T>, Direct, InPlace> store_;
};

}  // namespace gpupool
