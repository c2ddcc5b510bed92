// Interoperability with h5py, the library users capture batches with: files we write read in h5py
// as the schema promises (bf16 as exact float32, fp16 as '<f2', fp8 as raw bytes, typed attributes,
// the SSM items of 1.1), and files written by harness/scripts/write_batch_h5py.py or by h5py code
// (1.0 files, SSM sections) read correctly here. Skipped, with the reason, when no python3 with
// h5py was found at configure time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "hybridtb/batch_file.h"
#include "io_fixtures.h"
#include "test_paths.h"

namespace hybridtb::testing {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_H5PY()                                                                        \
  if (python_with_h5py().empty()) GTEST_SKIP() << "no python3 with h5py + numpy found at configure time " \
                                                  "(install python3-h5py and re-run cmake)"

// Single-quoted for the shell (built by appending: GCC 12 warns falsely on "'" + text, PR 105329).
std::string quoted(const std::string& text) {
  std::string out(1, '\'');
  out.append(text).push_back('\'');
  return out;
}

std::string python_command(const std::filesystem::path& script, const std::vector<std::string>& args) {
  std::string command = quoted(python_with_h5py());
  command.append(" ").append(quoted(script.string()));
  for (const std::string& arg : args) command.append(" ").append(quoted(arg));
  return command;
}

// Runs a python snippet with arguments; returns its output and records a failure on a non-zero exit.
std::string run_python(const std::filesystem::path& dir, const std::string& code, const std::vector<std::string>& args) {
  const std::filesystem::path script = dir / "snippet.py";
  std::ofstream(script) << code;
  const std::string command = python_command(script, args);
  std::string output;
  const int status = run_command(command, &output);
  EXPECT_EQ(status, 0) << command << "\n" << output;
  return output;
}

std::string run_script(const std::string& script, const std::vector<std::string>& args, int* status) {
  const std::string command = python_command(source_dir() / "harness/scripts" / script, args);
  std::string output;
  *status = run_command(command, &output);
  return output;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The bytes numpy holds after h5py reads `tensor`: bfloat16 widens to float32, the rest is verbatim.
std::string as_h5py_sees(const Tensor& tensor) {
  if (tensor.dtype() != DType::kBFloat16) return {static_cast<const char*>(tensor.data()), static_cast<size_t>(tensor.nbytes())};
  std::string bytes(static_cast<size_t>(tensor.numel()) * 4, '\0');
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    const float value = bfloat16_to_float(tensor.data_as<uint16_t>()[i]);
    std::memcpy(bytes.data() + 4 * i, &value, 4);
  }
  return bytes;
}

// `bytes` (what h5py read) equal as_h5py_sees(tensor), except that a bfloat16 NaN may come back as
// any NaN (HDF5 converts the custom type to float32 and does not keep NaN payloads, SCHEMA.md §3).
void expect_h5py_saw(const std::string& bytes, const Tensor& tensor, const std::string& what) {
  const std::string expected = as_h5py_sees(tensor);
  if (tensor.dtype() != DType::kBFloat16) {
    EXPECT_EQ(bytes, expected) << what;
    return;
  }
  ASSERT_EQ(bytes.size(), expected.size()) << what;
  for (size_t i = 0; i < bytes.size(); i += 4) {
    float seen = 0, wanted = 0;
    std::memcpy(&seen, bytes.data() + i, 4);
    std::memcpy(&wanted, expected.data() + i, 4);
    if (std::isnan(wanted)) {
      EXPECT_TRUE(std::isnan(seen)) << what << " element " << i / 4;
    } else {
      EXPECT_EQ(bytes.compare(i, 4, expected, i, 4), 0) << what << " element " << i / 4;
    }
  }
}

TEST(H5pyInterop, Bfloat16ReadsAsExactFloat32) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  const BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  write_batch_file((dir / "batch.h5").string(), file);
  const std::string output = run_python(dir, R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    q = f["inputs/query"]
    print(q.dtype.str, q.attrs["dtype_name"])
    for v in q[()].reshape(-1):
        print("nan" if np.isnan(v) else "%08x" % np.array(v, dtype="<f4").view("<u4"))
)", {(dir / "batch.h5").string()});
  const std::vector<std::string> lines = lines_of(output);
  ASSERT_EQ(lines.size(), static_cast<size_t>(file.inputs.query.numel()) + 1) << output;
  EXPECT_EQ(lines[0], "<f4 bfloat16");
  const auto* bits = file.inputs.query.data_as<uint16_t>();
  for (int64_t i = 0; i < file.inputs.query.numel(); ++i) {
    const float value = bfloat16_to_float(bits[i]);
    char expected[16];
    std::snprintf(expected, sizeof expected, "%08x", static_cast<unsigned>(bits[i]) << 16);
    ASSERT_EQ(lines[static_cast<size_t>(i) + 1], std::isnan(value) ? "nan" : expected) << "element " << i;
  }
}

