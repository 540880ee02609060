// Grid.h - ranks found by their grid coordinates.

#ifndef PARAX_RUNTIME_GRID_H
#define PARAX_RUNTIME_GRID_H

#include "parax/runtime/executable.pb.h"

#include <cstdint>
#include <string>

namespace parax::runtime {

/// The rank whose grid coordinates are `rank`'s but `replica` along "dp".
inline int rankWithReplica(const pxe::Executable &exe, int rank, int64_t replica) {
  const auto &mine = exe.ranks(rank).values();
  for (int r = 0; r < exe.ranks_size(); ++r) {
    const auto &theirs = exe.ranks(r).values();
    bool same = true;
    for (int i = 0; i < mine.size(); ++i)
      same &= theirs[i] == (exe.grid().axis_names(i) == "dp" ? replica : mine[i]);
    if (same) return r;
  }
  return -1;
}

/// The rank that writes replica `replica`'s results: last stage, every
/// other coordinate 0.
inline int writerOf(const pxe::Executable &exe, int64_t replica) {
  for (int r = 0; r < exe.ranks_size(); ++r) {
    bool match = true;
    for (int i = 0; i < exe.grid().axis_names_size(); ++i) {
      const std::string &axis = exe.grid().axis_names(i);
      int64_t c = exe.ranks(r).values(i);
      match &= axis == "dp" ? c == replica : axis == "pp" ? c == exe.grid().shape(i) - 1 : c == 0;
    }
    if (match) return r;
  }
  return 0;
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_GRID_H
