/* For the RTLD_NEXT test: the first of two libraries defining
   client_next_probe; its dlsym(RTLD_NEXT) must find the second's. */
#define _GNU_SOURCE
#include <dlfcn.h>

int client_next_probe(void) { return 1; }

int client_call_next(void) {
  int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "client_next_probe");
  return next ? next() : -1;
}
