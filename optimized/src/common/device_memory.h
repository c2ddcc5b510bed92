// A caching device allocator owned by one backend: blocks are rounded up to a size class (powers
// of two from 512 bytes), returned to a free list when their last user lets go, and reused; the
// only cudaMalloc happens the first time a size class is needed. A Workspace is a growable
// scratch buffer on top of it (grown only when a step needs more than ever before).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace hybridtb::cuda {

class DeviceMemory {
 public:
  DeviceMemory();
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // A device block of at least `bytes` (256-byte aligned); the deleter returns it to the cache.
  std::shared_ptr<void> allocate(size_t bytes);

 private:
  struct Pool;
  std::shared_ptr<Pool> pool_;
};

// Scratch device memory that only grows, plus a pinned host mirror for uploads.
class Workspace {
 public:
  explicit Workspace(DeviceMemory& memory) : memory_(memory) {}
  // At least `bytes` of device memory (contents undefined).
  void* device(size_t bytes);

 private:
  DeviceMemory& memory_;
  std::shared_ptr<void> block_;
  size_t size_ = 0;
};

// Pinned host memory for one stream's uploads, filled in place by the caller. A pageable source
// makes a large cudaMemcpyAsync wait for the stream (the driver stages it synchronously), which would
// stall the host behind the GPU — and deadlock behind a benchmark's gate kernel; from pinned memory
// the copy is queued and the host goes on. The buffer is reused: acquire() first waits for the copy
// that read it last.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  // The buffer, at least `bytes` long (grown if needed, its contents then lost), for the caller to
  // fill, once the last copy out of it has finished.
  unsigned char* acquire(size_t bytes);
  // Enqueues the copy of the buffer's first `bytes` (≤ the last acquire's) to `device` on `stream`;
  // returns at once.
  void upload(void* device, size_t bytes, cudaStream_t stream);

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
  cudaEvent_t copied_ = nullptr;  // recorded after the last copy out of data_
};

}  // namespace hybridtb::cuda
