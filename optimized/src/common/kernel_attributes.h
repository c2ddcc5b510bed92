// Kernel attributes that belong to a device: the opt-in to more than 48 KiB of dynamic shared
// memory (cudaFuncAttributeMaxDynamicSharedMemorySize) is a property of the kernel in one device's
// context, so a process that launches the same kernel on several devices (tensor-parallel ranks,
// one thread per GPU) must raise it on each of them.
//
//   allow_dynamic_smem(kernel, bytes)  before a launch with `bytes` of dynamic shared memory: raises
//                                      the kernel's limit on the current device where needed
//                                      (kernel_attributes_cuda.cpp, in the cuda backend)
//   DynamicSmemOptIns                  its bookkeeping, host-only (kernel_attributes.cpp): which
//                                      (kernel, device) pairs still need raising to `bytes`
//   current_compute_capability()       the current device's, which decides the code it can run
//                                      (the wgmma prefill's sm_90a code: 9.0 only)
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>

namespace hybridtb::cuda {

// The dynamic shared memory every kernel may use without an opt-in.
constexpr size_t kDefaultDynamicSmemBytes = 48 * 1024;

// Raises `kernel`'s dynamic shared-memory limit to at least `bytes` on the current device, the first
// time a launch there needs it (nothing at ≤ 48 KiB; again when a later launch needs more). Thread
// safe; after the first call per (kernel, device, size) it costs a lookup and no lock. Throws
// hybridtb::Error on a CUDA failure (nothing is recorded then, so the next launch tries again).
void allow_dynamic_smem(const void* kernel, size_t bytes);

template <typename... Args>
void allow_dynamic_smem(void (*kernel)(Args...), size_t bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// The compute capability of the calling thread's current device (kernel_attributes_cuda.cpp).
struct ComputeCapability {
  int major = 0;
  int minor = 0;
  bool is_hopper() const { return major == 9 && minor == 0; }  // sm_90a code runs here only
};
ComputeCapability current_compute_capability();

// Which (kernel, device) pairs have had their limit raised, and to how much; calls `raise` for a
// pair whose recorded limit is below the size asked for, then records the new size. The limit is
// never lowered (a smaller launch fits under a larger limit). Lookups of recorded pairs are lock
// free (buckets of append-only lists whose nodes are published with release stores); raising
// takes a mutex, so that `raise` runs once per (kernel, device, larger size) however many threads
// ask at once. `raise` may throw: the pair is then not recorded.
class DynamicSmemOptIns {
 public:
  using Raise = std::function<void(const void* kernel, int device, size_t bytes)>;

  explicit DynamicSmemOptIns(Raise raise);
  ~DynamicSmemOptIns();
  DynamicSmemOptIns(const DynamicSmemOptIns&) = delete;
  DynamicSmemOptIns& operator=(const DynamicSmemOptIns&) = delete;

  // Makes sure `kernel` may use `bytes` of dynamic shared memory on `device`.
  void allow(const void* kernel, int device, size_t bytes);

 private:
  struct Node {
    const void* kernel;
    int device;
    std::atomic<size_t> bytes;  // the limit raised to; only grows
    Node* next;                 // immutable once the node is published
  };
  static constexpr size_t kBuckets = 64;

  static Node* find(Node* head, const void* kernel, int device);
  std::atomic<Node*>& bucket(const void* kernel, int device);

  Raise raise_;
  std::mutex mutex_;  // serialises raising and publishing
  std::array<std::atomic<Node*>, kBuckets> buckets_{};
};

}  // namespace hybridtb::cuda
