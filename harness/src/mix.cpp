// The mix grammar of `hybridtb gen` (see mix.h and datasets/GENERATING.md): parsing with errors
// that name the term and the character, the canonical string, and the request list.
#include "hybridtb/mix.h"

#include <algorithm>
#include <limits>

#include "hybridtb/error.h"

namespace hybridtb {

namespace {

constexpr int64_t kMaxValue = std::numeric_limits<int32_t>::max();  // seq_lens are int32

const char* kind_letters = "'d' (decodes), 's' (speculative decodes), 'c' (chunks) or 'p' (prefills)";

const char* form_of(MixKind kind) {
  switch (kind) {
    case MixKind::kDecode:
      return "dN@C";
    case MixKind::kSpecDecode:
      return "sNxK@C";
    case MixKind::kChunk:
      return "cNxL@C";
    case MixKind::kPrefill:
      return "pNxL";
  }
  return "?";
}

const char* name_of(MixKind kind) {
  switch (kind) {
    case MixKind::kDecode:
      return "decode";
    case MixKind::kSpecDecode:
      return "speculative decode";
    case MixKind::kChunk:
      return "chunk";
    case MixKind::kPrefill:
      return "prefill";
  }
  return "?";
}

// vLLM's region order: decodes (plain and speculative) → extends (chunks) → fresh prefills.
int order_class(MixKind kind) {
  switch (kind) {
    case MixKind::kDecode:
    case MixKind::kSpecDecode:
      return 0;
    case MixKind::kChunk:
      return 1;
    case MixKind::kPrefill:
      return 2;
  }
  return 3;
}

// Reads one term; `offset` is the 0-based position of the term's first character in the mix.
class TermParser {
 public:
  TermParser(std::string_view mix, std::string_view term, size_t offset, size_t number)
      : mix_(mix), term_(term), offset_(offset), number_(number) {}

  MixTerm parse() {
    if (term_.empty()) fail(0, "empty term (two '+' in a row, or a '+' at an end)");
    MixTerm t;
    switch (term_[0]) {
      case 'd':
        t.kind = MixKind::kDecode;
        break;
      case 's':
        t.kind = MixKind::kSpecDecode;
        break;
      case 'c':
        t.kind = MixKind::kChunk;
        break;
      case 'p':
        t.kind = MixKind::kPrefill;
        break;
      default:
        fail(0, detail::concat("a term starts with ", kind_letters, ", got '", term_[0], "'"));
    }
    pos_ = 1;
    t.count = number("the count N", false);
    if (t.count < 1) fail(1, "the count N must be >= 1");
    if (t.kind == MixKind::kDecode) {
      t.query_len = 1;
    } else {
      expect('x', "after the count");
      const size_t at = pos_;
      t.query_len = number(t.kind == MixKind::kSpecDecode ? "the tokens per request K" : "the length L", true);
      if (t.kind == MixKind::kSpecDecode && t.query_len < 2) {
        fail(at, "K = 1 + num_speculative_tokens must be >= 2 (use dN@C for plain decodes)");
      }
      if (t.query_len < 1) fail(at, "the length L must be >= 1");
    }
    if (t.kind != MixKind::kPrefill) {
      expect('@', t.kind == MixKind::kDecode ? "after the count" : "after the length");
      const size_t at = pos_;
      t.context_len = number("the context C", true);
      if (t.kind == MixKind::kChunk && t.context_len < 1) {
        fail(at, "a chunk continues a request, so its context C must be >= 1 (use pNxL for a fresh prefill)");
      }
    }
    if (pos_ != term_.size()) {
      fail(pos_, detail::concat("unexpected '", term_[pos_], "' after a complete ", name_of(t.kind), " term (",
                                form_of(t.kind), ")"));
    }
    if (t.context_len + t.query_len > kMaxValue) {
      fail(0, detail::concat("context + tokens = ", t.context_len + t.query_len, " exceeds ", kMaxValue,
                             " (seq_lens are int32)"));
    }
    return t;
  }

  [[noreturn]] void fail(size_t at, const std::string& what) const {
    throw Error(detail::concat("mix '", mix_, "': term ", number_, " '", term_, "' at character ", offset_ + at + 1,
                               ": ", what));
  }

 private:
  void expect(char c, const char* where) {
    if (pos_ < term_.size() && term_[pos_] == c) {
      ++pos_;
      return;
    }
    const MixKind kind = term_[0] == 'd'   ? MixKind::kDecode
                         : term_[0] == 's' ? MixKind::kSpecDecode
                         : term_[0] == 'c' ? MixKind::kChunk
                                           : MixKind::kPrefill;
    fail(pos_, detail::concat("expected '", c, "' ", where, " of a ", name_of(kind), " term (", form_of(kind), ")",
                              pos_ < term_.size() ? detail::concat(", got '", term_[pos_], "'") : ", got the end"));
  }

