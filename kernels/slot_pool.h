// Fixed-size slots inside one region of a memory arena: RL Fusion's parameter buckets (one routed
// expert's w1 | w3 | w2 each) are all the same size, so a pool hands them out and takes them back
// in any order through a free list, where the arena itself is a stack that frees only its top.
//
// The region is the arena's allocation at the pool's construction; the arena frees it when its
// owner rewinds past it (an ArenaScope around the pool), not the pool.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/arena.h"

namespace rlf {

class SlotPool {
 public:
  // `slots` slots of `slot_bytes` each (rounded up to the arena's alignment, so every slot starts
  // aligned) allocated from the top of `arena` as one region; `what` names them in messages.
  // Throws OutOfDeviceMemory when the arena cannot hold them, std::invalid_argument when
  // slot_bytes is 0 or slots is negative.
  SlotPool(Arena& arena, size_t slot_bytes, int slots, const char* what);
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  // One free slot, the most recently given back first (never touched memory of any other slot).
  // Throws OutOfDeviceMemory naming the pool's size when every slot is in use.
  void* acquire();
  template <typename T>
  T* acquire_as() {
    return static_cast<T*>(acquire());
  }
  // Gives `slot` back, in any order. Throws std::invalid_argument for a pointer that is not a slot
  // of this pool or a slot that is free already.
  void give_back(const void* slot);

  size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return int(in_use_.size()); }
  int free_slots() const { return int(free_.size()); }
  int slots_in_use() const { return slots() - free_slots(); }
  // Arena bytes of the region: slots() * slot_bytes().
  size_t region_bytes() const { return slot_bytes_ * in_use_.size(); }
  // Bytes a pool of `slots` slots of `slot_bytes` takes from an arena.
  static size_t region_bytes(size_t slot_bytes, int slots);

 private:
  int index_of(const void* slot) const;  // -1: not a slot of this pool

  std::string what_;
  size_t slot_bytes_;
  std::byte* region_ = nullptr;
  std::vector<int> free_;  // a stack: the next acquire takes the back
  std::vector<bool> in_use_;
};

}  // namespace rlf
