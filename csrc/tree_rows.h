// Draft-tree rows as the layer and cache-attention primitives take them (layer_kernel.h, "Tree
// rows"): where each row's key is written, and which rows it attends after its prefix. Plain rows
// (a decode step, a verify chain, a prompt chunk) pass none of this.
#pragma once
#include <string>
#include <vector>

namespace mlxcel {

struct TreeRows {
  std::vector<int> slot;               // buffer row each row's key and value go to
  std::vector<int> base;               // each row sees buffer rows 0..base-1,
  std::vector<std::vector<int>> tail;  // then these rows, increasing (its ancestors and itself)

  bool empty() const { return slot.empty(); }
  bool operator==(const TreeRows& o) const { return slot == o.slot && base == o.base && tail == o.tail; }

  // std::invalid_argument (prefixed by `what`) unless every row's slot, prefix and tail lie inside
  // its sequence's buffer (capacity[seq[t]] rows) and each tail is increasing from its base
  void check(const char* what, const std::vector<int>& seq, const std::vector<int>& capacity) const;
};

// A TreeRows' tails as the kernels read them (pointers into `rows`, which must outlive this)
struct TreeTails {
  std::vector<const int*> ptr;
  std::vector<int> n;
  explicit TreeTails(const TreeRows& rows);
};

}  // namespace mlxcel
