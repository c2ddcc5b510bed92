// The parity rows of the tolerance table (tolerance.h, parity_tolerance): positive, monotone in
// the reduction length and in the dtype's unit roundoff, explained, and sharp at their edge; and
// the progress bar's line. Run: ctest -L compare.
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "hybridtb/error.h"
#include "hybridtb/tolerance.h"
#include "progress.h"

namespace hybridtb {
namespace {

ParityKey key(Quantity q, DType dtype, KvCacheDtype kv, int64_t n, int64_t inner = 128) {
  ParityKey k;
  k.quantity = q;
  k.model_dtype = dtype == DType::kFloat64 ? DType::kFloat32 : dtype;
  k.kv_cache_dtype = kv;
  k.candidate_dtype = dtype;
  k.compute_dtype = dtype == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32;
  k.reduction_length = n;
  k.inner_length = inner;
  k.history_length = n;
  return k;
}

const DType kDtypesByRoundoff[] = {DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const KvCacheDtype kKvDtypes[] = {KvCacheDtype::kAuto, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2,
                                  KvCacheDtype::kInt8PerTokenHead, KvCacheDtype::kFp8PerTokenHead};
const Quantity kFloatQuantities[] = {Quantity::kAttnOutput, Quantity::kOutput, Quantity::kSsmOutput,
                                     Quantity::kSsmState};

TEST(ParityTolerance, PositiveExplainedAndMonotone) {
  for (const Quantity q : kFloatQuantities) {
    for (const KvCacheDtype kv : kKvDtypes) {
      double previous_atol = 0, previous_rtol = 0;
      for (const DType dtype : kDtypesByRoundoff) {
        SCOPED_TRACE(detail::concat(to_string(q), " ", to_string(kv), " ", to_string(dtype)));
        const Tolerance short_t = parity_tolerance(key(q, dtype, kv, 16));
        const Tolerance long_t = parity_tolerance(key(q, dtype, kv, 4096));
        EXPECT_GT(short_t.atol, 0.0);
        EXPECT_GT(short_t.rtol, 0.0);
        EXPECT_FALSE(short_t.rationale.empty());
        EXPECT_GT(long_t.atol, short_t.atol) << "monotone in the reduction length";
        EXPECT_GE(long_t.rtol, short_t.rtol);
        // Monotone in the unit roundoff: the error allowed at |expected| = 1 grows strictly (the
        // SSM rows' atol is the float32 kernel's for every stored dtype; their rtol carries the store).
        EXPECT_GE(long_t.atol, previous_atol);
        EXPECT_GT(long_t.atol + long_t.rtol, previous_atol + previous_rtol) << "monotone in the unit roundoff";
        previous_atol = long_t.atol;
        previous_rtol = long_t.rtol;
      }
    }
  }
}

TEST(ParityTolerance, FusedIsTheSumAndFp8OutputIsLooser) {
  const ParityKey a = key(Quantity::kOutput, DType::kBFloat16, KvCacheDtype::kAuto, 512);
  const ParityKey s = key(Quantity::kSsmOutput, DType::kBFloat16, KvCacheDtype::kAuto, 512);
  const Tolerance fused = fused_parity_tolerance(a, s);
  EXPECT_DOUBLE_EQ(fused.atol, parity_tolerance(a).atol + parity_tolerance(s).atol);
  EXPECT_DOUBLE_EQ(fused.rtol, parity_tolerance(a).rtol + parity_tolerance(s).rtol);
  ParityKey fp8 = a;
  fp8.fp8_output = true;
  EXPECT_GT(parity_tolerance(fp8).atol, parity_tolerance(a).atol);
  EXPECT_EQ(parity_tolerance(fp8).rtol, std::ldexp(1.0, -4));
  // fp8 KV adds the dequantisation term; per-token-head does not.
  EXPECT_GT(parity_tolerance(key(Quantity::kAttnOutput, DType::kBFloat16, KvCacheDtype::kFp8E4M3, 512)).atol,
            parity_tolerance(key(Quantity::kAttnOutput, DType::kBFloat16, KvCacheDtype::kInt8PerTokenHead, 512)).atol);
  // float16 with per-token-head caches keeps P ∈ [0, 2^6] on the tensor-core kernels, which adds
  // n·(η/2)·448·2^-6 for float16's subnormals (η = 2^-24); bfloat16 (P in bfloat16, its v scales
  // unbounded by float16) adds nothing.
  const int64_t n = 4096;
  const double term = static_cast<double>(n) * std::ldexp(1.0, -25) * 448.0 * std::ldexp(1.0, -6);
  for (const KvCacheDtype kv : {KvCacheDtype::kInt8PerTokenHead, KvCacheDtype::kFp8PerTokenHead}) {
    EXPECT_NEAR(parity_tolerance(key(Quantity::kAttnOutput, DType::kFloat16, kv, n)).atol -
                    parity_tolerance(key(Quantity::kAttnOutput, DType::kFloat16, KvCacheDtype::kAuto, n)).atol,
                term, 1e-9 * term);
    EXPECT_DOUBLE_EQ(parity_tolerance(key(Quantity::kAttnOutput, DType::kBFloat16, kv, n)).atol,
                     parity_tolerance(key(Quantity::kAttnOutput, DType::kBFloat16, KvCacheDtype::kAuto, n)).atol);
  }
  // Sanity against vLLM's own bf16 test tolerance (atol 1.5e-2): same order of magnitude.
  const double bf16 = parity_tolerance(key(Quantity::kAttnOutput, DType::kBFloat16, KvCacheDtype::kAuto, 2048)).atol;
  EXPECT_GT(bf16, 1.5e-3);
  EXPECT_LT(bf16, 1.5e-1);
}

// The 16-bit rows carry the tensor-core prefill terms (tolerance.h: e32 with the truncating mma dot
// of length 3·D, e_P = (u_m + n·η_m·2^-16)·V for P rounded to the model dtype); float32 rows do not.
TEST(ParityTolerance, TensorCorePrefillTermsIn16BitRows) {
  const int64_t n = 8193;
  const int64_t d = 128;
  const double V = 6.0;
  const double u32 = std::ldexp(1.0, -24);
  const auto gamma32 = [&](int64_t len) {
    const double l = static_cast<double>(len);
    return l * u32 / (1 - l * u32);
  };
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    const Tolerance t = parity_tolerance(key(Quantity::kAttnOutput, dtype, KvCacheDtype::kAuto, n, d));
    const double u_m = unit_roundoff(dtype);
    const double eta = dtype == DType::kFloat16 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -133);
    const double e32 = (2 * gamma32(n) + 2 * gamma32(3 * d) * 32 + 2 * std::ldexp(1.0, -22) * 34) * V;
    const double e_p = (u_m + n * eta * std::ldexp(1.0, -16)) * V;
    EXPECT_NEAR(t.atol, e32 + e_p + u_m * std::ldexp(1.0, -6), 1e-12);
    EXPECT_NE(t.rationale.find("γ_{3D}"), std::string::npos) << t.rationale;
    EXPECT_NE(t.rationale.find("e_P"), std::string::npos) << t.rationale;
    // The P rounding alone (one u_m·V shift of an output) is inside the row, with room for e32.
    EXPECT_TRUE(t.allows(1.0 / 1024 + u_m * V, 1.0 / 1024));
  }
  // float32 models never round P and never take the mma path: plain γ_D, no e_P.
  const Tolerance f32 = parity_tolerance(key(Quantity::kAttnOutput, DType::kFloat32, KvCacheDtype::kAuto, n, d));
  const double e32 = (2 * gamma32(n) + 2 * gamma32(d) * 32 + 2 * std::ldexp(1.0, -22) * 34) * V;
  EXPECT_NEAR(f32.atol, e32 + u32 * std::ldexp(1.0, -6), 1e-12);
  EXPECT_EQ(f32.rationale.find("e_P"), std::string::npos) << f32.rationale;
}

// The SSM row of a Mamba-2 prefill with 16-bit product operands (tolerance.h): the float32 row plus
// e16 = 2·6·u_m·√m for the contribution, 2√2·6·u_m for the states; the float32-operand keys and
// float64 candidates are unchanged; the added term is meaningful (well below O(1) values) where the
// float32 row's chain factor at u_m would not be.
TEST(ParityTolerance, SsmSixteenBitOperandRow) {
  const int64_t n = 700;
  const int64_t m = 128;
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(to_string(dtype));
    const double u_m = unit_roundoff(dtype);
    for (const Quantity q : {Quantity::kSsmOutput, Quantity::kSsmState}) {
      SCOPED_TRACE(to_string(q));
      const ParityKey f32 = key(q, dtype, KvCacheDtype::kAuto, n, m);
      ParityKey f16 = f32;
      f16.ssm_operand_dtype = dtype;
      const Tolerance base = parity_tolerance(f32);
      const Tolerance t = parity_tolerance(f16);
      const double e16 = q == Quantity::kSsmState ? 2.0 * std::sqrt(2.0) * 6.0 * u_m
                                                  : 2.0 * 6.0 * u_m * std::sqrt(static_cast<double>(m));
      EXPECT_NEAR(t.atol, base.atol + e16, 1e-15);
      EXPECT_DOUBLE_EQ(t.rtol, base.rtol);
      EXPECT_NE(t.rationale.find("e16"), std::string::npos) << t.rationale;
      EXPECT_EQ(base.rationale.find("e16"), std::string::npos) << base.rationale;
      // float32 operands named explicitly: the float32 row.
      ParityKey explicit32 = f32;
      explicit32.ssm_operand_dtype = DType::kFloat32;
      EXPECT_DOUBLE_EQ(parity_tolerance(explicit32).atol, base.atol);
      // A float64 candidate keeps the float64 rows whatever the operand setting says.
      ParityKey f64 = key(q, DType::kFloat64, KvCacheDtype::kAuto, n, m);
      const double f64_atol = parity_tolerance(f64).atol;
      f64.ssm_operand_dtype = dtype;
      EXPECT_DOUBLE_EQ(parity_tolerance(f64).atol, f64_atol);
      // Meaningful: the added term is bfloat16 0.53 and float16 0.066 for the contribution at
      // m = 128 (O(1) data), where the float32 row's magnitude factor 64 + 8N times u_m exceeds 1.
      EXPECT_LT(t.atol - base.atol, dtype == DType::kBFloat16 ? 0.6 : 0.075);
      EXPECT_GT(u_m * (64.0 + 8.0 * static_cast<double>(n)), 1.0);
    }
    // Monotone in m for the contribution; the states' term does not depend on it.
    ParityKey small = key(Quantity::kSsmOutput, dtype, KvCacheDtype::kAuto, n, 32);
    ParityKey large = key(Quantity::kSsmOutput, dtype, KvCacheDtype::kAuto, n, 512);
    small.ssm_operand_dtype = large.ssm_operand_dtype = dtype;
    EXPECT_LT(parity_tolerance(small).atol, parity_tolerance(large).atol);
  }
  // bfloat16's row is looser than float16's (u 2^-8 against 2^-11).
  ParityKey bf = key(Quantity::kSsmOutput, DType::kBFloat16, KvCacheDtype::kAuto, n, m);
  ParityKey fp = key(Quantity::kSsmOutput, DType::kFloat16, KvCacheDtype::kAuto, n, m);
  bf.ssm_operand_dtype = DType::kBFloat16;
  fp.ssm_operand_dtype = DType::kFloat16;
  EXPECT_GT(parity_tolerance(bf).atol, parity_tolerance(fp).atol);
}

