#include "tree_rows.h"

#include <stdexcept>

namespace mlxcel {

void TreeRows::check(const char* what, const std::vector<int>& seq, const std::vector<int>& capacity) const {
  const size_t T = seq.size();
  if (slot.size() != T || base.size() != T || tail.size() != T)
    throw std::invalid_argument(std::string(what) + "tree rows need a slot, a base and a tail for every row");
  for (size_t t = 0; t < T; ++t) {
    const int cap = capacity[seq[t]];
    const std::string row = std::string(what) + "tree row " + std::to_string(t) + ": ";
    if (slot[t] < 0 || slot[t] >= cap) throw std::invalid_argument(row + "its slot is outside its buffer");
    if (base[t] < 0 || base[t] > cap) throw std::invalid_argument(row + "its prefix is outside its buffer");
    int prev = base[t] - 1;
    for (int r : tail[t]) {
      if (r <= prev || r >= cap)
        throw std::invalid_argument(row + "its tail must be increasing rows after its prefix, inside its buffer");
      prev = r;
    }
  }
}

TreeTails::TreeTails(const TreeRows& rows) {
  for (const auto& t : rows.tail) {
    ptr.push_back(t.data());
    n.push_back(static_cast<int>(t.size()));
  }
}

}  // namespace mlxcel
