/* The shared device budget (see shared_budget.h). */
#define _GNU_SOURCE
#include "shared_budget.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* run_shared.py reads this layout too. */
_Static_assert(sizeof(SbSlot) == 80 && sizeof(SbFile) == 64 + 80 * SB_SLOTS, "shared file layout");

static int g_fd = -1;
static SbFile* g_map;
static int g_claim;     /* this user takes a slot */
static int g_slot = -1; /* ours, while g_owner == getpid() */
static pid_t g_owner;   /* the process g_fd was opened by */
static char g_real[PATH_MAX];

static void die(const char* what) {
  fprintf(stderr, "standin: STANDIN_SHARED=%s: %s: %s\n", sb_path() ? sb_path() : "", what,
          strerror(errno));
  _exit(98);
}

/* Byte 0 is the allocation lock, byte 1 + i slot i's liveness lock. */
static int ofd_lock(int cmd, short type, off_t byte) {
  struct flock fl;
  memset(&fl, 0, sizeof fl); /* l_pid must be 0 for OFD locks */
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  int r;
  do r = fcntl(g_fd, cmd, &fl);
  while (r < 0 && errno == EINTR);
  if (cmd == F_OFD_GETLK) {
    if (r < 0) die("fcntl(F_OFD_GETLK)");
    return fl.l_type != F_UNLCK; /* 1: some other open file description holds it */
  }
  return r;
}

static void lock_all(void) {
  if (ofd_lock(F_OFD_SETLKW, F_WRLCK, 0) < 0) die("fcntl(F_OFD_SETLKW)");
}
static void unlock_all(void) { ofd_lock(F_OFD_SETLK, F_UNLCK, 0); }

static int slot_live(int i) { return ofd_lock(F_OFD_GETLK, F_WRLCK, 1 + i); }

static uint64_t load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static void store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

const char* sb_path(void) {
  const char* p = getenv("STANDIN_SHARED");
  return p && *p ? p : NULL;
}

uint64_t sb_env_u64(const char* name, uint64_t def) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, NULL, 0) : def;
}

uint64_t sb_capacity(void) { return sb_env_u64("STANDIN_CAPACITY", (uint64_t)1 << 30); }

int sb_devices(void) {
  uint64_t n = sb_env_u64("STANDIN_DEVICES", 2);
  return n > SB_MAX_DEVICES ? SB_MAX_DEVICES : (int)n;
}