TEST(H5pyInterop, Float16AndFp8AndAttributesAsTheSchemaSays) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  BatchFile file = small_batch_file(full_config(DType::kFloat16, KvCacheDtype::kFp8PerTokenHead));
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 3);
  write_batch_file((dir / "batch.h5").string(), file);
  const std::string output = run_python(dir, R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    q, kv = f["inputs/query"], f["inputs/kv_cache"]
    open(sys.argv[2], "wb").write(q[()].tobytes())
    open(sys.argv[3], "wb").write(kv[()].tobytes())
    c = f["config"].attrs
    print("query", q.dtype.str)
    print("kv_cache", kv.dtype.str, kv.attrs["dtype_name"])
    print("schema", type(f.attrs["schema"]).__name__, f.attrs["schema"], f.attrs["schema_version"])
    print("backend", f.attrs["backend"])
    print("num_heads", type(c["num_heads"]).__name__, c["num_heads"])
    print("scale", type(c["scale"]).__name__, repr(float(c["scale"])))
    print("kv_cache_dtype", type(c["kv_cache_dtype"]).__name__, c["kv_cache_dtype"])
    print("k_scale", f["inputs/k_scale"].shape, f["inputs/k_scale"].dtype.str, repr(float(f["inputs/k_scale"][()])))
    print("use_3d_path", type(f["outputs/metadata/attention"].attrs["use_3d_path"]).__name__)
    print("batch_ptr", f["outputs/metadata/mamba/causal_conv1d/batch_ptr"].dtype.str)
    print("output", f["outputs/output"].dtype.str)
    print("notes", f.attrs["notes"])
)", {(dir / "batch.h5").string(), (dir / "query.bin").string(), (dir / "kv.bin").string()});
  EXPECT_THAT(output, HasSubstr("query <f2\n"));
  EXPECT_THAT(output, HasSubstr("kv_cache |u1 float8_e4m3fn\n"));
  EXPECT_THAT(output, HasSubstr(std::string("schema str hybrid-batch ") + kWrittenSchemaVersion + "\n"));
  EXPECT_THAT(output, HasSubstr("backend reference\n"));
  EXPECT_THAT(output, HasSubstr("num_heads int64 4\n"));
  EXPECT_THAT(output, HasSubstr("scale float64 0.17677669529663687\n"));
  EXPECT_THAT(output, HasSubstr("kv_cache_dtype str fp8_per_token_head\n"));
  EXPECT_THAT(output, HasSubstr("k_scale () <f4 0.10000000149011612\n"));
  EXPECT_THAT(output, HasSubstr("use_3d_path int64\n"));
  EXPECT_THAT(output, HasSubstr("batch_ptr <i4\n"));
  EXPECT_THAT(output, HasSubstr("output <f8\n"));
  EXPECT_THAT(output, HasSubstr("notes ünïcödé ✓\n"));
  EXPECT_EQ(file_bytes(dir / "query.bin"), as_h5py_sees(file.inputs.query));
  EXPECT_EQ(file_bytes(dir / "kv.bin"), as_h5py_sees(file.inputs.kv_cache));
}

