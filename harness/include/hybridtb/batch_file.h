// The hybrid-batch HDF5 file (schema "hybrid-batch" 1.x, documented in datasets/SCHEMA.md):
// reading, validating and atomically writing it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/batch.h"
#include "hybridtb/config.h"
#include "hybridtb/metadata.h"
#include "hybridtb/progress.h"
#include "hybridtb/tensor.h"

namespace hybridtb {

inline constexpr const char* kSchemaName = "hybrid-batch";
inline constexpr int kSchemaMajor = 1;
// The newest version this build writes (1.1: SSM branch items; 1.2: layer kinds; 1.3: engine
// version, norm eps, mamba_rms_norm, fp8 query; 1.4: tensor-parallel rank files). A file is written
// as the oldest 1.x that holds its items (1.2 at least).
inline constexpr int kSchemaMinor = 4;

// What a backend produced for one step (/outputs), or what a trusted run recorded (/expected).
struct StepOutputs {
  std::string backend;    // root attribute `backend` for /outputs; group attribute for /expected
  Tensor output;          // [T, Hq, D] final output (attention + SSM contribution when present); a linear
                          // layer's (layer_kind gdn/mamba2) core output [T, output_width], its only tensor
  Tensor attn_output;     // [T, Hq, D] attention alone
  Tensor kv_cache;        // [NB, 2, BS, Hkv, D] after the KV write
  Tensor k_scale_cache;   // [NB, BS, Hkv] after the write (per-token-head modes only)
  Tensor v_scale_cache;
  Tensor ssm_output;      // [T, Hq, D] the SSM contribution alone (absent when ssm_mode is "none")
  std::map<std::string, Tensor> ssm_state;  // /outputs/ssm/<name>: the state pools after the step
  HybridMetadata metadata;
  // False for an /expected without a `metadata` group (a serving engine's capture: vLLM has no
  // hybridtb builder metadata). Replay then compares no metadata, and takes the state slots a step
  // may touch from the candidate's.
  bool has_metadata = true;
};

struct BatchFile {
  std::string schema_version = "1.2";  // as read; written as the oldest 1.x holding the file's items
  AttentionConfig config;
  BuilderConfig builder;
  BatchDescription batch;
  BatchInputs inputs;
  std::optional<StepOutputs> outputs;
  std::optional<StepOutputs> expected;
  // Free-form string attributes of the root group (producer, seed, notes, …), kept on rewrite.
  std::map<std::string, std::string> provenance;
  // What the reader accepted but does not understand, one line each (a newer minor version and the
  // items it ignored). The tools print them: such items are not used, and not rewritten.
  std::vector<std::string> warnings;
};

// How far a read or write of a file's tensor data got, for a caller's progress bar: `sink` gets one
// stage ("reading PATH" or "writing PATH"), done/total in MiB, the last call with done == total.
// Large tensors move in slices of 64 MiB so that a long transfer reports along the way. A read
// counts against the file's size, a write against the bytes of the tensors it writes.
struct FileProgress {
  ProgressSink* sink = nullptr;
};

// Reads and validates a batch file. Throws Error naming the dataset/attribute and the constraint
// (missing item, wrong dtype or shape, schema other than 1.x, unreadable or truncated file).
BatchFile read_batch_file(const std::string& path, const FileProgress& progress = {});

// Writes `file` to a temporary name next to `path` and renames it on success; on any failure the
// temporary is removed and no file appears at `path`.
void write_batch_file(const std::string& path, const BatchFile& file, const FileProgress& progress = {});

// One HDF5 object, for `hybridtb info`.
struct FileEntry {
  std::string path;        // "/inputs/query"
  std::string kind;        // "group" | "dataset"
  std::string dtype_name;  // the dtype_name attribute, or the HDF5 type in words
  Shape shape;             // datasets only
};
// Lists every group and dataset in the file without validating it (works on invalid files that
// HDF5 can open). Throws Error if HDF5 cannot open the file at all.
std::vector<FileEntry> list_file_entries(const std::string& path);

// Outputs files (`hybridtb run --outputs-only`, SCHEMA.md §5.7): /outputs alone, with root
// attributes naming the batch file they belong to (outputs_of, relative to the outputs file's
// directory, and its size outputs_of_bytes). Not a batch file: read it with read_outputs_file.
//   write_outputs_file: `file.outputs` of the batch at `batch_path`, atomically like write_batch_file.
//   read_outputs_file: the batch file it names, read and validated, with `outputs` from this file;
//     Error if that file is missing or its size changed. `batch_path` (optional) receives its path.
//   is_outputs_file: whether `path` is an HDF5 file with the outputs_of attribute.
void write_outputs_file(const std::string& path, const BatchFile& file, const std::string& batch_path,
                        const FileProgress& progress = {});
BatchFile read_outputs_file(const std::string& path, std::string* batch_path = nullptr);
bool is_outputs_file(const std::string& path);

}  // namespace hybridtb
