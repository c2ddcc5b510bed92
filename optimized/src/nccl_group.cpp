// Tensor-parallel groups over NCCL, one rank per GPU (nccl_group.h).
#include "nccl_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_check.h"
#include "hybridtb/error.h"
#include "hybridtb/tensor_parallel_group.h"

namespace hybridtb::cuda {
namespace {

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) throw Error(detail::concat(what, " failed: ", ncclGetErrorString(status)));
}

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    default: throw Error(detail::concat("tensor parallel: NCCL sums float tensors, got ", to_string(dtype)));
  }
}

// One rank's communicator. The ranks' communicators were created together (ncclCommInitAll), and
// each is destroyed with its rank's handle, unless it was aborted.
//
// abort(): when another rank fails, this rank may be waiting for it inside NCCL: in ncclAllReduce
// itself (the first collective connects the ranks, exchanging with each peer) or on the device (the
// all-reduce kernel waits for the peers' data, and the rank's thread in a synchronize behind it).
// ncclCommAbort releases both: it raises the communicator's abort flag, which NCCL's host-side
// waits and its kernels poll (they quit early), then frees the communicator and its resources
// without synchronising with the other ranks; a watchdog thread calling it while another thread is
// blocked in a collective is how NCCL applications recover from a stuck peer. What it guarantees:
// once it returns, no work of this communicator waits any more; the interrupted collectives'
// results are undefined and a call in progress may return an error. What it does not: NCCL calls
// on one communicator are not thread-safe, so a call that races with the free may read freed
// memory. Hence this rank makes no NCCL call once aborted_ is set (all_reduce_sum_on_stream throws
// TensorParallelAborted, the destructor destroys nothing: ncclCommAbort freed the communicator),
// and only a collective already past that check when abort() runs is left to the abort flag.
class NcclRank final : public TensorParallelGroup {
 public:
  NcclRank(ncclComm_t comm, int64_t size, int64_t rank) : comm_(comm), size_(size), rank_(rank) {}
  ~NcclRank() override {
    // NOLINTNEXTLINE: best effort in a destructor
    if (!aborted_.load(std::memory_order_acquire)) ncclCommDestroy(comm_);
  }
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;

  int64_t size() const override { return size_; }
  int64_t rank() const override { return rank_; }
  void all_reduce_sum(const TensorView& values) override {
    throw Error(detail::concat("tensor parallel: the NCCL group of rank ", rank_, " sums device tensors, got ",
                               values.describe()));
  }
  bool sums_device_tensors() const override { return true; }
  void all_reduce_sum_on_stream(const TensorView& values, void* stream) override {
    HYBRIDTB_CHECK(values.device() == Device::kCuda && values.is_contiguous(),
                   "tensor parallel: NCCL sums contiguous CUDA tensors, got ", values.describe());
    if (aborted_.load(std::memory_order_acquire)) {
      throw TensorParallelAborted(
          detail::concat("tensor parallel: the NCCL group of rank ", rank_, " was aborted: another rank failed"));
    }
    const ncclResult_t status = ncclAllReduce(values.data(), values.data(), static_cast<size_t>(values.numel()),
                                              nccl_dtype(values.dtype()), ncclSum, comm_,
                                              static_cast<cudaStream_t>(stream));
    if (status != ncclSuccess && aborted_.load(std::memory_order_acquire)) {
      throw TensorParallelAborted(detail::concat("tensor parallel: ncclAllReduce of rank ", rank_,
                                                 " was aborted (another rank failed): ", ncclGetErrorString(status)));
    }
    check_nccl(status, "ncclAllReduce");
  }
  // From any thread, any number of times: the first call aborts the communicator (see above).
  void abort() override {
    if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
    ncclCommAbort(comm_);  // NOLINT: best effort; the failed rank's own error is the one reported
  }

 private:
  ncclComm_t comm_;
  int64_t size_;
  int64_t rank_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

BackendRegistry::RankPlacement place_ranks_on_gpus(int64_t size) {
  HYBRIDTB_CHECK(size >= 1, "tensor parallel: a group needs at least one rank, got ", size);
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count < size) {
    throw NotSupported(detail::concat("cuda backend: ", size, " ranks need ", size, " GPUs, one each; this process sees ",
                                      status == cudaSuccess ? count : 0, " (CUDA_VISIBLE_DEVICES names them)"));
  }
  std::vector<int> devices;
  for (int d = 0; d < static_cast<int>(size); ++d) devices.push_back(d);
  std::vector<ncclComm_t> comms(devices.size());
  check_nccl(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  BackendRegistry::RankPlacement placement;
  for (int64_t r = 0; r < size; ++r) {
    placement.groups.push_back(std::make_shared<NcclRank>(comms[static_cast<size_t>(r)], size, r));
  }
  placement.on_rank_thread = [](int64_t rank) { HYBRIDTB_CUDA_CHECK(cudaSetDevice(static_cast<int>(rank))); };
  placement.description = detail::concat("NCCL ", NCCL_MAJOR, ".", NCCL_MINOR, ".", NCCL_PATCH,
                                         ", one rank per GPU: GPUs 0-", size - 1);
  return placement;
}

}  // namespace hybridtb::cuda