TEST(H5pyInterop, ReadScriptChecksOurFiles) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  std::vector<BatchFile> files;
  files.push_back(small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto)));
  files.back().outputs = sample_outputs(files.back(), DType::kFloat64, "reference", 1);
  files.back().expected = sample_outputs(files.back(), DType::kBFloat16, "cuda", 2);
  files.push_back(small_batch_file(full_config(DType::kFloat32, KvCacheDtype::kInt8PerTokenHead)));
  files.back().outputs = sample_outputs(files.back(), DType::kFloat32, "cuda", 3);
  files.back().outputs->metadata.mamba->seq_lens = IntArray();  // stored with a null dataspace
  files.push_back(small_batch_file(full_config(DType::kFloat16, KvCacheDtype::kAuto, AttnType::kEncoderOnly)));
  files.push_back(small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto)));
  add_ssm_inputs(files.back(), DType::kBFloat16, 4);
  files.back().outputs = sample_outputs(files.back(), DType::kFloat64, "reference", 5);
  add_ssm_outputs(*files.back().outputs, files.back(), DType::kFloat64, 6);
  files.back().expected = sample_outputs(files.back(), DType::kFloat16, "cuda", 7);
  add_ssm_outputs(*files.back().expected, files.back(), DType::kFloat16, 8);
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = (dir / ("batch" + std::to_string(i) + ".h5")).string();
    write_batch_file(path, files[i]);
    int status = 0;
    const std::string output = run_script("read_batch_h5py.py", {path, "--check"}, &status);
    EXPECT_EQ(status, 0) << output;
    EXPECT_THAT(output, HasSubstr("\nok\n"));
  }
}

struct ScriptCase {
  const char* dtype;
  const char* kv_cache_dtype;
};

TEST(H5pyInterop, FilesFromTheWriteScriptReadCorrectly) {
  SKIP_WITHOUT_H5PY();
  for (const ScriptCase c : {ScriptCase{"bfloat16", "auto"}, ScriptCase{"float16", "fp8_e4m3"},
                             ScriptCase{"float32", "fp8_e5m2"}, ScriptCase{"bfloat16", "fp8_e4m3"}}) {
    SCOPED_TRACE(std::string(c.dtype) + " / " + c.kv_cache_dtype);
    const std::filesystem::path dir = scratch_dir();
    const std::string path = (dir / "from_h5py.h5").string();
    int status = 0;
    const std::string written =
        run_script("write_batch_h5py.py", {path, "--dtype", c.dtype, "--kv-cache-dtype", c.kv_cache_dtype, "--seed", "5"},
                   &status);
    ASSERT_EQ(status, 0) << written;

    const BatchFile file = read_batch_file(path);
    EXPECT_EQ(file.config.dtype, dtype_from_string(c.dtype));
    EXPECT_EQ(file.config.kv_cache_dtype, kv_cache_dtype_from_string(c.kv_cache_dtype));
    EXPECT_EQ(file.config.num_heads, 4);
    EXPECT_EQ(file.config.num_kv_heads, 2);
    EXPECT_EQ(file.config.head_size, 32);
    EXPECT_EQ(file.config.block_size, 16);
    EXPECT_EQ(file.config.scale, std::pow(32.0, -0.5));
    EXPECT_FALSE(file.config.use_alibi_sqrt);
    ASSERT_TRUE(file.config.sinks.has_value());
    EXPECT_EQ(file.builder.cudagraph_mode, CudaGraphMode::kFullAndPiecewise);
    EXPECT_EQ(file.builder.cudagraph_capture_sizes, (std::vector<int64_t>{1, 2, 4, 8}));
    EXPECT_EQ(file.builder.max_num_seqs, 64);
    EXPECT_EQ(file.batch.num_reqs(), 3);
    EXPECT_EQ(file.batch.num_actual_tokens, 6);
    EXPECT_EQ(file.batch.num_tokens(), 8);
    EXPECT_EQ(file.batch.slot_mapping.back(), -1);
    EXPECT_EQ(file.inputs.k_scale, std::string(c.kv_cache_dtype) == "auto" ? 1.0f : 0.5f);
    EXPECT_EQ(file.provenance.at("producer"), "write_batch_h5py.py");
    EXPECT_EQ(file.provenance.at("seed"), "5");
    EXPECT_EQ(file.schema_version, "1.0");  // no SSM items: the script records 1.0, as before 1.1
    EXPECT_EQ(file.config.ssm_mode, "none");
    EXPECT_TRUE(file.inputs.ssm_state.empty());

    // The tensors hold what h5py sees, element for element.
    const std::string output = run_python(dir, R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    open(sys.argv[2], "wb").write(f["inputs/query"][()].tobytes())
    open(sys.argv[3], "wb").write(f["inputs/kv_cache"][()].tobytes())
    open(sys.argv[4], "wb").write(f["config/sinks"][()].tobytes())
)", {path, (dir / "query.bin").string(), (dir / "kv.bin").string(), (dir / "sinks.bin").string()});
    EXPECT_EQ(file_bytes(dir / "query.bin"), as_h5py_sees(file.inputs.query));
    EXPECT_EQ(file_bytes(dir / "kv.bin"), as_h5py_sees(file.inputs.kv_cache));
    const std::string sinks(reinterpret_cast<const char*>(file.config.sinks->data()), file.config.sinks->size() * 4);
    EXPECT_EQ(file_bytes(dir / "sinks.bin"), sinks);
  }
}

