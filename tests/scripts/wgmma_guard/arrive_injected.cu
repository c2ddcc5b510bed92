// The shape of the GDN state pass's MMA chain: a k loop whose exit depends on a runtime value, the
// accumulators pinned before the fence and after the wait. ptxas injects a warpgroup.arrive before
// each MMA (C7519) and serialises nothing: wgmma_guard_test.sh expects the guard to pass it.
// Compiled with -DWRITE_ACCUMULATOR_IN_DIVERGENT_PATH, an accumulator written between two MMAs by
// some threads only makes ptxas inject a wait for the MMAs before it (C7519 and C7517): each MMA
// then waits for the one before, and the test expects the guard to refuse it.
#include <cstdint>
__global__ void mma_chain(float* out, uint64_t a, uint64_t b, int steps) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("" : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])::"memory");
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (i >= steps) break;
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "l"(a + i), "l"(b + i));
#ifdef WRITE_ACCUMULATOR_IN_DIVERGENT_PATH
    if (threadIdx.x % 3 == 0) acc[0] += 1.0f;
#endif
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  asm volatile("" : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])::"memory");
  out[threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3];
}
