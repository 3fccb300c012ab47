// Weights in one arena of transparent huge pages.
//
// Why: a decode step streams every weight once (about 110 MiB a token on the default model,
// several hundred on a 1B shape). MLX allocates each array with malloc, in 4 KiB pages: 28,000
// TLB misses a token on the default model, and in a virtual machine each miss walks two page
// tables. One mapping advised MADV_HUGEPAGE (`enabled` = madvise, the common default, honours
// it) holds the same bytes in 2 MiB pages, laid out in the order the step reads them.
//
// How: the arrays are copied back to back into an anonymous mapping aligned to 2 MiB; each new
// array's buffer is the arena's bytes behind MLX's 8-byte size header (the CPU allocator's
// Buffer layout: raw_ptr() = ptr + sizeof(size_t)), so MLX reads it like any of its own, and its
// deleter only drops a reference to the arena, which unmaps when the last array goes. The values
// are copied, never changed: outputs stay bit-identical.
#include "huge_pages.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

#if defined(__linux__)
#include <sys/mman.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1+; older headers lack the name
#endif
#endif

namespace mlxcel {

namespace {

std::atomic<size_t> live_bytes{0};  // the arenas still mapped (MLX's memory counters do not see them)

constexpr size_t kHuge = size_t(2) << 20;
constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

#if defined(__linux__)
struct Arena {
  void* map = nullptr;
  size_t map_bytes = 0;
  size_t counted = 0;  // the part that may be touched (the alignment slack never is)
  ~Arena() {
    if (!map) return;
    munmap(map, map_bytes);
    live_bytes -= counted;
  }
};

// AnonHugePages of the mapping [base, base + bytes) from /proc/self/smaps, in bytes
size_t huge_bytes_of(const void* base, size_t bytes) {
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + bytes;
  char line[512];
  size_t total = 0;
  bool inside = false;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (std::sscanf(line, "%lx-%lx ", &a, &b) == 2) {  // a mapping's header line: "start-end perms ..."
      inside = a < hi && b > lo;
      continue;
    }
    unsigned long kb;
    if (inside && std::sscanf(line, "AnonHugePages: %lu kB", &kb) == 1) total += size_t(kb) << 10;
  }
  std::fclose(f);
  return total;
}
#endif

}  // namespace

HugePagesResult to_huge_pages(std::vector<mx::array> arrays) {
  HugePagesResult out;
#if defined(__linux__)
  if (arrays.empty()) return out;
  mx::eval(arrays);
  std::vector<size_t> offsets;
  size_t used = 0;
  for (auto& a : arrays) {
    if (!a.flags().row_contiguous) throw std::invalid_argument("to_huge_pages: arrays must be row-contiguous");
    used = round_up(used + sizeof(size_t), kAlign);  // room for MLX's size header before the data
    offsets.push_back(used);
    used += a.nbytes();
  }
  const size_t bytes = round_up(used, kHuge);
  const size_t map_bytes = bytes + kHuge;  // slack to align the start to 2 MiB
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    out.arrays = std::move(arrays);
    return out;
  }
  auto arena = std::make_shared<Arena>();
  arena->map = map;
  arena->map_bytes = map_bytes;
  arena->counted = bytes;
  live_bytes += bytes;
  auto* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(map), kHuge));
  madvise(base, bytes, MADV_HUGEPAGE);  // before the first touch: the faults take whole huge pages
  for (size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    uint8_t* data = base + offsets[i];
    *reinterpret_cast<size_t*>(data - sizeof(size_t)) = a.nbytes();
    if (a.nbytes()) std::memcpy(data, a.data<uint8_t>(), a.nbytes());  // (a symmetric layer's biases are empty)
    mx::allocator::Buffer buf(data - sizeof(size_t));
    out.arrays.emplace_back(mx::allocator::Data(buf, [arena](mx::allocator::Buffer) mutable { arena.reset(); }),
                            a.shape(), a.dtype());
  }
  // a fault that found no free huge page took small ones; collapsing asks again, synchronously
  // (Linux 6.1+; an older kernel says EINVAL and the arena keeps what it got)
  out.huge_bytes = huge_bytes_of(base, bytes);
  if (out.huge_bytes < bytes && madvise(base, bytes, MADV_COLLAPSE) == 0) out.huge_bytes = huge_bytes_of(base, bytes);
  out.bytes = bytes;
#else
  out.arrays = std::move(arrays);
#endif
  return out;
}

size_t huge_pages_bytes() { return live_bytes.load(); }

}  // namespace mlxcel