static void claim_slot(void) {
  /* Under the allocation lock, so two claimers never pick one slot and no
     reader sees a live slot with its previous owner's usage. */
  for (int i = 0; i < SB_SLOTS; ++i) {
    if (slot_live(i)) continue;
    SbSlot* s = &g_map->slots[i];
    for (int d = 0; d < SB_ACCOUNTS; ++d) store(&s->used[d], 0);
    __atomic_store_n(&s->pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    if (ofd_lock(F_OFD_SETLK, F_WRLCK, 1 + i) < 0) continue; /* raced by a non-claimer? retry */
    g_slot = i;
    return;
  }
  errno = ENOSPC;
  die("no free process slot");
}

void sb_attach(int claim) {
  if (claim) g_claim = 1;
  const pid_t pid = getpid();
  if (g_fd >= 0 && g_owner == pid && (!g_claim || g_slot >= 0)) return;
  if (g_fd >= 0 && g_owner != pid) {
    /* A forked child: the inherited descriptor shares the parent's open file
       description, hence its locks. Drop it (the parent keeps its own) and
       open the file afresh for a slot of our own. */
    close(g_fd);
    g_fd = -1;
    g_slot = -1;
  }
  const char* path = sb_path();
  if (!path) {
    errno = EINVAL;
    die("not set");
  }
  if (g_fd < 0) {
    g_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (g_fd < 0) die("open");
    g_owner = pid;
    if (!realpath(path, g_real)) snprintf(g_real, sizeof g_real, "%s", path);
  }
  lock_all();
  if (!g_map) {
    struct stat st;
    if (fstat(g_fd, &st) < 0) die("fstat");
    if ((size_t)st.st_size < sizeof(SbFile) && ftruncate(g_fd, sizeof(SbFile)) < 0)
      die("ftruncate");
    void* m = mmap(NULL, sizeof(SbFile), PROT_READ | PROT_WRITE, MAP_SHARED, g_fd, 0);
    if (m == MAP_FAILED) die("mmap");
    g_map = (SbFile*)m;
    if (g_map->magic == 0) {
      g_map->version = SB_VERSION;
      g_map->magic = SB_MAGIC;
    } else if (g_map->magic != SB_MAGIC || g_map->version != SB_VERSION) {
      errno = EPROTO;
      die("not a stand-in shared file of this layout");
    }
  }
  if (g_claim && g_slot < 0) claim_slot();
  unlock_all();
}

/* Everyone's usage but our own slot's (which GETLK, asked through the open
   file description holding its lock, would not report as locked). */
static uint64_t used_others(int dev) {
  uint64_t sum = 0;
  for (int i = 0; i < SB_SLOTS; ++i) {
    if (i == g_slot) continue;
    if (__atomic_load_n(&g_map->slots[i].pid, __ATOMIC_ACQUIRE) == 0) continue; /* never used */
    if (slot_live(i)) sum += load(&g_map->slots[i].used[dev]);
  }
  return sum;
}

uint64_t sb_used_all(int dev) {
  sb_attach(0);
  if (dev < 0 || dev >= SB_ACCOUNTS) return 0;
  uint64_t sum = used_others(dev);
  if (g_slot >= 0) sum += load(&g_map->slots[g_slot].used[dev]);
  return sum;
}

int sb_try_charge(int dev, uint64_t mine, uint64_t add, uint64_t capacity) {
  sb_attach(1);
  lock_all();
  const uint64_t others = used_others(dev);
  const int fits =
      others <= capacity && add <= capacity - others && mine <= capacity - others - add;
  if (fits) store(&g_map->slots[g_slot].used[dev], mine + add);
  unlock_all();
  return fits;
}

void sb_set_mine(int dev, uint64_t mine) {
  sb_attach(1);
  store(&g_map->slots[g_slot].used[dev], mine);
}

int sb_list(int dev, SbProcUsage* out, int max) {
  sb_attach(0);
  if (dev < 0 || dev >= SB_ACCOUNTS) return 0;
  int n = 0;
  lock_all();
  for (int i = 0; i < SB_SLOTS; ++i) {
    const int32_t pid = __atomic_load_n(&g_map->slots[i].pid, __ATOMIC_ACQUIRE);
    if (pid == 0) continue; /* never used */
    /* Our own slot's lock is held through our descriptor: GETLK misses it. */
    if (i != g_slot && !slot_live(i)) continue;
    const uint64_t used = load(&g_map->slots[i].used[dev]);
    if (used == 0) continue; /* as NVML: only processes using the device */
    if (n < max) {
      out[n].pid = pid;
      out[n].used = used;
    }
    ++n;
  }
  unlock_all();
  return n;
}

void sb_count_nvml_call(void) {
  sb_attach(0);
  __atomic_add_fetch(&g_map->nvml_memory_info_calls, 1, __ATOMIC_RELAXED);
}

uint64_t sb_nvml_calls(void) {
  sb_attach(0);
  return load(&g_map->nvml_memory_info_calls);
}

/* FNV-1a, then a splitmix64 finalizer for the second half. */
static uint64_t fnv(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void sb_uuid(int dev, unsigned char out[16]) {
  uint64_t h = 0xcbf29ce484222325ull;
  const int32_t d = dev;
  if (sb_path()) {
    sb_attach(0); /* for the real path, the same from any working directory */
    h = fnv(h, "file:", 5);
    h = fnv(h, g_real, strlen(g_real));
  } else {
    const int32_t pid = (int32_t)getpid();
    h = fnv(h, "pid:", 4);
    h = fnv(h, &pid, sizeof pid);
  }
  h = fnv(h, &d, sizeof d);
  const uint64_t a = mix(h), b = mix(h ^ 0x5a5a5a5a5a5a5a5aull);
  for (int i = 0; i < 8; ++i) {
    out[i] = (unsigned char)(a >> (56 - 8 * i));
    out[8 + i] = (unsigned char)(b >> (56 - 8 * i));
  }
}
