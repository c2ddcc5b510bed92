// The ranks of one process on host memory (tensor_parallel_group.h).
#include "hybridtb/tensor_parallel_group.h"

#include <algorithm>
#include <vector>

#include "hybridtb/error.h"

namespace hybridtb {

TensorParallelGroup& rank_group_of(const AttentionConfig& config, TensorParallelGroup* group) {
  HYBRIDTB_CHECK(group != nullptr, "ssm_mode ", config.ssm_mode, " of a tensor-parallel rank file (tp_rank ",
                 config.tp_rank, " of tp_size ", config.tp_size, ") needs the other ranks' partial sums at its ",
                 "all-reduce points: run the ", config.tp_size, " rank files together (hybridtb tp)");
  HYBRIDTB_CHECK(group->size() == config.tp_size && group->rank() == config.tp_rank, "the tensor-parallel group is rank ",
                 group->rank(), " of ", group->size(), ", but /config says tp_rank ", config.tp_rank, " of tp_size ",
                 config.tp_size);
  return *group;
}

void TensorParallelGroup::all_reduce_sum_on_stream(const TensorView& values, void* /*stream*/) {
  throw Error(detail::concat("tensor parallel: this group sums host tensors only, got ", values.describe()));
}

class HostThreadGroup::Rank final : public TensorParallelGroup {
 public:
  Rank(HostThreadGroup& group, int64_t rank) : group_(group), rank_(rank) {}
  int64_t size() const override { return group_.size(); }
  int64_t rank() const override { return rank_; }
  void all_reduce_sum(const TensorView& values) override { group_.sum_into(rank_, values); }
  void abort() override { group_.abort(); }

 private:
  HostThreadGroup& group_;
  const int64_t rank_;
};

HostThreadGroup::HostThreadGroup(int64_t size) : size_(size), deposited_(static_cast<size_t>(size)) {
  HYBRIDTB_CHECK(size >= 1, "a tensor-parallel group needs at least one rank, got ", size);
}

std::shared_ptr<TensorParallelGroup> HostThreadGroup::rank(int64_t r) {
  HYBRIDTB_CHECK(r >= 0 && r < size_, "rank ", r, " is outside the tensor-parallel group of ", size_, " ranks");
  return std::make_shared<Rank>(*this, r);
}

void HostThreadGroup::abort() {
  const std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

void HostThreadGroup::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw TensorParallelAborted("tensor parallel: another rank of the group failed");
  const uint64_t generation = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (aborted_) throw TensorParallelAborted("tensor parallel: another rank of the group failed");
}

namespace {

template <typename T>
void sum_in_rank_order(const std::vector<TensorView>& parts, std::vector<T>& sum) {
  for (size_t i = 0; i < sum.size(); ++i) {
    T acc = static_cast<const T*>(parts[0].data())[i];
    for (size_t r = 1; r < parts.size(); ++r) acc += static_cast<const T*>(parts[r].data())[i];
    sum[i] = acc;
  }
}

}  // namespace

void HostThreadGroup::sum_into(int64_t r, const TensorView& values) {
  HYBRIDTB_CHECK(values.device() == Device::kHost && values.is_contiguous() &&
                     (values.dtype() == DType::kFloat64 || values.dtype() == DType::kFloat32),
                 "tensor parallel: the host all-reduce sums contiguous host float32/float64 tensors, got ",
                 values.describe());
  // Every rank shows its tensor (barrier), forms the sum of all of them, reading only (barrier), and
  // overwrites its own: no rank writes a tensor while another reads it, and the next all-reduce's
  // tensors are shown only after every read of this one.
  deposited_[static_cast<size_t>(r)] = values;
  arrive_and_wait();
  for (int64_t other = 0; other < size_; ++other) {
    const TensorView& part = deposited_[static_cast<size_t>(other)];
    HYBRIDTB_CHECK(part.dtype() == values.dtype() && part.shape() == values.shape(), "tensor parallel: rank ", other,
                   " all-reduces ", part.describe(), " where rank ", r, " all-reduces ", values.describe());
  }
  const auto n = static_cast<size_t>(values.numel());
  std::vector<double> sum64;
  std::vector<float> sum32;
  if (values.dtype() == DType::kFloat64) {
    sum64.resize(n);
    sum_in_rank_order(deposited_, sum64);
  } else {
    sum32.resize(n);
    sum_in_rank_order(deposited_, sum32);
  }
  arrive_and_wait();
  if (values.dtype() == DType::kFloat64) {
    std::copy(sum64.begin(), sum64.end(), static_cast<double*>(values.data()));
  } else {
    std::copy(sum32.begin(), sum32.end(), static_cast<float*>(values.data()));
  }
}

}  // namespace hybridtb