// --- the SSM branch (schema 1.1) ---------------------------------------------------------------

// What h5py sees of our SSM items: int64 params, each pool and weight in its dtype (bf16 as exact
// float32), ssm_output and the pools after the step under /outputs and /expected.
TEST(H5pyInterop, SsmItemsAsTheSchemaSays) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(file, DType::kBFloat16, 1);
  file.inputs.weights["in_proj"] = patterned_tensor(DType::kFloat16, {16, 128}, 2);
  file.inputs.weights["D"] = patterned_tensor(DType::kFloat64, {8}, 3);
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 4);
  add_ssm_outputs(*file.outputs, file, DType::kFloat64, 5);
  file.expected = sample_outputs(file, DType::kFloat32, "cuda", 6);
  add_ssm_outputs(*file.expected, file, DType::kFloat32, 7);
  const std::string path = (dir / "batch.h5").string();
  write_batch_file(path, file);
  const std::string output = run_python(dir, R"(
import os, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print("version", f.attrs["schema_version"])
    for k, v in sorted(f["config/ssm"].attrs.items()):
        print("param", k, type(v).__name__, v)
    for path in ("inputs/ssm/conv_state", "inputs/ssm/ssm_state", "weights/in_proj", "weights/D", "weights/extra_rank3",
                 "outputs/ssm_output", "outputs/ssm/ssm_state", "expected/ssm_output", "expected/ssm/conv_state"):
        ds = f[path]
        print(path, ds.dtype.str, ds.attrs["dtype_name"], list(ds.shape))
        open(os.path.join(sys.argv[2], path.replace("/", "_") + ".bin"), "wb").write(ds[()].tobytes())
)", {path, dir.string()});
  EXPECT_THAT(output, HasSubstr(std::string("version ") + kWrittenSchemaVersion + "\n"));
  EXPECT_THAT(output, HasSubstr("param conv_kernel int64 4\nparam dt_rank int64 2\nparam intermediate_size int64 8\n"
                                "param state_size int64 4\n"));
  EXPECT_THAT(output, HasSubstr("inputs/ssm/conv_state <f4 bfloat16 [12, 8, 3]\n"));
  EXPECT_THAT(output, HasSubstr("inputs/ssm/ssm_state <f4 bfloat16 [12, 8, 4]\n"));
  EXPECT_THAT(output, HasSubstr("weights/in_proj <f2 float16 [16, 128]\n"));
  EXPECT_THAT(output, HasSubstr("weights/D <f8 float64 [8]\n"));
  EXPECT_THAT(output, HasSubstr("weights/extra_rank3 <f4 bfloat16 [2, 3, 5]\n"));
  EXPECT_THAT(output, HasSubstr("outputs/ssm_output <f8 float64 [7, 4, 32]\n"));
  EXPECT_THAT(output, HasSubstr("outputs/ssm/ssm_state <f8 float64 [12, 8, 4]\n"));
  EXPECT_THAT(output, HasSubstr("expected/ssm_output <f4 float32 [7, 4, 32]\n"));
  EXPECT_THAT(output, HasSubstr("expected/ssm/conv_state <f4 float32 [12, 8, 3]\n"));
  expect_h5py_saw(file_bytes(dir / "inputs_ssm_conv_state.bin"), file.inputs.ssm_state.at("conv_state"), "conv_state");
  expect_h5py_saw(file_bytes(dir / "weights_extra_rank3.bin"), file.inputs.weights.at("extra_rank3"), "extra_rank3");
  expect_h5py_saw(file_bytes(dir / "weights_in_proj.bin"), file.inputs.weights.at("in_proj"), "in_proj");
  expect_h5py_saw(file_bytes(dir / "weights_D.bin"), file.inputs.weights.at("D"), "D");
  expect_h5py_saw(file_bytes(dir / "outputs_ssm_output.bin"), file.outputs->ssm_output, "/outputs/ssm_output");
  expect_h5py_saw(file_bytes(dir / "expected_ssm_conv_state.bin"), file.expected->ssm_state.at("conv_state"),
                  "/expected/ssm/conv_state");
}