// The Gated DeltaNet terms of the 16-bit-operand SSM row (tolerance.h): ParityKey::ssm_mode gdn adds
// e16 = √8·6·u_m·√m to the contribution and √6·6·12·u_m to the states; other modes keep the Mamba-2
// terms; float32 operands and float64 candidates keep their rows whatever the mode.
TEST(ParityTolerance, SsmSixteenBitOperandGdnTerms) {
  const int64_t n = 1001;
  for (const int64_t m : {int64_t{64}, int64_t{128}, int64_t{640}}) {
    for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(to_string(dtype)) + " m " + std::to_string(m));
      const double u_m = unit_roundoff(dtype);
      for (const Quantity q : {Quantity::kSsmOutput, Quantity::kSsmState}) {
        SCOPED_TRACE(to_string(q));
        ParityKey f32 = key(q, dtype, KvCacheDtype::kAuto, n, m);
        f32.ssm_mode = "gdn";
        ParityKey gdn = f32;
        gdn.ssm_operand_dtype = dtype;
        ParityKey mamba2 = gdn;
        mamba2.ssm_mode = "mamba2";
        const Tolerance base = parity_tolerance(f32);
        const Tolerance t = parity_tolerance(gdn);
        const bool state = q == Quantity::kSsmState;
        const double e16 =
            state ? std::sqrt(6.0) * 6.0 * 12.0 * u_m : std::sqrt(8.0) * 6.0 * u_m * std::sqrt(static_cast<double>(m));
        EXPECT_NEAR(t.atol, base.atol + e16, 1e-15);
        EXPECT_DOUBLE_EQ(t.rtol, base.rtol);
        EXPECT_NE(t.rationale.find("gdn"), std::string::npos) << t.rationale;
        EXPECT_EQ(base.rationale.find("e16"), std::string::npos) << base.rationale;
        // The Mamba-2 terms for any other mode: 8 roundings against 4 (√8 against 2), states √6·12
        // against 2√2.
        const double mamba2_e16 = parity_tolerance(mamba2).atol - base.atol;
        EXPECT_EQ(parity_tolerance(mamba2).rationale.find("gdn"), std::string::npos);
        EXPECT_NEAR(mamba2_e16, state ? 2.0 * std::sqrt(2.0) * 6.0 * u_m
                                      : 2.0 * 6.0 * u_m * std::sqrt(static_cast<double>(m)),
                    1e-15);
        EXPECT_GT(t.atol - base.atol, mamba2_e16);
        // A float64 candidate keeps its row.
        ParityKey f64 = key(q, DType::kFloat64, KvCacheDtype::kAuto, n, m);
        const double f64_atol = parity_tolerance(f64).atol;
        f64.ssm_mode = "gdn";
        f64.ssm_operand_dtype = dtype;
        EXPECT_DOUBLE_EQ(parity_tolerance(f64).atol, f64_atol);
      }
    }
  }
  // Sizes: the contribution's term at m = 128 is bfloat16 0.75, float16 0.094; the states' 0.69
  // and 0.086 — below O(1) values, where the float32 row's magnitude factor times u_m is not.
  ParityKey out = key(Quantity::kSsmOutput, DType::kBFloat16, KvCacheDtype::kAuto, n, 128);
  out.ssm_mode = "gdn";
  const double out_base = parity_tolerance(out).atol;
  out.ssm_operand_dtype = DType::kBFloat16;
  EXPECT_LT(parity_tolerance(out).atol - out_base, 0.76);
  ParityKey st = key(Quantity::kSsmState, DType::kFloat16, KvCacheDtype::kAuto, n, 128);
  st.ssm_mode = "gdn";
  const double st_base = parity_tolerance(st).atol;
  st.ssm_operand_dtype = DType::kFloat16;
  EXPECT_LT(parity_tolerance(st).atol - st_base, 0.087);
}

