// The mix grammar of `hybridtb gen` (harness/include/hybridtb/mix.h): hand-written request lists,
// the canonical form and its round trip, vLLM's decode-first order, and errors that name the term
// and the character.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridtb/error.h"
#include "hybridtb/mix.h"

namespace hybridtb {
namespace {

using ::testing::HasSubstr;

MixTerm term(MixKind kind, int64_t count, int64_t query_len, int64_t context_len) {
  return {.kind = kind, .count = count, .query_len = query_len, .context_len = context_len};
}

TEST(Mix, SingleTermsParseToTheirRequests) {
  EXPECT_EQ(parse_mix("d64@4096").terms, std::vector<MixTerm>{term(MixKind::kDecode, 64, 1, 4096)});
  EXPECT_EQ(parse_mix("d64@4k").terms, std::vector<MixTerm>{term(MixKind::kDecode, 64, 1, 4096)});
  EXPECT_EQ(parse_mix("p2x2048").terms, std::vector<MixTerm>{term(MixKind::kPrefill, 2, 2048, 0)});
  EXPECT_EQ(parse_mix("c1x512@8K").terms, std::vector<MixTerm>{term(MixKind::kChunk, 1, 512, 8192)});
  EXPECT_EQ(parse_mix("s8x4@2048").terms, std::vector<MixTerm>{term(MixKind::kSpecDecode, 8, 4, 2048)});
  EXPECT_EQ(parse_mix("d1@0").terms, std::vector<MixTerm>{term(MixKind::kDecode, 1, 1, 0)});
}

TEST(Mix, RequestListsByHand) {
  const std::vector<RequestSpec> r = mix_requests(parse_mix("p1x3+d2@10+s1x3@7+c1x5@20"));
  ASSERT_EQ(r.size(), 5u);
  // decodes (d then s, as written), then the chunk, then the prefill
  EXPECT_EQ(r[0].context_len, 10);
  EXPECT_EQ(r[0].query_len, 1);
  EXPECT_EQ(r[0].num_accepted_tokens, 0);
  EXPECT_EQ(r[1].context_len, 10);
  EXPECT_EQ(r[2].context_len, 7);
  EXPECT_EQ(r[2].query_len, 3);
  EXPECT_EQ(r[2].num_accepted_tokens, 3);
  EXPECT_EQ(r[3].context_len, 20);
  EXPECT_EQ(r[3].query_len, 5);
  EXPECT_EQ(r[4].context_len, 0);
  EXPECT_EQ(r[4].query_len, 3);
  const Mix m = parse_mix("p1x3+d2@10+s1x3@7+c1x5@20");
  EXPECT_EQ(m.num_requests(), 5);
  EXPECT_EQ(m.num_tokens(), 3 + 2 + 3 + 5);
  EXPECT_EQ(m.max_speculative_query_len(), 3);
  EXPECT_FALSE(m.decode_only());
  EXPECT_TRUE(parse_mix("d3@5+d1@9").decode_only());
}

TEST(Mix, DecodesFirstThenChunksThenPrefillsWhateverTheWrittenOrder) {
  const Mix m = parse_mix("p2x2k+c1x512@8k+d64@4k+s8x4@2k+d1@1");
  ASSERT_EQ(m.terms.size(), 5u);
  EXPECT_EQ(m.terms[0], term(MixKind::kDecode, 64, 1, 4096));
  EXPECT_EQ(m.terms[1], term(MixKind::kSpecDecode, 8, 4, 2048));
  EXPECT_EQ(m.terms[2], term(MixKind::kDecode, 1, 1, 1));
  EXPECT_EQ(m.terms[3], term(MixKind::kChunk, 1, 512, 8192));
  EXPECT_EQ(m.terms[4], term(MixKind::kPrefill, 2, 2048, 0));
  EXPECT_EQ(to_string(m), "d64@4k+s8x4@2k+d1@1+c1x512@8k+p2x2k");
}

TEST(Mix, CanonicalFormRoundTrips) {
  EXPECT_EQ(to_string(parse_mix("d64@4096+p2x2048")), "d64@4k+p2x2k");
  EXPECT_EQ(to_string(parse_mix(" d1@1000 + c3x1536@100 ")), "d1@1000+c3x1536@100");
  EXPECT_EQ(to_string(parse_mix("p1x1k+d2@3K")), "d2@3k+p1x1k");
  for (const char* text : {"d64@4k", "p2x2k+d8@32k", "s8x4@2k+c1x512@8k+p2x2048", "d1@0+p1x1", "c7x100@1025"}) {
    const Mix m = parse_mix(text);
    const std::string canonical = to_string(m);
    EXPECT_EQ(parse_mix(canonical), m) << text;
    EXPECT_EQ(to_string(parse_mix(canonical)), canonical) << text;
  }
}

struct BadMix {
  const char* text;
  const char* term;      // "term N 'text'"
  const char* position;  // "at character C"
  const char* what;
};

TEST(Mix, ErrorsNameTheTermAndThePosition) {
  const std::vector<BadMix> cases = {
      {"", "term 1 ''", "at character 1", "empty term"},
      {"d64@4k+", "term 2 ''", "at character 8", "empty term"},
      {"d64@4k++p1x1", "term 2 ''", "at character 8", "empty term"},
      {"x3", "term 1 'x3'", "at character 1", "a term starts with"},
      {"d64", "term 1 'd64'", "at character 4", "expected '@'"},
      {"d64@4k+p2y", "term 2 'p2y'", "at character 10", "expected 'x' after the count of a prefill term (pNxL)"},
      {"d0@5", "term 1 'd0@5'", "at character 2", "the count N must be >= 1"},
      {"s4x1@10", "term 1 's4x1@10'", "at character 4", "must be >= 2"},
      {"c1x5@0", "term 1 'c1x5@0'", "at character 6", "context C must be >= 1"},
      {"p1x0", "term 1 'p1x0'", "at character 4", "the length L must be >= 1"},
      {"d1k@5", "term 1 'd1k@5'", "at character 3", "the suffix 'k' is for lengths and contexts"},
      {"d1@5z", "term 1 'd1@5z'", "at character 5", "unexpected 'z'"},
      {"p1x", "term 1 'p1x'", "at character 4", "expected digits for the length L, got the end"},
      {"d1@@4", "term 1 'd1@@4'", "at character 4", "expected digits for the context C"},
      {"d99999999999@1", "term 1 'd99999999999@1'", "at character 2", "larger than"},
      {"d1@2147483647", "term 1 'd1@2147483647'", "at character 1", "exceeds"},
      {"d1@4k + P1x2", "term 2 'P1x2'", "at character 9", "a term starts with"},
  };
  for (const BadMix& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parse_mix(c.text);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_THAT(message, HasSubstr(std::string("mix '") + c.text + "'"));
      EXPECT_THAT(message, HasSubstr(c.term));
      EXPECT_THAT(message, HasSubstr(c.position));
      EXPECT_THAT(message, HasSubstr(c.what));
    }
  }
  EXPECT_THROW(parse_mix("p1x2097151k+p1x2k"), Error);  // too many tokens in all (the value itself overflows)
  try {
    parse_mix("p1x1500000k+p1x1500000k");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tokens in all exceed"));
  }
}

}  // namespace
}  // namespace hybridtb
