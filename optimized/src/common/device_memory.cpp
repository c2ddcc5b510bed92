// The caching device allocator (see device_memory.h).
#include "common/device_memory.h"

#include <bit>
#include <cstring>

#include "common/cuda_check.h"

namespace hybridtb::cuda {

struct DeviceMemory::Pool {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_blocks;  // size class → cached blocks

  ~Pool() {
    for (auto& [size, blocks] : free_blocks) {
      for (void* block : blocks) cudaFree(block);  // NOLINT: a destructor cannot throw; best effort
    }
  }
};

namespace {
size_t size_class(size_t bytes) { return std::bit_ceil(bytes < 512 ? size_t{512} : bytes); }
}  // namespace

DeviceMemory::DeviceMemory() : pool_(std::make_shared<Pool>()) {}
DeviceMemory::~DeviceMemory() = default;

std::shared_ptr<void> DeviceMemory::allocate(size_t bytes) {
  const size_t size = size_class(bytes);
  void* block = nullptr;
  {
    const std::lock_guard<std::mutex> lock(pool_->mutex);
    auto it = pool_->free_blocks.find(size);
    if (it != pool_->free_blocks.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
    }
  }
  if (block == nullptr) {
    HYBRIDTB_CUDA_CHECK(cudaMalloc(&block, size));
  }
  std::shared_ptr<Pool> pool = pool_;  // the deleter keeps the pool alive
  return std::shared_ptr<void>(block, [pool, size](void* p) {
    const std::lock_guard<std::mutex> lock(pool->mutex);
    pool->free_blocks[size].push_back(p);
  });
}

void* Workspace::device(size_t bytes) {
  if (bytes > size_ || !block_) {
    block_ = memory_.allocate(bytes);
    size_ = size_class(bytes);
  }
  return block_.get();
}

PinnedStaging::~PinnedStaging() {
  if (copied_ != nullptr) {
    cudaEventSynchronize(copied_);  // NOLINT: best effort in a destructor
    cudaEventDestroy(copied_);
  }
  if (data_ != nullptr) cudaFreeHost(data_);  // NOLINT
}

unsigned char* PinnedStaging::acquire(size_t bytes) {
  if (copied_ == nullptr) {
    HYBRIDTB_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  } else {
    HYBRIDTB_CUDA_CHECK(cudaEventSynchronize(copied_));  // the last copy has read data_
  }
  if (bytes > size_) {
    if (data_ != nullptr) HYBRIDTB_CUDA_CHECK(cudaFreeHost(data_));
    data_ = nullptr;
    size_ = 0;
    HYBRIDTB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&data_), bytes, cudaHostAllocDefault));
    size_ = bytes;
  }
  return data_;
}

void PinnedStaging::upload(void* device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  HYBRIDTB_CHECK(bytes <= size_, "PinnedStaging::upload: ", bytes, " bytes from a buffer of ", size_);
  HYBRIDTB_CUDA_CHECK(cudaMemcpyAsync(device, data_, bytes, cudaMemcpyHostToDevice, stream));
  HYBRIDTB_CUDA_CHECK(cudaEventRecord(copied_, stream));
}

}  // namespace hybridtb::cuda
