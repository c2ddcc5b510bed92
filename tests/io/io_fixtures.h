// Hand-built batch files and helpers for the tests in tests/io: small valid batches whose tensors
// are filled with awkward bit patterns (signed zeros, subnormals, infinities, NaN payloads, the
// largest finite values), field-by-field equality, and in-place edits of written files (through
// the io/hdf5.h wrapper) to produce the malformed and "h5py-style" variants the reader must handle.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hybridtb/batch_file.h"
#include "io/hdf5.h"

namespace hybridtb::testing {

// The special bit patterns every round trip must preserve, per storage width.
std::vector<uint16_t> bfloat16_specials();
std::vector<uint16_t> float16_specials();
std::vector<uint32_t> float32_specials();
std::vector<uint64_t> float64_specials();

// A host tensor of `dtype` whose first elements are the specials of its width (all 256 bytes for
// 1-byte types) and the rest deterministic pseudo-random bits from `seed`.
Tensor patterned_tensor(DType dtype, const Shape& shape, uint64_t seed);

// Every AttentionConfig field away from its default (sliding window, soft cap, ALiBi sqrt, sinks,
// SSM settings…), for `dtype` and `kv`.
AttentionConfig full_config(DType dtype, KvCacheDtype kv, AttnType attn = AttnType::kDecoder);
BuilderConfig full_builder();

// A valid batch for `config`: 3 real requests (a chunked prefill, a decode, a fresh prefill) and a
// trailing padding request, 6 real tokens + 1 CUDA-graph padding row (T = 7), 6 KV blocks of which
// block 0 is the null block. Decoder layouts page through block_table; encoder-only ones have no
// KV cache and an [R, 0] block table. Optional batch arrays and provenance are included when
// `with_optionals`.
BatchFile small_batch_file(const AttentionConfig& config, bool with_optionals = true);
inline constexpr int64_t kSmallTokens = 7;
inline constexpr int64_t kSmallBlocks = 6;

// Metadata with every field (including the optional arrays and causal_conv1d) set to distinct values.
HybridMetadata full_metadata();
// Outputs for `file`: output/attn_output in `dtype`, the cache after the write in the cache's
// storage dtype, scale caches for per-token-head modes.
StepOutputs sample_outputs(const BatchFile& file, DType dtype, const std::string& backend, uint64_t seed);

// The SSM branch (schema 1.1). A mamba1-shaped section, because the I/O layer is generic and the
// names are just names: /config/ssm params I=8, N=4, K=4, R=2; pools conv_state [kSsmSlots, I, K-1]
// and ssm_state [kSsmSlots, I, N]; every mamba1 weight (ranks 1 and 2, H = num_heads·head_size)
// plus a rank-3 extra one. Tensors in `dtype`, patterned like every other tensor; ssm_mode "mamba1".
inline constexpr int64_t kSsmSlots = 12;  // small_batch_file's ssm_block_table uses ids up to 11
void add_ssm_inputs(BatchFile& file, DType dtype, uint64_t seed);
// ssm_output [T, Hq, D] and the pools after the step (same names and shapes as the inputs'), in `dtype`.
void add_ssm_outputs(StepOutputs& out, const BatchFile& file, DType dtype, uint64_t seed);

// The schema_version write_batch_file records for a file without 1.3 items (spelled out).
inline constexpr const char* kWrittenSchemaVersion = "1.2";

// Field-by-field equality with bitwise comparison of every float (EXPECT_* failures name the field).
void expect_same_batch_file(const BatchFile& expected, const BatchFile& actual);
void expect_same_tensor(const Tensor& expected, const Tensor& actual, const std::string& what);

// Runs `body` and returns the hybridtb::Error message it throws; records a test failure (and
// returns "") if it throws nothing or something else.
std::string error_of(const std::function<void()>& body);

// Opens a written file read-write and hands `edit` its root group.
void edit_file(const std::filesystem::path& path, const std::function<void(const h5::Group& root)>& edit);
// The group at an absolute path ("/inputs").
h5::Group group_at(const h5::Group& root, const std::string& path);
// Replaces (or creates) the dataset at `path` with raw `data` of HDF5 `type` and `shape`.
void replace_dataset(const h5::Group& root, const std::string& path, hid_t type, const Shape& shape, const void* data);
// Writes a fixed-length (NUL- or space-padded) ASCII string attribute, as numpy bytes would.
void write_fixed_string_attribute(const h5::Object& object, const std::string& name, const std::string& value,
                                  bool space_padded);
// Writes a scalar attribute of an arbitrary HDF5 type (memory type = file type).
void write_typed_attribute(const h5::Object& object, const std::string& name, hid_t type, const void* value);

// The names in a directory (to check that failed writes leave nothing behind).
std::vector<std::string> directory_listing(const std::filesystem::path& dir);

}  // namespace hybridtb::testing