TEST(ParityTolerance, KvCacheIsExact) {
  for (const DType dtype : kDtypesByRoundoff) {
    const Tolerance t = parity_tolerance(key(Quantity::kKvCache, dtype, KvCacheDtype::kFp8E4M3, 100));
    EXPECT_EQ(t.atol, 0.0);
    EXPECT_EQ(t.rtol, 0.0);
    EXPECT_FALSE(t.rationale.empty());
    EXPECT_TRUE(t.allows(0.5, 0.5));
    EXPECT_FALSE(t.allows(std::nextafter(0.5, 1.0), 0.5));
  }
}

TEST(ParityTolerance, JustInsidePassesJustOutsideFails) {
  for (const DType dtype : kDtypesByRoundoff) {
    const Tolerance t = parity_tolerance(key(Quantity::kAttnOutput, dtype, KvCacheDtype::kAuto, 300));
    const double expected = 1.0 / 1024;  // small, so that 1e-3 of a float64 allowance is representable
    const double allowed = t.atol + t.rtol * expected;
    EXPECT_TRUE(t.allows(expected + allowed * (1 - 1e-3), expected)) << to_string(dtype);
    EXPECT_TRUE(t.allows(expected - allowed * (1 - 1e-3), expected)) << to_string(dtype);
    EXPECT_FALSE(t.allows(expected + allowed * (1 + 1e-3), expected)) << to_string(dtype);
    EXPECT_FALSE(t.allows(expected - allowed * (1 + 1e-3), expected)) << to_string(dtype);
  }
}

