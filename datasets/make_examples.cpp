// make_examples — (re)writes the example batches shipped in datasets/examples/.
// Usage: make_examples <output-dir>. Deterministic: the same build writes the same tensors, and a
// test (tests/cli) checks the committed files still match what this program produces.
#include <filesystem>
#include <iostream>

#include "examples.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/error.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_examples <output-dir>\n";
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    std::filesystem::create_directories(dir);
    for (const auto& example : hybridtb::examples::all()) {
      hybridtb::write_batch_file((dir / example.file_name).string(), example.make());
      std::cout << "wrote " << (dir / example.file_name).string() << ": " << example.description << "\n";
    }
  } catch (const hybridtb::Error& e) {
    std::cerr << "make_examples: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