  // Digits, then (if `suffix`) an optional k/K meaning ×1024.
  int64_t number(const char* what, bool suffix) {
    const size_t start = pos_;
    int64_t value = 0;
    while (pos_ < term_.size() && term_[pos_] >= '0' && term_[pos_] <= '9') {
      value = value * 10 + (term_[pos_] - '0');
      if (value > kMaxValue) fail(start, detail::concat(what, " is larger than ", kMaxValue));
      ++pos_;
    }
    if (pos_ == start) {
      fail(start, detail::concat("expected digits for ", what,
                                 pos_ < term_.size() ? detail::concat(", got '", term_[pos_], "'") : ", got the end"));
    }
    if (pos_ < term_.size() && (term_[pos_] == 'k' || term_[pos_] == 'K')) {
      if (!suffix) fail(pos_, detail::concat("the suffix 'k' is for lengths and contexts, not for ", what));
      ++pos_;
      value *= 1024;
      if (value > kMaxValue) fail(start, detail::concat(what, " is larger than ", kMaxValue));
    }
    return value;
  }

  std::string_view mix_;
  std::string_view term_;
  size_t offset_;
  size_t number_;
  size_t pos_ = 0;
};

std::string with_suffix(int64_t value) {
  if (value > 0 && value % 1024 == 0) return std::to_string(value / 1024) + "k";
  return std::to_string(value);
}

bool is_space(char c) { return c == ' ' || c == '\t'; }

}  // namespace

int64_t Mix::num_requests() const {
  int64_t n = 0;
  for (const MixTerm& t : terms) n += t.count;
  return n;
}

int64_t Mix::num_tokens() const {
  int64_t n = 0;
  for (const MixTerm& t : terms) n += t.count * t.query_len;
  return n;
}

bool Mix::decode_only() const {
  return std::all_of(terms.begin(), terms.end(), [](const MixTerm& t) { return t.kind == MixKind::kDecode; });
}

int64_t Mix::max_speculative_query_len() const {
  int64_t k = 0;
  for (const MixTerm& t : terms) {
    if (t.kind == MixKind::kSpecDecode) k = std::max(k, t.query_len);
  }
  return k;
}

Mix parse_mix(std::string_view text) {
  Mix mix;
  size_t start = 0;
  size_t number = 1;
  while (true) {
    const size_t plus = text.find('+', start);
    const size_t end = plus == std::string_view::npos ? text.size() : plus;
    size_t first = start, last = end;
    while (first < last && is_space(text[first])) ++first;
    while (last > first && is_space(text[last - 1])) --last;
    mix.terms.push_back(TermParser(text, text.substr(first, last - first), first, number).parse());
    if (plus == std::string_view::npos) break;
    start = plus + 1;
    ++number;
  }
  std::stable_sort(mix.terms.begin(), mix.terms.end(),
                   [](const MixTerm& a, const MixTerm& b) { return order_class(a.kind) < order_class(b.kind); });
  HYBRIDTB_CHECK(mix.num_tokens() <= kMaxValue, "mix '", text, "': ", mix.num_tokens(), " tokens in all exceed ",
                 kMaxValue, " (query_start_loc is int32)");
  return mix;
}

std::string to_string(const MixTerm& t) {
  const std::string n = std::to_string(t.count);
  switch (t.kind) {
    case MixKind::kDecode:
      return "d" + n + "@" + with_suffix(t.context_len);
    case MixKind::kSpecDecode:
      return "s" + n + "x" + with_suffix(t.query_len) + "@" + with_suffix(t.context_len);
    case MixKind::kChunk:
      return "c" + n + "x" + with_suffix(t.query_len) + "@" + with_suffix(t.context_len);
    case MixKind::kPrefill:
      return "p" + n + "x" + with_suffix(t.query_len);
  }
  return "?";
}

std::string to_string(const Mix& mix) {
  std::string out;
  for (const MixTerm& t : mix.terms) {
    if (!out.empty()) out += '+';
    out += to_string(t);
  }
  return out;
}

std::vector<RequestSpec> mix_requests(const Mix& mix) {
  std::vector<RequestSpec> requests;
  for (const MixTerm& t : mix.terms) {
    for (int64_t i = 0; i < t.count; ++i) {
      RequestSpec r{.context_len = t.context_len, .query_len = t.query_len};
      if (t.kind == MixKind::kSpecDecode) r.num_accepted_tokens = static_cast<int32_t>(t.query_len);
      requests.push_back(std::move(r));
    }
  }
  return requests;
}

}  // namespace hybridtb