TEST(ProgressBar, LineShowsCountsElapsedEtaAndLabel) {
  const std::string line = cli::ProgressBar::format_line(3, 12, 1.5, "a.h5", 8);
  EXPECT_EQ(line, "[##......] 3/12  1.5s  ETA 4.5s  a.h5");
  EXPECT_EQ(cli::ProgressBar::format_line(12, 12, 2.0, "", 4), "[####] 12/12  2.0s");
  // Not a terminal: every call is a no-op (nothing to observe but no crash).
  cli::ProgressBar bar(2, true, stderr);
  bar.update(1, "x");
  bar.clear();
}

// The ETA of a step's stage: the work fraction, not the token count, and the stage's own time.
// A quarter of the tokens of a causal prefill hold about a sixteenth of its work.
TEST(ProgressBar, EtaFollowsTheWorkFractionAndTheStageTime) {
  // 1/16 of the work in 2 s of the stage (10 s since the start, reading included): 30 s to go.
  EXPECT_EQ(cli::ProgressBar::format_line(256, 1024, 10.0, "attention", 4, 1.0 / 16, 2.0),
            "[#...] 256/1024  10.0s  ETA 30.0s  attention");
  // Without a stage time, the whole elapsed time is extrapolated.
  EXPECT_EQ(cli::ProgressBar::format_line(256, 1024, 10.0, "", 4, 0.5), "[#...] 256/1024  10.0s  ETA 10.0s");
}