TEST(H5pyInterop, ReadScriptFlagsBadSsmItems) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  BatchFile file = small_batch_file(full_config(DType::kBFloat16, KvCacheDtype::kAuto));
  add_ssm_inputs(file, DType::kFloat32, 1);
  file.outputs = sample_outputs(file, DType::kFloat64, "reference", 2);
  add_ssm_outputs(*file.outputs, file, DType::kFloat64, 3);
  const std::filesystem::path path = dir / "batch.h5";
  write_batch_file(path.string(), file);
  edit_file(path, [](const h5::Group& root) {
    const Tensor pool = patterned_tensor(DType::kFloat32, {kSsmSlots - 1, 8, 4}, 4);
    replace_dataset(root, "/inputs/ssm/ssm_state", H5T_IEEE_F32LE, pool.shape(), pool.data());
    group_at(root, "/inputs/ssm").open_dataset("ssm_state").write_string_attribute("dtype_name", "float32");
    const std::vector<int32_t> weight(8, 1);
    replace_dataset(root, "/weights/D", H5T_STD_I32LE, {8}, weight.data());
    group_at(root, "/weights").open_dataset("D").write_string_attribute("dtype_name", "int32");
    group_at(root, "/config/ssm").write_string_attribute("state_size", "four");
  });
  int status = 0;
  const std::string output = run_script("read_batch_h5py.py", {path.string(), "--check"}, &status);
  EXPECT_EQ(status, 1) << output;
  EXPECT_THAT(output, HasSubstr("/inputs/ssm: the pools do not share num_slots"));
  EXPECT_THAT(output, HasSubstr("/outputs/ssm/ssm_state: shape [12, 8, 4] != /inputs/ssm/ssm_state [11, 8, 4]"));
  EXPECT_THAT(output, HasSubstr("/weights/D: dtype_name 'int32' is not allowed"));
  EXPECT_THAT(output, HasSubstr("/config/ssm: attribute state_size = 'four' is not an integer"));
}

// The write script's SSM example: prefix_sum's float32 pool `state` [num_slots, num_heads, head_size].
TEST(H5pyInterop, WriteScriptPrefixSumSection) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  const std::string path = (dir / "prefix_sum.h5").string();
  int status = 0;
  const std::string written = run_script("write_batch_h5py.py", {path, "--ssm", "prefix_sum", "--seed", "3"}, &status);
  ASSERT_EQ(status, 0) << written;
  const BatchFile file = read_batch_file(path);
  EXPECT_EQ(file.schema_version, "1.1");
  EXPECT_EQ(file.config.ssm_mode, "prefix_sum");
  EXPECT_TRUE(file.config.ssm_params.empty());
  EXPECT_TRUE(file.inputs.weights.empty());
  ASSERT_EQ(file.inputs.ssm_state.size(), 1u);
  const Tensor& state = file.inputs.ssm_state.at("state");
  EXPECT_EQ(state.dtype(), DType::kFloat32);
  EXPECT_EQ(state.shape(), (Shape{8, 4, 32}));
  run_python(dir, R"(
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    open(sys.argv[2], "wb").write(f["inputs/ssm/state"][()].tobytes())
)", {path, (dir / "state.bin").string()});
  expect_h5py_saw(file_bytes(dir / "state.bin"), state, "/inputs/ssm/state");
  const std::string checked = run_script("read_batch_h5py.py", {path, "--check"}, &status);
  EXPECT_EQ(status, 0) << checked;
}

