// Human-readable summaries of a batch file and of a step's results, shared by the subcommands.
#pragma once

#include <ostream>

#include "hybridtb/batch_file.h"

namespace hybridtb::cli {

void print_config(std::ostream& out, const AttentionConfig& config, const BuilderConfig& builder);
void print_batch(std::ostream& out, const BatchDescription& batch);
void print_metadata(std::ostream& out, const HybridMetadata& metadata);
// Value statistics of an output over the real rows, and whether padding rows kept the poison.
void print_outputs(std::ostream& out, const BatchFile& file, const StepOutputs& outputs);

}  // namespace hybridtb::cli
