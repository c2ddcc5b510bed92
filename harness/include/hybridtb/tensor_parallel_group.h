// The ranks of a tensor-parallel group, as a backend running one rank's shard of a layer meets them:
// the all-reduces of its SSM branch (mamba1: after x_proj and after out_proj, vLLM's
// RowParallelLinear). A backend gets its rank's group through BackendSettings::tp_group; a rank file
// (/config tp_size > 1) whose branch needs the others is refused without one.
//
// Implementations: HostThreadGroup (below), the ranks of one process on host memory, one thread per
// rank. A group that reaches device memory itself (NCCL) says so (sums_device_tensors) and sums on the
// backend's stream; with any other group a GPU backend stages its tensors through host memory.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "hybridtb/config.h"
#include "hybridtb/error.h"
#include "hybridtb/tensor.h"

namespace hybridtb {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int64_t size() const = 0;
  virtual int64_t rank() const = 0;
  // Replaces `values` (contiguous, host memory) on every rank by the sum over the ranks of their
  // `values`, in place. Every rank calls it with the same dtype and shape, in the same order; all ranks
  // get the same bits.
  virtual void all_reduce_sum(const TensorView& values) = 0;
  // Whether the group sums tensors in a GPU backend's memory (all_reduce_sum_on_stream). Default: no.
  virtual bool sums_device_tensors() const { return false; }
  // As all_reduce_sum for contiguous device tensors, enqueued on `stream` (the backend's
  // cudaStream_t), without waiting; capturable in a CUDA graph. Default: Error (no device sums).
  virtual void all_reduce_sum_on_stream(const TensorView& values, void* stream);
  // Makes this rank's pending and later collectives give up because another rank failed: a rank
  // waiting in one (or in a stream synchronize behind one) is released, and a later one throws
  // TensorParallelAborted instead of waiting for ranks that will never arrive. Called once, from
  // the thread of the rank that failed (another rank's thread, while this rank may be inside a
  // collective); the results of the collectives it interrupts are undefined. Default: nothing (a
  // group whose collectives cannot wait forever).
  virtual void abort() {}
};

// What a rank's all-reduce throws when another rank of its group failed (abort()): the rank stops
// because of the other, whose own error is the one to report.
class TensorParallelAborted : public Error {
 public:
  using Error::Error;
};

// The group a tensor-parallel rank's SSM branch meets the others through: `group`, checked to be
// the rank of /config (tp_rank of tp_size). Error naming the rank when there is none (a rank file run
// alone) or it is another rank's.
TensorParallelGroup& rank_group_of(const AttentionConfig& config, TensorParallelGroup* group);

// The ranks of one process, one thread each, summing contiguous host float32/float64 tensors.
// The sum is formed in rank order ((v0 + v1) + v2) + …, in the tensor's dtype, by every rank alike,
// so every rank gets the same bits and a rerun the same result. A rank that fails calls abort() (or
// any rank handle's abort()): the others then leave their all-reduce with TensorParallelAborted
// instead of waiting for it forever.
class HostThreadGroup {
 public:
  explicit HostThreadGroup(int64_t size);
  // Rank r's handle (r in [0, size)); shares this group, which must outlive it.
  std::shared_ptr<TensorParallelGroup> rank(int64_t r);
  int64_t size() const { return size_; }
  void abort();

 private:
  class Rank;
  // Waits until every rank has arrived (a reusable barrier); throws TensorParallelAborted once
  // abort() was called.
  void arrive_and_wait();
  void sum_into(int64_t r, const TensorView& values);

  const int64_t size_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int64_t waiting_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<TensorView> deposited_;  // each rank's tensor of the all-reduce in progress
};

}  // namespace hybridtb
