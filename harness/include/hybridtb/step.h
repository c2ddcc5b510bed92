// Running one recorded step on any backend: upload the inputs into the backend's memory, build
// the metadata, write the KV cache, run the attention, download every output. The same function
// serves `hybridtb run`, the tests and the parity tools, so all of them exercise one code path.
#pragma once

#include "hybridtb/backend.h"
#include <limits>

#include "hybridtb/batch_file.h"

namespace hybridtb {

// Value the output buffers are filled with before a run. Rows a backend must not write (CUDA-graph
// padding) still hold it afterwards, which is how the tests and the parity report check that
// padding rows were never touched.
inline constexpr double kOutputPoison = std::numeric_limits<double>::quiet_NaN();

// A host copy of a tensor in the backend's memory (an empty tensor stays empty).
Tensor download(Backend& backend, const Tensor& device);

// An output buffer in the backend's memory, of its output dtype, filled with kOutputPoison.
Tensor poisoned_output(Backend& backend, const Shape& shape);

// Copies of every input tensor of `host` in the backend's memory (empty tensors stay empty;
// the scalar scales are copied as they are). run_step and the benchmark suite upload through it.
BatchInputs upload_inputs(Backend& backend, const BatchInputs& host);

// Runs `file`'s step on `backend`. The file is not modified (the KV cache is copied first).
// Throws Error / NotSupported if the backend cannot run this configuration.
StepOutputs run_step(Backend& backend, const BatchFile& file);

}  // namespace hybridtb
