// gemm_rows (gemm_rows.h): row-major projections as one column-major cuBLAS GEMM.
#include "ssm/gemm_rows.h"

#include "ssm/ssm_kernels.h"

namespace hybridtb::cuda::ssm {
namespace {

cudaDataType_t cuda_type(ElementKind kind) {
  switch (kind) {
    case ElementKind::kFloat16:
      return CUDA_R_16F;
    case ElementKind::kBFloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

void gemm_rows(const GpuStep& step, float* out, int64_t rows, int64_t out_cols, const void* x, ElementKind x_kind,
               int64_t ldx, int64_t k, const WeightRef& w, const char* what) {
  if (rows == 0 || out_cols == 0) return;
  SsmContext& context = *step.context;
  const void* a = w.data;
  ElementKind a_kind = w.kind;
  const void* b = x;
  ElementKind b_kind = x_kind;
  int64_t ldb = ldx;
  if (a_kind != b_kind) {  // widen both to float32, exactly
    if (a_kind != ElementKind::kFloat32) {
      float* wide = step.scratch_of<float>(out_cols * k);
      launch_to_float(a, a_kind, wide, out_cols * k, context.stream());
      a = wide;
      a_kind = ElementKind::kFloat32;
    }
    if (b_kind != ElementKind::kFloat32) {
      float* wide = step.scratch_of<float>(rows * k);
      launch_rows_to_float(RowsRef{const_cast<void*>(b), b_kind, ldx}, k, rows, wide, context.stream());
      b = wide;
      b_kind = ElementKind::kFloat32;
      ldb = k;
    }
  }
  const float one = 1.0f;
  const float zero = 0.0f;
  const cublasComputeType_t compute =
      a_kind == ElementKind::kFloat32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
  // Row-major C[rows, out] = X·W^T is column-major C^T[out, rows] = W^T(op T of W's [k, out] view)·X^T.
  check_cublas(cublasGemmEx(context.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out_cols),
                            static_cast<int>(rows), static_cast<int>(k), &one, a, cuda_type(a_kind), static_cast<int>(k),
                            b, cuda_type(b_kind), static_cast<int>(ldb), &zero, out, CUDA_R_32F,
                            static_cast<int>(out_cols), compute, CUBLAS_GEMM_DEFAULT),
               what);
}

}  // namespace hybridtb::cuda::ssm
