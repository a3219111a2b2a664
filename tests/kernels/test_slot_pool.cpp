// The slot pool of parameter buckets: one arena region of fixed-size slots, a free list, slots
// given back in any order and handed out again without touching any other slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/arena.h"
#include "kernels/error.h"
#include "kernels/slot_pool.h"

namespace rlf {
namespace {

TEST(SlotPool, OneAlignedRegionOfFixedSizeSlotsAtTheArenasTop) {
  Arena arena("device", 1 << 20);
  arena.allocate<float>(10, "below");
  const Arena::Mark before = arena.mark();
  // 1000 bytes round up to 1024: every slot starts on the arena's alignment.
  SlotPool pool(arena, 1000, 5, "buckets");
  EXPECT_EQ(pool.slot_bytes(), 1024u);
  EXPECT_EQ(pool.region_bytes(), 5 * 1024u);
  EXPECT_EQ(SlotPool::region_bytes(1000, 5), 5 * 1024u);
  EXPECT_EQ(arena.used() - before, pool.region_bytes());
  EXPECT_EQ(pool.slots(), 5);
  EXPECT_EQ(pool.free_slots(), 5);
  std::vector<std::byte*> slots;
  for (int i = 0; i < 5; ++i) slots.push_back(static_cast<std::byte*>(pool.acquire()));
  // A fresh pool hands out slots in address order, inside the region, each aligned.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slots[size_t(i)]) % Arena::kAlignment, 0u);
    EXPECT_EQ(slots[size_t(i)] - slots[0], std::ptrdiff_t(i) * 1024);
  }
  EXPECT_EQ(pool.slots_in_use(), 5);
  // Nothing else was taken from the arena: acquiring is bookkeeping only.
  EXPECT_EQ(arena.used() - before, pool.region_bytes());
}

TEST(SlotPool, SlotsComeBackInAnyOrderAndKeepTheirNeighboursIntact) {
  Arena arena("device", 1 << 20);
  const size_t floats = 48;
  const int count = 16;
  SlotPool pool(arena, floats * sizeof(float), count, "buckets");
  std::vector<float*> held;
  for (int i = 0; i < count; ++i) {
    held.push_back(pool.acquire_as<float>());
    std::fill_n(held.back(), floats, float(i));
  }
  EXPECT_EQ(pool.free_slots(), 0);
  // Give back every other slot in a shuffled order, then fill the freed ones again.
  std::vector<int> order;
  for (int i = 1; i < count; i += 2) order.push_back(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (int i : order) pool.give_back(held[size_t(i)]);
  EXPECT_EQ(pool.free_slots(), int(order.size()));
  std::set<float*> again;
  for (size_t k = 0; k < order.size(); ++k) {
    float* slot = pool.acquire_as<float>();
    std::fill_n(slot, floats, -1.0f);
    again.insert(slot);
  }
  // The freed slots and no others were handed out again; the kept ones are untouched.
  std::set<float*> freed;
  for (int i : order) freed.insert(held[size_t(i)]);
  EXPECT_EQ(again, freed);
  for (int i = 0; i < count; i += 2) {
    EXPECT_TRUE(std::all_of(held[size_t(i)], held[size_t(i)] + floats,
                            [i](float v) { return v == float(i); }))
        << "slot " << i;
  }
  // The most recently given back slot is the next one handed out.
  pool.give_back(held[2]);
  pool.give_back(held[0]);
  EXPECT_EQ(pool.acquire_as<float>(), held[0]);
  EXPECT_EQ(pool.acquire_as<float>(), held[2]);
}

TEST(SlotPool, MisuseIsAClearError) {
  Arena arena("device", 1 << 16);
  SlotPool pool(arena, 256, 2, "expert buckets");
  void* a = pool.acquire();
  void* b = pool.acquire();
  try {
    pool.acquire();
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("expert buckets"), std::string::npos) << message;
    EXPECT_NE(message.find("all 2 slots"), std::string::npos) << message;
  }
  pool.give_back(a);
  EXPECT_THROW(pool.give_back(a), std::invalid_argument);  // twice
  EXPECT_THROW(pool.give_back(static_cast<std::byte*>(b) + 4), std::invalid_argument);
  float elsewhere = 0;
  EXPECT_THROW(pool.give_back(&elsewhere), std::invalid_argument);
  EXPECT_THROW(SlotPool(arena, 0, 1, "empty"), std::invalid_argument);
  // A region larger than the arena fails when the pool is made, naming it.
  try {
    SlotPool too_big(arena, 1 << 15, 4, "expert buckets");
    FAIL() << "expected OutOfDeviceMemory";
  } catch (const OutOfDeviceMemory& e) {
    EXPECT_NE(std::string(e.what()).find("expert buckets"), std::string::npos) << e.what();
  }
}

TEST(SlotPool, AnEmptyPoolTakesNoMemory) {
  Arena arena("device", 1 << 16);
  const Arena::Mark before = arena.mark();
  SlotPool pool(arena, 4096, 0, "none needed");
  EXPECT_EQ(arena.mark(), before);
  EXPECT_EQ(pool.free_slots(), 0);
  EXPECT_THROW(pool.acquire(), OutOfDeviceMemory);
}

TEST(SlotPool, TheArenaRewindsPastTheRegion) {
  Arena arena("device", 1 << 16);
  const Arena::Mark before = arena.mark();
  {
    ArenaScope scope(arena);
    SlotPool pool(arena, 512, 8, "phase");
    pool.acquire();
    EXPECT_EQ(arena.used() - before, 8 * 512u);
  }
  EXPECT_EQ(arena.mark(), before);
  EXPECT_EQ(arena.phase_peak(), 8 * 512u);
}

}  // namespace
}  // namespace rlf
