#include "kernels/slot_pool.h"

#include <stdexcept>
#include <string>

#include "kernels/error.h"

namespace rlf {

namespace {

size_t aligned(size_t bytes) {
  return (bytes + Arena::kAlignment - 1) / Arena::kAlignment * Arena::kAlignment;
}

}  // namespace

size_t SlotPool::region_bytes(size_t slot_bytes, int slots) {
  return aligned(slot_bytes) * size_t(slots > 0 ? slots : 0);
}

SlotPool::SlotPool(Arena& arena, size_t slot_bytes, int slots, const char* what)
    : what_(what), slot_bytes_(aligned(slot_bytes)) {
  if (slot_bytes == 0 || slots < 0) {
    throw std::invalid_argument("SlotPool '" + what_ + "': " + std::to_string(slots) +
                                " slots of " + std::to_string(slot_bytes) + " bytes");
  }
  if (slots > 0) {
    region_ = static_cast<std::byte*>(arena.allocate_bytes(region_bytes(slot_bytes, slots), what));
  }
  in_use_.assign(size_t(slots), false);
  // Slot 0 on top of the stack: a fresh pool hands out slots in address order.
  for (int s = slots - 1; s >= 0; --s) free_.push_back(s);
}

void* SlotPool::acquire() {
  if (free_.empty()) {
    throw OutOfDeviceMemory("slot pool '" + what_ + "': all " + std::to_string(slots()) +
                            " slots of " + format_bytes(slot_bytes_) + " are in use");
  }
  const int s = free_.back();
  free_.pop_back();
  in_use_[size_t(s)] = true;
  return region_ + size_t(s) * slot_bytes_;
}

int SlotPool::index_of(const void* slot) const {
  const auto* p = static_cast<const std::byte*>(slot);
  if (!region_ || p < region_ || p >= region_ + region_bytes()) return -1;
  const size_t offset = size_t(p - region_);
  return offset % slot_bytes_ == 0 ? int(offset / slot_bytes_) : -1;
}

void SlotPool::give_back(const void* slot) {
  const int s = index_of(slot);
  if (s < 0) {
    throw std::invalid_argument("slot pool '" + what_ + "': given back a pointer that is not one " +
                                "of its slots");
  }
  if (!in_use_[size_t(s)]) {
    throw std::invalid_argument("slot pool '" + what_ + "': slot " + std::to_string(s) +
                                " given back twice");
  }
  in_use_[size_t(s)] = false;
  free_.push_back(s);
}

}  // namespace rlf
