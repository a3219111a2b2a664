// Copies of large host buffers that are not read again soon, with non-temporal (streaming) stores.
// A plain memcpy's stores first read each destination line into the caches (read for ownership)
// and keep it there. glibc switches to non-temporal stores only past a fraction of the last-level
// cache: on this VM (300 MiB L3) its memcpy moved 7.2-7.8 GB/s at 48-112 MiB and 11-12 GB/s from
// 120 MiB up (2026-12-06), and `small`'s offloaded AdamW moments are two 106 MiB buffers. Streaming
// stores moved them at 9.5-10.5 GB/s, and zeroed at 22 GB/s where memset wrote 12. Meant for
// offloaded optimizer state, which the next phase does not touch; for data read right after the
// copy the caches are the better place, and plain memcpy stays the default.
#pragma once

#include <cstddef>

namespace rlf {

// std::memcpy's result (non-overlapping buffers, any alignment), with streaming stores where the
// CPU has them (x86-64: SSE2); elsewhere std::memcpy.
void stream_copy(void* dst, const void* src, size_t bytes);

// std::memset(dst, 0, bytes)'s result, with streaming stores where the CPU has them.
void stream_zero(void* dst, size_t bytes);

}  // namespace rlf