// On a terminal the last state is redrawn about once a second while no update comes, so the
// elapsed time keeps moving through a long stretch of work without a count; an update made in the
// first second (not drawn then) is drawn by the ticker once the second has passed.
TEST(ProgressBar, TerminalBarTicksThroughAStretchWithoutUpdates) {
  int master = -1;
  int slave = -1;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0);
  std::FILE* terminal = fdopen(slave, "w");
  ASSERT_NE(terminal, nullptr);
  {
    cli::ProgressBar bar(10, true, terminal);
    bar.update(3, "ssm branch");
    std::this_thread::sleep_for(std::chrono::milliseconds(3400));
  }
  std::fclose(terminal);
  std::string text;
  char buffer[4096];
  for (pollfd ready{master, POLLIN, 0}; poll(&ready, 1, 100) > 0 && (ready.revents & POLLIN) != 0;) {
    const ssize_t n = read(master, buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  close(master);
  std::set<std::string> elapsed;
  const std::regex drawing(R"(\] 3/10  ([0-9.]+)s  ETA [0-9.]+s  ssm branch)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), drawing); it != std::sregex_iterator(); ++it) {
    elapsed.insert((*it)[1]);
  }
  EXPECT_GE(elapsed.size(), 2u) << text;
  EXPECT_LE(elapsed.size(), 4u) << "about once a second: " << text;
}

// A forced bar (--progress) on a stream that is not a terminal writes one line per drawing and
// always the last count, however fast the updates come.
TEST(ProgressBar, ForcedBarWritesLinesToAFile) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  {
    cli::ProgressBar bar(100, true, file, /*forced=*/true);
    for (int64_t i = 0; i <= 100; ++i) bar.update(i, "x");
  }
  std::rewind(file);
  std::string text;
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text += static_cast<char>(c);
  std::fclose(file);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find("] 0/100  "), 25u) << text;                 // the first update, at once, first
  EXPECT_NE(text.find("] 100/100  "), std::string::npos) << text;  // the last, though throttled
  EXPECT_LT(std::count(text.begin(), text.end(), '\n'), 10) << "updates within 0.1 s are throttled";
  // Disabled (--quiet) wins over forced.
  std::FILE* quiet = std::tmpfile();
  cli::ProgressBar silent(10, false, quiet, true);
  silent.update(10, "x");
  EXPECT_EQ(std::ftell(quiet), 0);
  std::fclose(quiet);
}

}  // namespace
}  // namespace hybridtb