// SSM items written by h5py code in every float dtype (bf16 from float values and from bits, numpy
// int32/uint8 params) read here as h5py sees them.
TEST(H5pyInterop, H5pyWrittenSsmItemsRead) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  const std::string path = (dir / "mamba1.h5").string();
  run_python(dir, R"(
import os, sys, importlib.util, h5py, numpy as np
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
config, batch, inputs = w.example_batch("bfloat16", "auto", 9)
config["ssm_mode"] = "mamba1"
rng = np.random.default_rng(9)
I, N, K, R, H, slots = 8, 4, 4, 2, 4 * 32, 8
bits = rng.integers(0, 1 << 16, size=(slots, I, N), dtype=np.uint64).astype("<u2")
ssm = {
    "params": {"intermediate_size": np.int32(I), "state_size": np.uint8(N), "conv_kernel": K, "dt_rank": R},
    "state": {"conv_state": (rng.standard_normal((slots, I, K - 1)).astype("<f4"), "bfloat16"),
              "ssm_state": (bits, "bfloat16")},
    "weights": {"in_proj": rng.standard_normal((2 * I, H)).astype("<f2"),
                "A_log": rng.standard_normal((I, N)).astype("<f8"),
                "D": rng.standard_normal(I).astype("<f4")},
}
w.write_hybrid_batch(sys.argv[2], config, batch, inputs, provenance={"producer": "test"}, ssm=ssm)
open(os.path.join(sys.argv[3], "ssm_state_bits.bin"), "wb").write(bits.tobytes())
with h5py.File(sys.argv[2], "r") as f:
    for path in ("inputs/ssm/conv_state", "inputs/ssm/ssm_state", "weights/in_proj", "weights/A_log", "weights/D"):
        open(os.path.join(sys.argv[3], path.replace("/", "_") + ".bin"), "wb").write(f[path][()].tobytes())
)", {(source_dir() / "harness/scripts/write_batch_h5py.py").string(), path, dir.string()});
  const BatchFile file = read_batch_file(path);
  EXPECT_EQ(file.schema_version, "1.1");
  EXPECT_EQ(file.config.ssm_params, (std::map<std::string, int64_t>{
                                        {"conv_kernel", 4}, {"dt_rank", 2}, {"intermediate_size", 8}, {"state_size", 4}}));
  const std::map<std::string, Tensor>& pools = file.inputs.ssm_state;
  const std::map<std::string, Tensor>& weights = file.inputs.weights;
  ASSERT_EQ(pools.size(), 2u);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_EQ(pools.at("conv_state").dtype(), DType::kBFloat16);
  EXPECT_EQ(pools.at("ssm_state").shape(), (Shape{8, 8, 4}));
  EXPECT_EQ(weights.at("in_proj").dtype(), DType::kFloat16);
  EXPECT_EQ(weights.at("A_log").dtype(), DType::kFloat64);
  EXPECT_EQ(weights.at("D").dtype(), DType::kFloat32);
  expect_h5py_saw(file_bytes(dir / "inputs_ssm_conv_state.bin"), pools.at("conv_state"), "conv_state");
  expect_h5py_saw(file_bytes(dir / "inputs_ssm_ssm_state.bin"), pools.at("ssm_state"), "ssm_state");
  // bf16 given as bits (NaN payloads included) arrives bit for bit.
  EXPECT_EQ(file_bytes(dir / "ssm_state_bits.bin"),
            std::string(static_cast<const char*>(pools.at("ssm_state").data()),
                        static_cast<size_t>(pools.at("ssm_state").nbytes())));
  expect_h5py_saw(file_bytes(dir / "weights_in_proj.bin"), weights.at("in_proj"), "in_proj");
  expect_h5py_saw(file_bytes(dir / "weights_A_log.bin"), weights.at("A_log"), "A_log");
  expect_h5py_saw(file_bytes(dir / "weights_D.bin"), weights.at("D"), "D");
}

// The h5py writer's bf16 rounding agrees with ours (round to nearest even; NaN stays NaN).
TEST(H5pyInterop, WriteScriptRoundsBfloat16LikeTheLibrary) {
  SKIP_WITHOUT_H5PY();
  const std::filesystem::path dir = scratch_dir();
  const std::string output = run_python(dir, R"(
import sys, importlib.util, numpy as np
spec = importlib.util.spec_from_file_location("w", sys.argv[1])
w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)
rng = np.random.default_rng(3)
x = np.concatenate([rng.standard_normal(2000).astype("<f4") * 1e3,
                    np.array([0.0, -0.0, 1.00390625, 1.01171875, 3.4e38, -3.4e38, np.inf, 1e-40, np.nan], dtype="<f4")])
for value, bits in zip(x, w.to_bfloat16_bits(x)):
    print("%08x %04x" % (np.array(value, dtype="<f4").view("<u4"), bits))
)", {(source_dir() / "harness/scripts/write_batch_h5py.py").string()});
  int checked = 0;
  for (const std::string& line : lines_of(output)) {
    unsigned value_bits = 0, bf16_bits = 0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%x %x", &value_bits, &bf16_bits), 2) << line;
    float value = 0;
    std::memcpy(&value, &value_bits, 4);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(bfloat16_to_float(static_cast<uint16_t>(bf16_bits))));
    } else {
      EXPECT_EQ(bf16_bits, float_to_bfloat16(value)) << "value bits " << std::hex << value_bits;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2009);
}

}  // namespace
}  // namespace hybridtb::testing
