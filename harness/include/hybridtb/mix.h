// The mix grammar of `hybridtb gen`: one line that says what a serving-engine step schedules,
// e.g. "d64@4k+c1x512@8k+p2x2k" (64 decodes at context 4096, a 512-token chunk continuing a
// request at context 8192, two fresh prefills of 2048). Documented in datasets/GENERATING.md;
// checked by tests/gen/test_mix.cpp.
//
//   mix   := term ('+' term)*          (spaces around terms are ignored)
//   term  := 'd' N '@' C               N decodes (query_len 1) at context C
//          | 'p' N 'x' L               N fresh prefills of L tokens (context 0)
//          | 'c' N 'x' L '@' C         N chunks of L tokens continuing requests at context C ≥ 1
//          | 's' N 'x' K '@' C         N speculative decodes of K = 1 + drafts tokens (K ≥ 2) at context C
//   N     := digits                    ≥ 1
//   L, K, C := digits ['k' | 'K']      'k' multiplies by 1024
//
// Requests come out in vLLM's order whatever order the terms were written in: decodes and
// speculative decodes first, then chunks (extends), then fresh prefills; within a class, the
// order written (a stable sort, as vLLM's reorder).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hybridtb/synthetic.h"

namespace hybridtb {

enum class MixKind : uint8_t {
  kDecode,      // dN@C
  kSpecDecode,  // sNxK@C
  kChunk,       // cNxL@C
  kPrefill,     // pNxL
};

struct MixTerm {
  MixKind kind = MixKind::kDecode;
  int64_t count = 1;        // N requests
  int64_t query_len = 1;    // tokens per request this step (1, K or L)
  int64_t context_len = 0;  // tokens already cached per request (0 for prefills)

  bool operator==(const MixTerm&) const = default;
};

struct Mix {
  std::vector<MixTerm> terms;  // in vLLM's order (decodes, chunks, prefills)

  bool operator==(const Mix&) const = default;
  int64_t num_requests() const;
  int64_t num_tokens() const;
  bool decode_only() const;                   // only plain decodes (dN@C)
  int64_t max_speculative_query_len() const;  // largest K of the s-terms, 0 if none
};

// Parses a mix. Throws Error naming the mix, the term (its number and text) and the character
// position (1-based) of the problem, e.g.
//   mix 'd64@4k+p2y': term 2 'p2y' at character 10: expected 'x' after the count of a prefill term (pNxL)
Mix parse_mix(std::string_view text);

// The canonical form: terms in normalised order joined by '+', lengths and contexts that are
// multiples of 1024 written with 'k' ("d64@4k"). parse_mix(to_string(m)) == m, and to_string is
// a fixed point: the canonical form of a canonical string is itself. Safe in file names.
std::string to_string(const Mix& mix);
std::string to_string(const MixTerm& term);

// The requests of a mix, one per request in order. Speculative decodes get num_accepted_tokens = K
// (every draft of the previous step accepted); callers may draw other values in [1, K].
std::vector<RequestSpec> mix_requests(const Mix& mix);

}  // namespace hybridtb
