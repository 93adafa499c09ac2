// The shadow address space of the memory-checking backend (see shadow_memory.h).
#include "core/backend/shadow_memory.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moe {
namespace {

constexpr size_t kAlign = 256;  // as cudaMalloc's
// Address space only: no access, no memory behind it. A process of tests makes many backends one after another.
constexpr size_t kSpans[] = {size_t(1) << 40, size_t(1) << 36, size_t(1) << 32};

std::array<std::atomic<const ShadowMemory*>, 64> g_spaces{};
struct sigaction g_previous;
std::once_flag g_installed;

void say(const char* text) {
  const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)n;
}

// One frame: the module and offset (for addr2line), and the function's name where the dynamic symbols have it.
void say_frame(void* frame) {
  Dl_info info{};
  char line[768];
  if (::dladdr(frame, &info) == 0 || !info.dli_fname) {
    std::snprintf(line, sizeof line, "    %p\n", frame);
    return say(line);
  }
  const char* name = info.dli_sname;
  int status = -1;
  char* demangled = name ? abi::__cxa_demangle(name, nullptr, nullptr, &status) : nullptr;
  std::snprintf(line, sizeof line, "    %s+0x%zx %s\n", info.dli_fname,
                size_t(static_cast<char*>(frame) - static_cast<char*>(info.dli_fbase)),
                demangled ? demangled : (name ? name : ""));
  std::free(demangled);
  say(line);
}

bool is_write(void* context) {
#if defined(__x86_64__)
  return (static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_ERR] & 2) != 0;
#else
  (void)context;
  return false;
#endif
}

void on_fault(int, siginfo_t* info, void* context) {
  for (const auto& slot : g_spaces) {
    const ShadowMemory* space = slot.load();
    if (space && space->in_space(info->si_addr)) {
      space->report_fault(info->si_addr, is_write(context));
      break;
    }
  }
  // The access runs again on return and meets the disposition there was before (the default: the process ends
  // with SIGSEGV and its core).
  ::sigaction(SIGSEGV, &g_previous, nullptr);
}

void install_handler() {
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGSEGV, &action, &g_previous);
}

void enlist(const ShadowMemory* space) {
  std::call_once(g_installed, install_handler);
  for (auto& slot : g_spaces) {
    const ShadowMemory* empty = nullptr;
    if (slot.compare_exchange_strong(empty, space)) return;
  }
  MOE_FAIL("more than " << g_spaces.size() << " memory-checking backends at once");
}

void delist(const ShadowMemory* space) {
  for (auto& slot : g_spaces) {
    const ShadowMemory* mine = space;
    if (slot.compare_exchange_strong(mine, nullptr)) return;
  }
}

}  // namespace

ShadowMemory::ShadowMemory() {
  for (size_t span : kSpans) {
    void* p = ::mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    base_ = static_cast<char*>(p), span_ = span;
    break;
  }
  MOE_CHECK(base_, "the memory-checking backend could not reserve address space: " << std::strerror(errno));
  enlist(this);
}

ShadowMemory::~ShadowMemory() {
  delist(this);
  ::munmap(base_, span_);
}

void* ShadowMemory::map(void* storage, size_t bytes) {
  MOE_CHECK(storage && bytes > 0, "a shadow range of " << bytes << " bytes");
  Range r{static_cast<char*>(storage), bytes, 0, 0, {}};
  r.frames = ::backtrace(r.site, kFrames);
  // A gap of kAlign after each range: an access just past a buffer's end lies in no buffer.
  const size_t step = (bytes + kAlign - 1) / kAlign * kAlign + kAlign;
  const std::lock_guard<std::mutex> lock(mutex_);
  MOE_CHECK(next_ + step <= span_, "the memory-checking backend has used its " << span_ << " bytes of address space");
  char* p = base_ + next_;
  next_ += step;
  r.id = ++count_;
  live_.emplace(p, r);
  return p;
}

void* ShadowMemory::unmap(const void* shadow) noexcept {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto it = live_.find(static_cast<const char*>(shadow));
  if (it == live_.end()) return nullptr;
  void* storage = it->second.storage;
  live_.erase(it);
  return storage;
}

const ShadowMemory::Range* ShadowMemory::find(const char* p, size_t bytes) const {
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return nullptr;
  --it;
  const char* end = it->first + it->second.bytes;
  return p <= end && bytes <= size_t(end - p) ? &it->second : nullptr;
}

void* ShadowMemory::real(const void* p, size_t bytes, const char* what) const {
  if (!p) return nullptr;
  const char* c = static_cast<const char*>(p);
  const std::lock_guard<std::mutex> lock(mutex_);
  const Range* r = find(c, bytes);
  MOE_CHECK(r, what << ": " << bytes << " bytes at " << p << " are not inside one live buffer of the backend"
                    << (in_space(p) ? " (a freed buffer's, or past a buffer's end)"
                                    : " (host memory given to a backend op)"));
  const char* first = std::prev(live_.upper_bound(c))->first;
  return r->storage + (c - first);
}

bool ShadowMemory::owns(const void* p, size_t bytes) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return find(static_cast<const char*>(p), bytes) != nullptr;
}

bool ShadowMemory::touches(const void* p, size_t bytes) const {
  if (bytes == 0) return false;
  const char* c = static_cast<const char*>(p);
  const std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(c + bytes - 1);  // the last range starting at or before the last byte
  if (it == live_.begin()) return false;
  --it;
  return it->first + it->second.bytes > c;
}

bool ShadowMemory::in_space(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= base_ && c < base_ + span_;
}

void ShadowMemory::report_fault(const void* p, bool write) const {
  char line[512];
  std::snprintf(line, sizeof line,
                "moe: host code %s backend memory at %p: the memory-checking backend's memory is a device's, which "
                "only its ops, copies and data-plane communicators may touch (docs/gpu.md)\n",
                write ? "wrote to" : "read", p);
  say(line);
  if (!mutex_.try_lock()) {
    say("  (the buffer table is busy; no buffer named)\n");
  } else {
    const char* c = static_cast<const char*>(p);
    if (const Range* r = find(c, 1)) {
      const char* first = std::prev(live_.upper_bound(c))->first;
      std::snprintf(line, sizeof line, "  byte %zu of buffer #%lld (%zu bytes), allocated at:\n", size_t(c - first),
                    static_cast<long long>(r->id), r->bytes);
      say(line);
      for (int i = 1; i < r->frames; ++i) say_frame(r->site[i]);  // frame 0 is map() itself
    } else {
      say("  in no live buffer: a freed buffer's address, or past a buffer's end\n");
    }
    mutex_.unlock();
  }
  say("  the access:\n");
  void* frames[kFrames];
  const int n = ::backtrace(frames, kFrames);
  for (int i = 1; i < n; ++i) say_frame(frames[i]);
}

}  // namespace moe
