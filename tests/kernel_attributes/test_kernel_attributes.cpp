// DynamicSmemOptIns (kernel_attributes.h): the limit is raised once per (kernel, device), again on
// another device and for a larger size, never for a smaller one, and once however many threads ask
// at the same time; a failed raise is not recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/kernel_attributes.h"

namespace hybridtb::cuda {
namespace {

constexpr size_t kKiB = 1024;

// Stand-ins for kernels: only their addresses matter.
const int kKernelA = 0;
const int kKernelB = 0;

struct Call {
  const void* kernel;
  int device;
  size_t bytes;
  bool operator==(const Call& o) const { return kernel == o.kernel && device == o.device && bytes == o.bytes; }
};

// A raise that records its calls (thread safe: the table may be shared by threads).
struct Recorder {
  std::mutex mutex;
  std::vector<Call> calls;
  DynamicSmemOptIns::Raise raise() {
    return [this](const void* kernel, int device, size_t bytes) {
      const std::lock_guard<std::mutex> lock(mutex);
      calls.push_back({kernel, device, bytes});
    };
  }
};

TEST(DynamicSmemOptIns, NothingToRaiseUpToTheDefault48KiB) {
  Recorder rec;
  DynamicSmemOptIns opt_ins(rec.raise());
  opt_ins.allow(&kKernelA, 0, 0);
  opt_ins.allow(&kKernelA, 0, 1);
  opt_ins.allow(&kKernelA, 1, kDefaultDynamicSmemBytes);
  EXPECT_TRUE(rec.calls.empty());
  opt_ins.allow(&kKernelA, 0, kDefaultDynamicSmemBytes + 1);
  EXPECT_EQ(rec.calls, (std::vector<Call>{{&kKernelA, 0, kDefaultDynamicSmemBytes + 1}}));
}

TEST(DynamicSmemOptIns, OncePerKernelAndDevice) {
  Recorder rec;
  DynamicSmemOptIns opt_ins(rec.raise());
  for (int i = 0; i < 3; ++i) opt_ins.allow(&kKernelA, 0, 64 * kKiB);
  EXPECT_EQ(rec.calls, (std::vector<Call>{{&kKernelA, 0, 64 * kKiB}}));
  // Another device: its own opt-in (the failure this guards against: the second rank's GPU).
  for (int i = 0; i < 3; ++i) opt_ins.allow(&kKernelA, 1, 64 * kKiB);
  // Another kernel on a device already seen.
  for (int i = 0; i < 3; ++i) opt_ins.allow(&kKernelB, 0, 64 * kKiB);
  EXPECT_EQ(rec.calls,
            (std::vector<Call>{{&kKernelA, 0, 64 * kKiB}, {&kKernelA, 1, 64 * kKiB}, {&kKernelB, 0, 64 * kKiB}}));
}

TEST(DynamicSmemOptIns, AgainForMoreBytesNeverForFewer) {
  Recorder rec;
  DynamicSmemOptIns opt_ins(rec.raise());
  opt_ins.allow(&kKernelA, 3, 64 * kKiB);
  opt_ins.allow(&kKernelA, 3, 100 * kKiB);
  opt_ins.allow(&kKernelA, 3, 64 * kKiB);   // fits under 100 KiB: not lowered
  opt_ins.allow(&kKernelA, 3, 80 * kKiB);
  opt_ins.allow(&kKernelA, 3, 100 * kKiB);
  opt_ins.allow(&kKernelA, 3, 200 * kKiB);
  opt_ins.allow(&kKernelA, 2, 80 * kKiB);   // device 2 has not been raised at all
  EXPECT_EQ(rec.calls, (std::vector<Call>{{&kKernelA, 3, 64 * kKiB},
                                          {&kKernelA, 3, 100 * kKiB},
                                          {&kKernelA, 3, 200 * kKiB},
                                          {&kKernelA, 2, 80 * kKiB}}));
}

TEST(DynamicSmemOptIns, AFailedRaiseIsTriedAgain) {
  int attempts = 0;
  DynamicSmemOptIns opt_ins([&](const void*, int, size_t) {
    if (++attempts == 1) throw std::runtime_error("no such device");
  });
  EXPECT_THROW(opt_ins.allow(&kKernelA, 0, 64 * kKiB), std::runtime_error);
  opt_ins.allow(&kKernelA, 0, 64 * kKiB);
  opt_ins.allow(&kKernelA, 0, 64 * kKiB);
  EXPECT_EQ(attempts, 2);
}

// Many kernels (more than the table's buckets, so lists grow) on a few devices.
TEST(DynamicSmemOptIns, ManyKernelsEachRaisedOncePerDevice) {
  static const std::vector<int> kernels(500);
  Recorder rec;
  DynamicSmemOptIns opt_ins(rec.raise());
  for (int round = 0; round < 2; ++round) {
    for (int device = 0; device < 4; ++device) {
      for (const int& k : kernels) opt_ins.allow(&k, device, 64 * kKiB);
    }
  }
  EXPECT_EQ(rec.calls.size(), kernels.size() * 4);
}

// Threads (tensor-parallel ranks) asking at once, for the same and for different devices, with
// growing sizes: each (kernel, device, size) is raised at most once, every raise is larger than the
// one before it on that pair, and every pair ends at the largest size asked for.
TEST(DynamicSmemOptIns, ConcurrentThreadsRaiseEachPairOncePerLargerSize) {
  constexpr int kThreads = 8, kDevices = 2, kRounds = 200;
  static const std::vector<int> kernels(16);
  const std::vector<size_t> sizes = {64 * kKiB, 96 * kKiB, 128 * kKiB, 227 * kKiB};
  Recorder rec;
  DynamicSmemOptIns opt_ins(rec.raise());
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = sizes[std::min<size_t>(static_cast<size_t>(round / 50), sizes.size() - 1)];
        for (const int& k : kernels) opt_ins.allow(&k, (t + round) % kDevices, bytes);
      }
    });
  }
  for (auto& thread : threads) thread.join();

  std::map<std::pair<const void*, int>, size_t> last;
  for (const Call& call : rec.calls) {
    auto [it, inserted] = last.try_emplace({call.kernel, call.device}, call.bytes);
    if (!inserted) {
      EXPECT_GT(call.bytes, it->second) << "raised again without needing more";
      it->second = call.bytes;
    }
  }
  EXPECT_EQ(last.size(), kernels.size() * kDevices);
  for (const auto& [pair, bytes] : last) EXPECT_EQ(bytes, sizes.back());
  EXPECT_LE(rec.calls.size(), kernels.size() * kDevices * sizes.size());
}

}  // namespace
}  // namespace hybridtb::cuda
