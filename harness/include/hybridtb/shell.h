// Shell quoting for the commands the harness prints for a user to paste into a POSIX shell (the
// `hybridtb gen` line of a generated file, the benchmark suite's --repro lines): one rule for all.
#pragma once

#include <string>
#include <string_view>

namespace hybridtb {

// `word` as one POSIX shell word: unchanged if it is non-empty and made only of characters no shell
// splits on or expands (letters, digits and _ . , @ + = : / - %), else in single quotes, with each
// ' inside written as '\''.
inline std::string shell_word(std::string_view word) {
  constexpr std::string_view kSafe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.,@+=:/-%";
  if (!word.empty() && word.find_first_not_of(kSafe) == std::string_view::npos) return std::string(word);
  std::string quoted = "'";
  for (const char c : word) quoted += c == '\'' ? std::string_view("'\\''") : std::string_view(&c, 1);
  return quoted + "'";
}

}  // namespace hybridtb
