// The checks every SSM mode's tests make of the mode against its independent naive token loop and
// against its own runs, whatever the mode computes: tests/ssm_<mode>/<mode>_mode_test.cpp call them
// with the mode's traits, so a new mode gets them by describing itself.
//
//   check_prefill_matches_naive          prefill of every length, from a zero and a random state,
//                                        equals the naive loop (contributions and final state)
//   check_decode_steps_match_naive       twenty decode steps in a row, each checked
//   check_prefill_equals_decode_steps    one prefill equals a decode step per token
//   check_split_prefill_equals_one_shot  a prefill cut into two or three chunks at every split
//                                        point equals one shot, from a zero and a random state
//
// Mode is a struct of static members:
//   Dims, State (the naive loop's request state), Naive (its model);
//   dims(), lengths(): the sizes to sweep and the prefill lengths;
//   naive(dims, weights) → Naive; run_naive(naive, state, hidden, tokens) → contributions;
//   hidden(dims, tokens, seed) → [tokens][H];
//   run(mode weights, state, hidden, dims, begin, end, decode) → the mode's contributions of tokens
//     [begin, end) of `hidden`, advancing `state`;
//   tolerance(dims, tokens);
// and the mode's test support declares beside Dims and State (found by argument-dependent lookup):
//   describe(dims); random_weights(dims, seed) → std::map<std::string, Tensor> (the mode's specs);
//   random_state(dims, seed), zero_state(dims); expect_state_close(actual, expected, tolerance, what).
// Each check takes its seeds from `seed` upwards; every comparison is at the mode's tolerance for
// the number of tokens run.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/tolerance.h"
#include "ssm_test_support.h"

namespace hybridtb::testing {

template <typename Mode>
void check_prefill_matches_naive(uint64_t seed) {
  for (const typename Mode::Dims& d : Mode::dims()) {
    const auto tensors = random_weights(d, seed++);
    const reference::ssm::Weights weights = to_weights(tensors);
    const typename Mode::Naive naive = Mode::naive(d, tensors);
    for (const int64_t L : Mode::lengths()) {
      for (const bool has_initial_state : {false, true}) {
        SCOPED_TRACE(describe(d) + " L=" + std::to_string(L) +
                     (has_initial_state ? " initial state" : " zero state"));
        const typename Mode::State initial = has_initial_state ? random_state(d, seed++) : zero_state(d);
        const std::vector<double> hidden = Mode::hidden(d, L, seed++);
        typename Mode::State expected_state = initial;
        const std::vector<double> expected = Mode::run_naive(naive, expected_state, hidden, L);
        typename Mode::State state = initial;
        const std::vector<double> actual = Mode::run(weights, state, hidden, d, 0, L, false);
        const Tolerance tol = Mode::tolerance(d, L);
        expect_close(actual, expected, tol, "contribution");
        expect_state_close(state, expected_state, tol, "final");
      }
    }
  }
}

template <typename Mode>
void check_decode_steps_match_naive(uint64_t seed) {
  for (const typename Mode::Dims& d : Mode::dims()) {
    SCOPED_TRACE(describe(d));
    const auto tensors = random_weights(d, seed++);
    const reference::ssm::Weights weights = to_weights(tensors);
    const typename Mode::Naive naive = Mode::naive(d, tensors);
    typename Mode::State state = random_state(d, seed++);
    typename Mode::State expected_state = state;
    // Twenty decode steps in a row, each checked (errors must not grow past the n-step bound).
    for (int64_t step = 0; step < 20; ++step) {
      const std::vector<double> hidden = Mode::hidden(d, 1, seed++);
      const std::vector<double> expected = Mode::run_naive(naive, expected_state, hidden, 1);
      const std::vector<double> actual = Mode::run(weights, state, hidden, d, 0, 1, true);
      const Tolerance tol = Mode::tolerance(d, step + 1);
      expect_close(actual, expected, tol, "decode contribution, step " + std::to_string(step));
      expect_state_close(state, expected_state, tol, "decode step " + std::to_string(step));
    }
  }
}

// Mode advanced over the consecutive chunks [bounds[i], bounds[i + 1]) of `hidden` (empty ones
// skipped), carrying `state`: the chunks' contributions in order.
template <typename Mode>
std::vector<double> run_chunks(const reference::ssm::Weights& weights, typename Mode::State& state,
                               const std::vector<double>& hidden, const typename Mode::Dims& d,
                               const std::vector<int64_t>& bounds, bool decode) {
  std::vector<double> out;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i + 1] == bounds[i]) continue;
    const std::vector<double> y = Mode::run(weights, state, hidden, d, bounds[i], bounds[i + 1], decode);
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

template <typename Mode>
void check_prefill_equals_decode_steps(uint64_t seed) {
  constexpr int64_t L = 23;
  for (const typename Mode::Dims& d : Mode::dims()) {
    SCOPED_TRACE(describe(d));
    const reference::ssm::Weights weights = to_weights(random_weights(d, seed++));
    const typename Mode::State initial = random_state(d, seed++);
    const std::vector<double> hidden = Mode::hidden(d, L, seed++);
    typename Mode::State prefill_state = initial;
    const std::vector<double> prefill = Mode::run(weights, prefill_state, hidden, d, 0, L, false);
    typename Mode::State step_state = initial;
    std::vector<int64_t> every_token(L + 1);
    for (int64_t t = 0; t <= L; ++t) every_token[static_cast<size_t>(t)] = t;
    const std::vector<double> steps = run_chunks<Mode>(weights, step_state, hidden, d, every_token, true);
    const Tolerance tol = Mode::tolerance(d, L);
    expect_close(steps, prefill, tol, "decode steps vs prefill");
    expect_state_close(step_state, prefill_state, tol, "decode steps vs prefill");
  }
}

template <typename Mode>
void check_split_prefill_equals_one_shot(uint64_t seed) {
  constexpr int64_t L = 11;
  for (const typename Mode::Dims& d : Mode::dims()) {
    SCOPED_TRACE(describe(d));
    const reference::ssm::Weights weights = to_weights(random_weights(d, seed++));
    const std::vector<double> hidden = Mode::hidden(d, L, seed++);
    for (const bool has_initial_state : {false, true}) {
      const typename Mode::State initial = has_initial_state ? random_state(d, seed++) : zero_state(d);
      typename Mode::State one_shot_state = initial;
      const std::vector<double> one_shot = Mode::run(weights, one_shot_state, hidden, d, 0, L, false);
      const Tolerance tol = Mode::tolerance(d, L);
      for (int64_t a = 1; a < L; ++a) {
        for (int64_t b = a; b < L; ++b) {  // chunks [0, a), [a, b) (skipped when empty), [b, L)
          SCOPED_TRACE("split at " + std::to_string(a) + ", " + std::to_string(b) +
                       (has_initial_state ? ", initial state" : ", zero state"));
          typename Mode::State state = initial;
          const std::vector<double> out = run_chunks<Mode>(weights, state, hidden, d, {0, a, b, L}, false);
          expect_close(out, one_shot, tol, "split prefill");
          expect_state_close(state, one_shot_state, tol, "split prefill");
        }
      }
    }
  }
}

}  // namespace hybridtb::testing
