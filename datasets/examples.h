// The example batches shipped in datasets/examples/: small, seeded, each covering a slice of the
// features the reference implements. make_examples writes them; the CLI tests check them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"

namespace hybridtb::examples {

struct Example {
  std::string file_name;
  std::string description;
  std::function<BatchFile()> make;
};

const std::vector<Example>& all();

}  // namespace hybridtb::examples
