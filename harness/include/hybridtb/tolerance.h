// The one tolerance table of hybridtb. Every comparison of floating-point results in the tests
// and the parity tools takes its tolerance from here; none is written inline.
//
// Each entry is derived from the unit roundoff u of the arithmetic involved (u = 2^-(p) for a
// p-bit significand incl. the hidden bit, i.e. half the spacing of numbers in [1, 2)) and the
// length n of the longest reduction, using the standard forward-error bound for a sum of n terms,
// γ_n = n·u / (1 − n·u) (Higham, "Accuracy and Stability of Numerical Algorithms", §3.1), scaled by
// the magnitude of the terms. A comparison passes when |a − b| ≤ atol + rtol·|b| elementwise.
#pragma once

#include <cstdint>
#include <string>

#include "hybridtb/config.h"
#include "hybridtb/dtype.h"

namespace hybridtb {

struct Tolerance {
  double atol = 0.0;
  double rtol = 0.0;
  std::string rationale;  // the derivation, printed with every parity report
  bool allows(double actual, double expected) const;
};

// Unit roundoff of a floating dtype: float64 2^-53, float32 2^-24, float16 2^-11, bfloat16 2^-8,
// fp8 e4m3 2^-4, fp8 e5m2 2^-3.
double unit_roundoff(DType dtype);

// γ_n for `dtype` (throws Error if n·u ≥ 1, where the bound is meaningless).
double gamma_n(DType dtype, int64_t n);

// Which computation is being compared — the rows of the table.
enum class ToleranceCase {
  // Two float64 evaluations of the same attention output (e.g. the reference against an
  // independently written naive formula, or paged against contiguous order). Each output element
  // is a softmax-weighted average: a dot product of length head_size feeds each logit and a sum of
  // `n` = number of visible keys feeds numerator and denominator. Both sides round differently, so
  // the difference is bounded by 2·(γ_D·|s|·… ) ≲ 2·γ_{n + D}·(1 + max|logit|)·max|v|; inputs are
  // O(1) and logits O(10), so we use atol = rtol = 2·γ_{n+D}(float64)·32.
  kAttentionFloat64,
  // Two float64 evaluations of the mamba1 SSM mode (the reference's chunk scan or single-step
  // update against an independently written token-by-token loop, split against one-shot prefill,
  // or a tensor-parallel group's joined ranks — x_proj and out_proj as sums of the ranks' partial
  // sums — against the unsharded layer): contribution rows and both states. Per token the mode is a fixed chain of about
  // eight stages (in_proj, conv, x_proj, dt_proj, softplus/exp/silu, the state update, h·C,
  // out_proj), each a sum of at most m = max(H, I, R + 2N) terms, so each stage is within
  // γ_m·Σ|terms|. The decay exp(Δ·A) is in (0, 1], so an error made in the state at one step is
  // never amplified later: over n steps they add, giving γ_{n+m} times the magnitude factor. With
  // the specs' initialisation (projections normal(0, 1/sqrt(fan_in)), |Δ| ≲ 1) every stage is
  // O(1) and Σ|terms|/|result| ≲ sqrt(m) per stage; 64 covers that ratio over the chain (the
  // tests see errors below 2·γ_{n+m} itself), and the two sides together contribute twice:
  // atol = rtol = 2·γ_{n+m}(float64)·64.
  kMamba1Float64,
  // Two float64 evaluations of one SSM mode's per-request recurrence, for ANY registered mode (the
  // generic suite, tests/ssm): chunked prefill + decode steps against one-shot prefill, prefix
  // states against the states of mamba_cache_mode all, or a simple mode against a naive loop.
  // n = tokens the recurrence ran; m = the longest sum inside one token's update (the generic
  // suite uses the largest dimension of H and of the mode's tensors). A mode's per-token update
  // is a short chain of sums of ≤ m terms, each within γ_m·Σ|terms|, and the suite requires the
  // state update to be non-expanding (decay ≤ 1: running sums, EMAs, Mamba's exp(Δ·A)), so errors
  // made at one step are passed on, never amplified: over n steps they add, giving γ_{n+m} times
  // a magnitude factor. 1024 covers Σ|terms|/|result| compounded over the chain (generous: the
  // mode is not known; mamba1's own row, with its specs' initialisation, needs 64);
  // a running sum additionally carries Σ|x_j| ≤ 8·n for n O(1) terms (|x| < 8); the two sides
  // contribute twice: atol = rtol = 2·γ_{n+m}(float64)·(1024 + 8·n).
  kSsmModeFloat64,
};

// `reduction_length` is n (visible keys) and `inner_length` is the dot-product length (head size);
// for kMamba1Float64, n = tokens the recurrence ran and the inner length is max(H, I, R + 2N).
// For kSsmModeFloat64, n = tokens the recurrence ran and the inner length is m (above).
Tolerance tolerance_for(ToleranceCase which, int64_t reduction_length, int64_t inner_length);

// --- parity: a backend's step results against the expected (reference) ones ----------------------
// The rows `hybridtb parity` / `replay` use, keyed by the output, the model dtype, the KV-cache
// dtype and the candidate's output dtype (compare.h fills the key from the batch). Notation:
// u_out = u(candidate output dtype), u_m = u(model dtype), n = reduction length, D = head size.
// Data magnitudes are those of O(1) (standard-normal-like) inputs: |v| ≤ V = 6, |logit| ≤ Λ = 32, and scale·‖q∘k‖₂ ≤ Λ₂ = 1 (exactly the normalisation a
// softmax scale of D^-1/2 gives unit-rms data). Each row states its derivation in `rationale`.
//
// float64 candidate (the reference against itself or any float64 implementation): the float64
// rows of tolerance_for (kAttentionFloat64 for attention, kSsmModeFloat64 for the SSM contribution
// and pools; the fused output gets their sum). Deterministic code gives zero error.
//
// Attention output, float32/float16/bfloat16 candidate (a kernel that computes in float32):
//   e32   = (2γ_n + 2γ_L·Λ + 2·2^-22·(2 + Λ))(float32)·V     fp32 sums of n keys, dot of D, __expf/exp2
//           (the positive-weight sums are within γ_n relative, so o = Σp·v/Σp is within
//           2γ_n·V; a logit error δ ≤ γ_L·Λ + the exp error moves o by ≤ 2δ·V). L = D for a float32
//           model (SIMT dots, IEEE round-to-nearest). L = 3·D for a 16-bit model, which may run on the
//           tensor-core prefill path (mma.sync m16n8k16, float32 accumulation): the products of 16-bit
//           inputs are exact, but each k-step adds its 16 products and the accumulator in one fused
//           operation that aligns the 17 addends to the largest exponent and truncates (Fasi, Higham,
//           Mikaitis & Pranesh 2021, "Numerical behavior of NVIDIA tensor cores"), so a k-step errs by
//           ≤ 17·2u·max|addend| ≤ 34u·Σ|addends|; over D/16 k-steps ≤ 34u·(D/16)·Σ|q_i k_i| =
//           2.125·D·u·Σ|q_i k_i| ≤ γ_{3D}·Σ|q_i k_i| (Σ|q_i k_i|·scale bounded by Λ as in the SIMT row).
//   e_P   = (u_m + n·η_m·2^-16)·V  when the model dtype is 16-bit (η_m its smallest subnormal:
//           float16 2^-24, bfloat16 2^-133): P (or P·v_scale for per-token-head) is rounded to the
//           value dtype before P·V (vLLM's Triton kernel; our tensor-core prefill path), while the
//           denominator l = Σp is summed from the unrounded float32 p. Per term |p̃ − p| ≤ u_m·p in the
//           normal range plus ≤ η_m/2 below it, so |Σp̃·v − Σp·v| / Σp ≤ u_m·V + n·(η_m/2)·V / Σp.
//           Rescaling: a tile's p is taken against the running max at that time and later multiplied
//           by α = 2^{m_old − m_new} ≤ 1 (float32, in e32): the relative u_m survives unchanged and the
//           absolute η_m/2 only shrinks. The tensor-core kernel rounds P·2^15 ∈ [0, 2^15] (exact
//           power of two, cancels in o = Σp·v/Σp; float16 max 65504), so after the final rescale the
//           row's largest term is 2^15 and Σp ≥ 2^15: n·(η_m/2)/2^15 = n·η_m·2^-16 — negligible for
//           n ≤ 2^20 (a kernel rounding unscaled p ∈ [0, 1] to float16 needs n·2^-25·V instead).
//           (float32 models: no rounding of P; a kernel using TF32 must use the float16 row.)
//           Per-token-head caches on the tensor-core kernels round p·v_scale (as vLLM 0.33 does),
//           against the raw int8/fp8 value |r| ≤ 448: per term ≤ u_m·p·|v| (in u_m·V) plus
//           ≤ (η/2)·|r| below the normal range of the type P rounds to. float16 keeps P ∈ [0, 2^6]
//           so that p·v_scale stays finite (a v scale is at most 65504/127 ≈ 516: p·v_scale ≤
//           2^6·516 < 65504), which adds n·(η/2)·448·2^-6 with η = 2^-24 for a float16 model; a
//           bfloat16 model's v scales have no such bound, so its per-token-head caches keep P in
//           bfloat16 on every kernel, P ∈ [0, 2^15] (η = 2^-133: nothing measurable).
//   e_KV  = u_m·V + 2·λ·u_m·Λ₂·V  for fp8 per-tensor KV with a 16-bit model: the dequantised K and V
//           are re-rounded to the model dtype. V: a convex combination of values each within u_m·V.
//           K: the logit error Σ_i scale·q_i·k_i·ε_i (|ε_i| ≤ u_m) is bounded with the probabilistic
//           model of Higham & Mary (2019; independent mean-zero roundings, Hoeffding) by λ·u_m·Λ₂,
//           λ = 6 (failure probability ≤ 2e^-18 per logit); the worst-case bound u_m·Σ|q k| is ~√D
//           looser than what any kernel shows. (Our tensor-core kernels cast the stored fp8 to the
//           model dtype exactly and apply the per-tensor scales in float32: within this term. The
//           Hopper prefill kernel with plain logits and the tensor-core decode run both products on
//           float16 operands instead, but for a bfloat16 model's per-token-head caches
//           (byte_cache_float16_products):
//           fp8 is exact in float16, P rounds to float16 (u = 2^-11 < u_m: within e_P), and a
//           bfloat16 Q row is scaled by a power of two so that its largest element lies in
//           [2^14, 2^15) — exact but for elements below 2^-28 of that one, which err by at most
//           2^-39 of it: a logit error ≤ 2^-39·max|q|·Σ|k_i|·scale ≤ 2^-39·D·max|q|·max|k|·scale,
//           about 2^-32 of the logit scale at D 128, far inside e32's γ_3D term.)
//           Per-token-head KV casts the raw int8/fp8 exactly (to the model dtype) and applies the
//           scale in float32 (no extra term;
//           the V scale is in e_P).
//   atol  = e32 + e_P + e_KV + u_out·2^-6 (outputs near zero), rtol = u_out (the final store).
// fp8 output (output_scale set): the stored value is e4m3(clamp(o / s)); the reference stores the
// unrounded clamp: rtol = u(e4m3) = 2^-4, atol = 2^-10 (half the e4m3 subnormal spacing) +
// (e32 + e_P + e_KV)/s_min with s_min = 0.25, the smallest output_scale hybridtb generates.
// SSM contribution and pools, float32 kernel: the kSsmModeFloat64 chain argument in float32 — a
// per-token chain of sums of ≤ m terms, errors adding (never growing, decay ≤ 1) over the n tokens
// of this step: γ_{n+m}(float32)·(64 + 8·N) with 64 the chain's magnitude ratio (mamba1 with its
// specs' initialisation) and 8·N the magnitude of a running-sum state after N = max seq_len tokens
// of |x| < 8; rtol adds u_out (contribution stored in the output dtype) or u_pool (state stored in
// the pool's dtype). A mode with a larger magnitude ratio needs its own row.
// SSM contribution and pools of a Mamba-2 chunked prefill with 16-bit operands (the cuda backend's
// BackendSettings::ssm_prefill_operands model; ParityKey::ssm_operand_dtype = the model dtype, u_m
// its unit roundoff): the float32 row above (the float32 sums, decays and chain are unchanged) plus
//   e16 = 2λ·u_m·√m        (contribution: a linear layer's y, or the branch's after norm and out_proj)
//   e16 = 2√2·λ·u_m        (states)
// with λ = 6 (the probabilistic model of Higham & Mary 2019, as e_KV). Each product's operands are
// rounded once to the model dtype before a float32-accumulated product (x, B, C; the decayed
// weights M = C·Bᵀ∘exp(Λ_t − Λ_s)·Δ_s, the weighted x of the chunk states, the state entering a
// chunk), so each term of an output's expansion
//   y_t[p] = Σ_{n, s ≤ t} C_t[n]·B_s[n]·w_ts·x_s[p] + Σ_n C_t[n]·e^{Λ_t}·H[p, n],  w_ts = e^{Λ_t − Λ_s}·Δ_s
// carries ≤ 4 relative roundings of ≤ u_m (C and B in C·Bᵀ, M, x; or w·x and B in the chunk state,
// the entering state and C in C·H), and each term w_ts·x_s[p]·B_s[n] of a state ≤ 2. Modelled as
// independent and mean zero, the roundings' effect is, with probability ≥ 1 − 2e^{−λ²/2}
// (Hoeffding), ≤ λ·u_m·‖coefficients‖₂ ≤ λ·u_m·√4·‖terms‖₂: relative per term, not growing with
// the reduction length (≤ L = 128 tokens of a chunk, N or P: the sums themselves are float32, their
// error is the float32 row's), and an error made in a chunk's state is passed on by decays ≤ 1,
// never amplified. Magnitudes: grouped by rounded value (C_t[n] is shared by all s, its coefficient
// is C_t[n] times the state's element), ‖terms of y_t[p]‖₂ = √N·rms_n(C_t[n]·S[p, n]) (S: the
// state, its x·B part and the entering one). We assume rms_n(C_t[n]·S[p, n]) ≤ r_C·r_S ≤ 1 (r_C,
// r_S: the rms of a row of C and of a state row, independent data) and N ≤ m (m = the key's inner
// length, the largest dimension, ≥ the state size). The generated data satisfy it: C = silu(conv)
// of unit-variance conv outputs has rms ≈ 0.6; the initial states are standard normal (rms 1,
// decayed by ≤ 1); the x·B part of a state is a decay-weighted sum of rms(x·B) ≈ 0.36 terms with
// Σ_s w_ts ≤ 1/|A| + max Δ (w_ts ≤ (1 + |A|·Δ_s)·∫ over Δ_s of e^{−|A|τ}) ≤ 3 (A ≤ −1 as A_log ≥ 0;
// Δ = softplus(dt + dt_bias) < 2 for dt_bias < −2.25 and |dt| < 4), so its rms is
// ≤ 0.36·√(max w·Σ_s w) ≤ 0.9 and r_C·r_S ≤ 0.6·√(1 + 0.9²) ≈ 0.8. The branch's gated RMSNorm
// divides each group by its rms, so y's error enters relative to y's rms (2λ·u_m·√N·r_C·r_S over
// y's rms √N·r_C·r_S), and out_proj's rows have unit norm (normal(0, 1/√d_ssm)), which keeps that
// relative error on an O(1) contribution: within the same 2λ·u_m·√m. A state element is a sum
// over s alone: ‖(w_ts·x_s[p]·B_s[n])_s‖₂ ≤ 0.36·√(max w·Σ_s w) ≤ 1, taken as 2 for the peaks of
// single tokens: 2·√2·λ·u_m. (A deterministic worst case, 4u_m·Σ|terms| with Σ|terms| ≈
// N·E|C|·E|state| ≈ N/2, would be ≈ 1 for bfloat16 at N = 128, and the float32 row's magnitude
// factor (64 + 8N) times u_m is ≥ 1 for any N at u_m = 2^-8: both vacuous.)
// rtol as the float32 row (the store).
// The same for a Gated DeltaNet chunked prefill (ParityKey::ssm_mode gdn; chunk C = 64 tokens, head
// dims dk, dv ≤ 128): the float32 row plus
//   e16 = √8·λ·u_m·√m      (contribution: a linear layer's o, or the branch's after norm and out_proj)
//   e16 = √6·λ·u_m·12      (states)
// Rounded operands (gdn_prefill.cu): q̂ and k̂ (in k̂·k̂ᵀ, q̂·k̂ᵀ, the state update, the read-out), P,
// the in-chunk inverse T = (I + A)^-1 and the right-hand sides diag(β)·V and diag(β·e^G)·K (in
// U = T·diag(β)·V and W = T·diag(β·e^G)·K, as fla's recompute_w_u), W, the entering state M (in W·Mᵀ
// and, as h_c, in the read-out), V_new (in P·V_new) and V_new·decay (in the state update); T itself
// (computed from the exact A of the rounded keys), the gates and decays, U, the state carried across
// chunks and every sum stay float32. In a chunk's read-out
//   o_t[v] = Σ_{j ≤ t, c} Γ_tj·q̂_t[c]·k̂_j[c]·V_new_j[v] + e^{G_t}·Σ_c q̂_t[c]·M[v, c],
//   V_new_j[v] = U_j[v] − Σ_c W_j[c]·M[v, c],
// a term of V_new carries ≤ 4 roundings of ≤ u_m (U's: T, β·v; W·Mᵀ's: T, β·e^G·k̂, W, M; A's exact
// keys count as those terms' k̂ rounding), so a read-out term through P·V_new carries ≤ 8 (q̂, k̂,
// P, V_new and V_new's 4), a read-out term through the entering state 2; a state element's terms
// k̂_j[c]·(V_new_j·e^{G_n − G_j})[v] carry ≤ 6 (k̂, V_new·decay and V_new's 4). With the
// probabilistic model above the effect is ≤ λ·u_m·√8·‖terms‖₂ (states ≤ λ·u_m·√6·‖terms‖₂),
// relative per term and not growing with the reduction lengths (the chunk's 64 tokens, dk, dv: the
// sums themselves are float32, the float32 row). Errors carried through the chunk-state recurrence
// are not amplified: per token the state is multiplied by α·(I − β·k̂·k̂ᵀ), α = e^g ≤ 1, whose norm
// is ≤ 1 when β ∈ [0, 2] and ‖k̂‖ = 1 (its eigenvalues are α·(1 − β) along k̂ and α across it); the
// generated data have β = sigmoid(b) ∈ (0, 1) and L2-normalised k̂ (‖k̂‖ ≤ 1 with fla's 1e-6), so
// every chunk's transition Φ_c (their product) has norm ≤ 1. The entering state's re-rounding in
// W·Mᵀ acts only through the removal part e^{G_n}·I − Φ_c (norm ≤ 2), and what it adds is then
// passed on by the later Φ's: the errors of successive chunks add (in quadrature, independent),
// each decayed, none amplified.
// Magnitudes, for independent directions (|k̂_j[c]| ≈ dk^-1/2) and r_S, r_V the rms of a state row
// and of V_new_j = β_j·(v_j − M·k̂_j): GDN's L2-normalised q̂ (‖q̂‖₂ = dk^-1/2: normalised, times
// dk^-1/2) and k̂ (‖k̂‖₂ = 1) keep the coefficients small — |P_tj| ≤ dk^-1/2, ‖W_j‖ ≤ β_j ≤ 1 (W's
// rows are the in-chunk delta rule applied to β·e^G·k̂: (I − S⁽⁰⁾)·k̂ with ‖I − S⁽⁰⁾‖ ≤ 1). A state
// element's chunk terms and the V_new errors they carry give √(C/dk)·√(r_V² + r_S²), and the decays
// of the generated data (A_log ∈ [0, log 16), dt_bias ≥ −6.9: per chunk e^{G_n} ≤ e^{−0.1} for the
// slowest head) sum the chunks' errors in quadrature to ≤ √(1/(1 − e^{−0.2})) ≈ 2.3 of one chunk's:
//   states:  ‖terms‖₂ ≲ 2.3·√(C/dk)·√(r_V² + r_S²) ≤ 12 at dk ≥ 6 (7.4 at dk ≥ 16);
//   o_t[v]:  ‖terms‖₂ ≲ dk^-1/2·√(r_S² + C·(r_V² + r_S²)/dk + c²), c the state's (12 at dk = 6),
// with r_S ≤ 1 (standard-normal initial states; the delta rule moves a row's component along k̂
// toward v and α ≤ 1 shrinks it) and r_V ≤ √(0.6² + 1) ≈ 1.2 (v = silu of unit-variance conv
// outputs, rms ≈ 0.6; β < 1). That is ≤ 5.4 at dk = 6 and ≤ 2.1 at dk ≥ 16: ≤ √m, as every GDN
// layer has m ≥ conv_dim = 2·Hk·dk + Hv·dv ≥ 64. The branch's gated RMSNorm divides by o's rms
// (≈ r_S·dk^-1/2 per head), leaving √(r_S² + C·(r_V² + r_S²)/dk + c²)/r_S ≤ 8.1 at dk ≥ 16 on
// out_proj's unit-norm rows: ≤ √m for m ≥ 66 (the hybrid layers' in_proj_qkvz alone has
// conv_dim + Hv·dv rows). At dk = 6 (the odd-size cases) it is ≈ 13 against √m = √128 ≈ 11.3:
// the normalised contribution exceeds the assumption by ≈ 1.2×, inside the λ = 6 tail's margin
// but not covered by this argument. These are estimates for independent directions, not worst
// cases (keys all on one axis would give √C for √(C/dk)). A float64 emulation of the cuda
// prefill's roundings on such data (tests/ssm_gdn/gdn_operand_rounding_test.cpp: dk = dv = 128,
// 32, 16 and 6 × 10, bfloat16 and float16 operands, three chunks) stays below 4% of e16 for the
// contribution and 2% for the states.
// Fused output: attention row + SSM row (o = a + s, then one store: rtol = u_out + SSM rtol).
// KV cache and per-token-head scale caches: bit-exact (tolerance 0): the write is a deterministic
// quantisation (reshape_and_cache_flash) that every correct backend reproduces exactly.
enum class Quantity : uint8_t {
  kOutput,       // fused output [T, Hq, D]
  kAttnOutput,   // attention alone [T, Hq, D]
  kSsmOutput,    // SSM contribution [T, Hq, D]
  kKvCache,      // [NB, 2, BS, Hkv, D] after the write
  kScaleCache,   // k/v_scale_cache [NB, BS, Hkv] after the write
  kSsmState,     // a state pool [S, ...] after the step
};
std::string_view to_string(Quantity quantity);

struct ParityKey {
  Quantity quantity = Quantity::kOutput;
  DType model_dtype = DType::kBFloat16;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  DType candidate_dtype = DType::kFloat64;  // the candidate's stored dtype for this quantity
  DType compute_dtype = DType::kFloat32;    // the candidate's arithmetic: float64 selects the float64 rows
  bool fp8_output = false;                  // output_scale set (decoder fp8 output)
  int64_t reduction_length = 1;  // attention: max seq_len + 1 (a sink); SSM: max query_len (tokens scanned)
  int64_t inner_length = 1;      // attention: head size; SSM: m = largest dimension of H, pools, weights
  int64_t history_length = 0;    // SSM: max seq_len (tokens summarised by a state)
  // SSM: the dtype the chunked prefill's product operands are rounded to: float32 (float32-accurate
  // products, the float32 row) or the 16-bit model dtype (ssm_prefill_operands model: the
  // 16-bit-operand row above). Ignored for float64 candidates and for attention quantities.
  DType ssm_operand_dtype = DType::kFloat32;
  // SSM: the layer's ssm_mode (AttentionConfig::ssm_mode); "gdn" takes the Gated DeltaNet terms of
  // the 16-bit-operand row, any other mode the Mamba-2 ones.
  std::string ssm_mode;
};
Tolerance parity_tolerance(const ParityKey& key);
// The fused output of a layer with an SSM branch: the attention row plus the SSM row (atol and rtol
// add: o = a + s, each part within its own bound).
Tolerance fused_parity_tolerance(const ParityKey& attention_key, const ParityKey& ssm_key);

}  // namespace hybridtb
