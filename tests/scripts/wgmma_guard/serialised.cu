// ptxas serialises these warpgroup MMAs (C7515: the accumulators' zeros are defined by ordinary
// instructions the MMAs' pipeline cannot follow); wgmma_guard_test.sh expects the guard to refuse it.
#include <cstdint>
__global__ void serialised(float* out, uint64_t a, uint64_t b, int steps) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int i = 0; i < steps; ++i) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "l"(a), "l"(b));
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
}
