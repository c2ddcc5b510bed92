// The bookkeeping of dynamic shared-memory opt-ins (kernel_attributes.h); host-only, no CUDA.
#include "common/kernel_attributes.h"

#include <utility>

namespace hybridtb::cuda {

DynamicSmemOptIns::DynamicSmemOptIns(Raise raise) : raise_(std::move(raise)) {}

DynamicSmemOptIns::~DynamicSmemOptIns() {
  for (auto& head : buckets_) {
    for (Node* node = head.load(std::memory_order_relaxed); node != nullptr;) {
      Node* next = node->next;
      delete node;
      node = next;
    }
  }
}

DynamicSmemOptIns::Node* DynamicSmemOptIns::find(Node* head, const void* kernel, int device) {
  for (Node* node = head; node != nullptr; node = node->next) {
    if (node->kernel == kernel && node->device == device) return node;
  }
  return nullptr;
}

std::atomic<DynamicSmemOptIns::Node*>& DynamicSmemOptIns::bucket(const void* kernel, int device) {
  // Kernel entry points are at least 16-byte aligned: drop the low bits before mixing in the device.
  const auto bits = reinterpret_cast<size_t>(kernel) >> 4;
  return buckets_[(bits ^ (bits >> 7) ^ (static_cast<size_t>(device) * 31)) % kBuckets];
}

void DynamicSmemOptIns::allow(const void* kernel, int device, size_t bytes) {
  if (bytes <= kDefaultDynamicSmemBytes) return;
  std::atomic<Node*>& head = bucket(kernel, device);
  // Fast path: the acquire loads see a published node and the limit stored after its raise.
  if (const Node* node = find(head.load(std::memory_order_acquire), kernel, device);
      node != nullptr && node->bytes.load(std::memory_order_acquire) >= bytes) {
    return;
  }
  const std::lock_guard<std::mutex> lock(mutex_);
  Node* node = find(head.load(std::memory_order_relaxed), kernel, device);
  if (node != nullptr && node->bytes.load(std::memory_order_relaxed) >= bytes) return;  // raised meanwhile
  raise_(kernel, device, bytes);
  if (node != nullptr) {
    node->bytes.store(bytes, std::memory_order_release);
  } else {
    head.store(new Node{kernel, device, bytes, head.load(std::memory_order_relaxed)}, std::memory_order_release);
  }
}

}  // namespace hybridtb::cuda
