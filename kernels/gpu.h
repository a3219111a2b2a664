// The CUDA runtime as the rest of the program sees it: whether a GPU is usable (and why not),
// which device runs the kernels (--device cpu | cuda | auto), and the memory of CUDA arenas.
// Compiled in every build; without CUDA (no nvcc at configure time) the queries say so and the
// allocations throw ConfigError.
#pragma once

#include <cstddef>
#include <string>

#include "kernels/arena.h"
#include "kernels/ops.h"

namespace rlf {

bool built_with_cuda();

// Whether this process can run the CUDA kernels: a device is visible, its driver is recent
// enough for this runtime, and the build holds machine code for it. On false `reason` (if not
// null) gets the CUDA runtime's message (cudaGetErrorString), or says that the build has no
// CUDA. The first call selects the process's GPU: its local rank (OMPI_COMM_WORLD_LOCAL_RANK,
// SLURM_LOCALID, MPI_LOCALRANKID or PMI_LOCAL_RANK; 0 if none) modulo the visible devices.
// The answer is cached.
bool cuda_usable(std::string* reason = nullptr);

// "NVIDIA H200 (sm_90, 132 SMs, 139.81 GiB, device 0 of 1), CUDA runtime 13.0, driver 13.0";
// empty when no GPU is usable.
std::string cuda_device_description();

// The device's free and total memory (0, 0 when no GPU is usable).
void cuda_memory_info(size_t* free_bytes, size_t* total_bytes);

// The kernels a --device choice runs: "cpu" -> cpu_backend (cpu or ref kernels); "cuda" ->
// Backend::Cuda, or ConfigError naming the reason (the CUDA runtime's message, or a build
// without CUDA); "auto" -> Backend::Cuda when usable, else cpu_backend with `note` saying why.
// Any other name is a ConfigError. `note` (if not null) gets one line for the log.
Backend choose_device(const std::string& device, Backend cpu_backend, std::string* note = nullptr);

// Memory of the CUDA arena kinds. Managed allocations larger than the device's free memory are
// refused (OutOfDeviceMemory) rather than oversubscribed.
void* cuda_alloc_managed(size_t bytes, const std::string& what);
void* cuda_alloc_pinned(size_t bytes, const std::string& what);
void cuda_free(void* p, MemoryKind kind);
// Plain device memory (cudaMalloc: host code must not touch it), for benchmarks.
void* cuda_alloc_device(size_t bytes, const std::string& what);
void cuda_free_device(void* p);

// Zeroes `bytes` at p, memory of an arena of `kind`. Managed memory is zeroed on the GPU
// (cudaMemset, waited for): a host memset would migrate its pages to the host, and the next
// kernel would migrate them back (a step of the `small` model zeroes its 111 MB of gradients).
// Host and pinned memory: std::memset.
void zero_memory(void* p, size_t bytes, MemoryKind kind);

// zero_memory for a large buffer that is not read again soon: on the host with streaming stores
// (stream_zero in kernels/streaming_copy.h: memset's stores read each line first, so it moves two
// bytes a byte zeroed; on this VM 11-12 GB/s zeroed at 106-212 MiB against 21-23).
void zero_memory_streaming(void* p, size_t bytes, MemoryKind kind);

// memcpy for any pair of host, pinned, managed or device pointers: cudaMemcpy where either side
// is CUDA memory (DMA instead of page faults on managed memory), std::memcpy otherwise.
void copy_bytes(void* dst, const void* src, size_t bytes);

// copy_bytes for a large buffer that is not read again soon (offloaded optimizer state): between
// host buffers with streaming stores (stream_copy in kernels/streaming_copy.h), past the caches.
void copy_bytes_streaming(void* dst, const void* src, size_t bytes);

}  // namespace rlf
