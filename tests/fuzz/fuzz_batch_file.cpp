// fuzz_batch_file: structure-aware fuzzing of the batch-file loader and validator ("Bad
// input, hardened"). Seeded, deterministic and bounded; CI runs it under ASan + UBSan
// (harness/scripts/sanitizer-tests.sh), the test suite runs a short smoke (`ctest -L fuzz`).
//
//   fuzz_batch_file --work DIR (--iterations N | --seconds S) [--seed S] [--only I] [--no-run] SEED_FILE...
//
// Each iteration copies one valid seed file (a hybrid-batch file; directories are searched for
// *.h5), applies 1–3 random mutations *through the HDF5 API* and then loads the result exactly as
// `hybridtb` does: read_batch_file (which validates), the SSM mode's tensor checks, and for files
// that load, the reference backend's step and the comparison with /expected. Every outcome must be
// success or a hybridtb::Error; any other exception is a finding (printed with the mutations, the
// file kept as DIR/finding-<iteration>.h5, exit 1), and a crash or sanitizer report fails the
// process. DIR/current.h5 and DIR/current.txt (its mutations) hold the last input, so a crash
// leaves its reproducer behind; `--only I` replays iteration I of a seed alone.
//
// Why through the HDF5 API and not byte flips: HDF5 1.10.8 itself crashes on some corrupt
// metadata (datasets/SCHEMA.md §11), so a byte-level fuzzer mostly finds HDF5's bugs. Mutating
// values, shapes, types, attributes and the presence of items keeps every file well-formed HDF5
// and aims at our code: the reader's type/shape/size checks, the validator, the builders and the
// reference backend. Raw data bytes (tensor values: NaN, Inf, any bit pattern) are mutated too.
// Not covered: corrupt HDF5 metadata (superblock, object headers, B-trees, heaps) and filters;
// the broken-file corpus (tests/broken) covers truncation and non-HDF5 files by hand.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <typeinfo>
#include <vector>

#include "hybridtb/backend.h"
#include "hybridtb/batch_file.h"
#include "hybridtb/compare.h"
#include "hybridtb/error.h"
#include "hybridtb/reference/linear_layer.h"
#include "hybridtb/reference/ssm_mode.h"
#include "hybridtb/step.h"
#include "io/hdf5.h"

namespace fs = std::filesystem;
using namespace hybridtb;

namespace {

// --- the file's structure, as the mutators see it -------------------------------------------------

struct Item {
  std::string path;  // "/batch/seq_lens"
  bool is_dataset = false;
};

std::string parent_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 ? "/" : path.substr(0, slash);
}
std::string name_of(const std::string& path) { return path.substr(path.rfind('/') + 1); }

h5::Group open_group(const h5::File& file, const std::string& path) {
  return path == "/" ? file.root() : file.root().open_group(path.substr(1));
}

void collect(const h5::Group& group, const std::string& path, std::vector<Item>& items, int depth) {
  if (depth > 8) return;
  for (const std::string& name : group.child_names()) {
    const std::string child = path == "/" ? "/" + name : path + "/" + name;
    switch (group.child_kind(name)) {
      case h5::ObjectKind::kGroup:
        items.push_back({child, false});
        collect(group.open_group(name), child, items, depth + 1);
        break;
      case h5::ObjectKind::kDataset: items.push_back({child, true}); break;
      default: break;
    }
  }
}

// --- random choices ---------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(engine_() % n); }
  bool coin() { return (engine_() & 1) != 0; }
  template <typename T>
  const T& pick(const std::vector<T>& values) { return values[below(values.size())]; }

 private:
  std::mt19937_64 engine_;
};

// splitmix64: independent, reproducible per-iteration seeds from (seed, iteration).
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Integers that sit on the validators' boundaries: signs, int32/int64 limits, block sizes, and
// neighbours of the current value (off-by-one is where index checks fail).
int64_t interesting_int(Rng& rng, int64_t current) {
  static const std::vector<int64_t> values = {
      0, 1, -1, 2, -2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 127, 128, 255, 256, 1023, 1024, 4096, 65535, 65536,
      std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::max() - 1,
      std::numeric_limits<int32_t>::min(), int64_t{1} << 31, int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 62,
      std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
  // Wrapping arithmetic (through uint64): the fuzzer itself must not overflow at the extremes.
  const auto wrap = [](uint64_t x) { return static_cast<int64_t>(x); };
  const uint64_t bits = static_cast<uint64_t>(current);
  switch (rng.below(6)) {
    case 0: return wrap(bits + 1);
    case 1: return wrap(bits - 1);
    case 2: return wrap(0 - bits);
    case 3: return wrap(bits * 2);
    default: return rng.pick(values);
  }
}

double interesting_float(Rng& rng, double current) {
  static const std::vector<double> values = {0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, 1e30, 1e300,
                                             std::numeric_limits<double>::infinity(),
                                             -std::numeric_limits<double>::infinity(),
                                             std::numeric_limits<double>::quiet_NaN(),
                                             std::numeric_limits<double>::denorm_min()};
  return rng.coin() ? rng.pick(values) : current * (rng.coin() ? 2.0 : -1.0);
}

std::string interesting_string(Rng& rng) {
  static const std::vector<std::string> values = {
      "", "none", "auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head",
      "float32", "float16", "bfloat16", "float64", "int8", "int32", "int64", "bool", "float8_e4m3fn",
      "float8_e5m2", "decoder", "encoder_only", "all", "align", "full", "piecewise", "full_and_piecewise",
      "zero", "prefix_sum", "prefix_sum_flat", "mamba1", "ema", "hybrid-batch", "1.0", "1.1", "1.99", "2.0",
      "1", "1.x", "0.9", std::string(300, 'x'), "caf\xc3\xa9", "bad\x01name"};
  return rng.pick(values);
}

// --- one mutation -------------------------------------------------------------------------------

struct Mutator {
  const h5::File& file;
  Rng& rng;
  std::vector<std::string>& log;

  std::vector<Item> items() const {
    std::vector<Item> all;
    collect(file.root(), "/", all, 0);
    return all;
  }
  std::vector<std::string> datasets() const {
    std::vector<std::string> out;
    for (const Item& item : items()) {
      if (item.is_dataset) out.push_back(item.path);
    }
    return out;
  }
  h5::Dataset open_dataset(const std::string& path) const { return file.root().open_dataset(path.substr(1)); }

  // Raw bytes of a whole dataset (no conversion) and its element size; empty for null dataspaces.
  std::vector<unsigned char> read_bytes(const h5::Dataset& d, size_t* element_size) const {
    const h5::Type type = d.file_type();
    *element_size = h5::inspect_type(type.id()).size;
    int64_t count = 1;
    for (const int64_t dim : d.shape()) count *= dim;
    // Only small datasets are rewritten (the seeds are small; a mutated shape may not be).
    if (count < 0 || count * static_cast<int64_t>(*element_size) > (int64_t{64} << 20)) {
      throw Error("dataset too large to mutate");
    }
    std::vector<unsigned char> bytes(static_cast<size_t>(count) * *element_size);
    if (!bytes.empty()) d.read_raw(type.id(), bytes.data());
    return bytes;
  }

  // Recreates dataset `path` with `type` and `shape`, filled with `bytes` (resized to fit, the
  // rest random), keeping its dtype_name unless told otherwise.
  void recreate(const std::string& path, hid_t type, const Shape& shape, std::vector<unsigned char> bytes,
                bool keep_dtype_name) const {
    std::string dtype_name;
    bool had_name = false;
    {
      const h5::Dataset old = open_dataset(path);
      if (old.has_attribute("dtype_name") && old.attribute_kind("dtype_name") == h5::AttributeKind::kString) {
        dtype_name = old.read_string_attribute("dtype_name");
        had_name = true;
      }
    }
    const h5::Group parent = open_group(file, parent_of(path));
    parent.remove_child(name_of(path));
    int64_t count = 1;
    for (const int64_t dim : shape) count *= dim;
    const size_t size = static_cast<size_t>(count) * H5Tget_size(type);
    const size_t old_size = bytes.size();
    bytes.resize(size);
    for (size_t i = old_size; i < size; ++i) bytes[i] = static_cast<unsigned char>(rng.next());
    const h5::Dataset d = parent.create_dataset(name_of(path), type, shape);
    if (size > 0) d.write_raw(type, bytes.data());
    if (had_name && keep_dtype_name) d.write_string_attribute("dtype_name", dtype_name);
  }

  // The objects that carry attributes: the root, every group, every dataset.
  std::string random_object() const {
    std::vector<Item> all = items();
    if (all.empty() || rng.below(4) == 0) return "/";
    return rng.pick(all).path;
  }
  std::unique_ptr<h5::Object> open_object(const std::string& path) const {
    if (path == "/") return std::make_unique<h5::Group>(file.root());
    const h5::Group parent = open_group(file, parent_of(path));
    if (parent.child_kind(name_of(path)) == h5::ObjectKind::kGroup) {
      return std::make_unique<h5::Group>(parent.open_group(name_of(path)));
    }
    return std::make_unique<h5::Dataset>(parent.open_dataset(name_of(path)));
  }

  void set_attribute() const {
    const std::string path = random_object();
    const auto object = open_object(path);
    const std::vector<std::string> names = object->attribute_names();
    if (names.empty()) return;
    const std::string& name = rng.pick(names);
    const std::string where = path + "@" + name;
    switch (object->attribute_kind(name)) {
      case h5::AttributeKind::kInteger: {
        const int64_t value = interesting_int(rng, object->read_int_attribute(name));
        object->write_int_attribute(name, value);
        log.push_back("set int " + where + " = " + std::to_string(value));
        return;
      }
      case h5::AttributeKind::kFloat: {
        const double value = interesting_float(rng, object->read_float_attribute(name));
        object->write_float_attribute(name, value);
        log.push_back("set float " + where + " = " + std::to_string(value));
        return;
      }
      default: {
        // Strings (and anything else): another string, or a value of another kind.
        switch (rng.below(4)) {
          case 0: object->write_int_attribute(name, interesting_int(rng, 0)); log.push_back("set " + where + " to an int"); return;
          case 1: object->write_float_attribute(name, 1.5); log.push_back("set " + where + " to a float"); return;
          default: {
            const std::string value = interesting_string(rng);
            object->write_string_attribute(name, value);
            log.push_back("set string " + where + " = '" + value.substr(0, 40) + "'");
          }
        }
      }
    }
  }

  void remove_attribute() const {
    const std::string path = random_object();
    const auto object = open_object(path);
    const std::vector<std::string> names = object->attribute_names();
    if (names.empty()) return;
    const std::string& name = rng.pick(names);
    object->remove_attribute(name);
    log.push_back("remove attribute " + path + "@" + name);
  }

  void add_attribute() const {
    const std::string path = random_object();
    const auto object = open_object(path);
    const std::string name = rng.coin() ? "fuzz_extra" : interesting_string(rng);
    if (name.empty() || name.find('/') != std::string::npos || name == ".") return;
    object->write_int_attribute(name, interesting_int(rng, 0));
    log.push_back("add attribute " + path + "@" + name);
  }

  // Integer datasets: a few elements set to boundary values (or copied from elsewhere in the array).
  void mutate_integers() const {
    std::vector<std::string> candidates;
    for (const std::string& path : datasets()) {
      if (open_dataset(path).type_info().type_class == H5T_INTEGER) candidates.push_back(path);
    }
    if (candidates.empty()) return;
    const std::string& path = rng.pick(candidates);
    const h5::Dataset d = open_dataset(path);
    size_t size = 0;
    std::vector<unsigned char> bytes = read_bytes(d, &size);
    const size_t count = size == 0 ? 0 : bytes.size() / size;
    if (count == 0) return;
    const size_t edits = 1 + rng.below(3);
    for (size_t e = 0; e < edits; ++e) {
      const size_t i = rng.below(count);
      int64_t current = 0;
      std::memcpy(&current, bytes.data() + i * size, std::min<size_t>(size, 8));  // little-endian low bytes
      int64_t value = interesting_int(rng, current);
      if (rng.below(4) == 0) {  // another element of the same array (duplicates, order breaks)
        value = 0;
        std::memcpy(&value, bytes.data() + rng.below(count) * size, std::min<size_t>(size, 8));
      }
      std::memcpy(bytes.data() + i * size, &value, std::min<size_t>(size, 8));  // truncated to the width
      log.push_back("set " + path + "[" + std::to_string(i) + "] = " + std::to_string(value) + " (" +
                    std::to_string(size) + "-byte storage)");
    }
    d.write_raw(d.file_type().id(), bytes.data());
  }

  // Any dataset's raw bytes: random bytes (NaN/Inf/subnormal patterns in float tensors).
  void mutate_bytes() const {
    const std::vector<std::string> all = datasets();
    if (all.empty()) return;
    const std::string& path = rng.pick(all);
    const h5::Dataset d = open_dataset(path);
    size_t size = 0;
    std::vector<unsigned char> bytes = read_bytes(d, &size);
    if (bytes.empty()) return;
    const size_t edits = 1 + rng.below(8);
    for (size_t e = 0; e < edits; ++e) bytes[rng.below(bytes.size())] = rng.coin() ? 0xFF : static_cast<unsigned char>(rng.next());
    d.write_raw(d.file_type().id(), bytes.data());
    log.push_back("overwrite " + std::to_string(edits) + " raw bytes of " + path);
  }

  void reshape() const {
    const std::vector<std::string> all = datasets();
    if (all.empty()) return;
    const std::string& path = rng.pick(all);
    Shape shape;
    std::vector<unsigned char> bytes;
    h5::Type type;
    {
      const h5::Dataset d = open_dataset(path);
      shape = d.shape();
      size_t size = 0;
      bytes = read_bytes(d, &size);
      type = d.file_type();
    }
    switch (rng.below(5)) {
      case 0: if (!shape.empty()) shape.pop_back(); break;
      case 1: shape.push_back(1 + static_cast<int64_t>(rng.below(2))); break;
      case 2: if (!shape.empty()) shape[rng.below(shape.size())] += 1; break;
      case 3: if (!shape.empty()) { auto& dim = shape[rng.below(shape.size())]; dim = std::max<int64_t>(0, dim - 1); } break;
      default: if (!shape.empty()) shape[rng.below(shape.size())] = 0; break;
    }
    int64_t count = 1;
    for (const int64_t dim : shape) count *= dim;
    if (count > (int64_t{16} << 20)) return;
    recreate(path, type.id(), shape, std::move(bytes), true);
    log.push_back("reshape " + path + " to " + shape_to_string(shape));
  }

  void retype() const {
    const std::vector<std::string> all = datasets();
    if (all.empty()) return;
    const std::string& path = rng.pick(all);
    Shape shape;
    std::vector<unsigned char> bytes;
    {
      const h5::Dataset d = open_dataset(path);
      shape = d.shape();
      size_t size = 0;
      bytes = read_bytes(d, &size);
    }
    const std::vector<std::pair<const char*, hid_t>> predefined = {
        {"int8", H5T_STD_I8LE},     {"uint8", H5T_STD_U8LE},     {"int16", H5T_STD_I16LE},  {"uint16", H5T_STD_U16LE},
        {"int32", H5T_STD_I32LE},   {"uint32", H5T_STD_U32LE},   {"int64", H5T_STD_I64LE},  {"uint64", H5T_STD_U64LE},
        {"int32be", H5T_STD_I32BE}, {"float32", H5T_IEEE_F32LE}, {"float64", H5T_IEEE_F64LE}, {"float32be", H5T_IEEE_F32BE}};
    const size_t choice = rng.below(predefined.size() + 2);
    const h5::Type type = choice == predefined.size()       ? h5::bfloat16_type()
                          : choice == predefined.size() + 1 ? h5::float16_type()
                                                            : h5::Type::copy_of(predefined[choice].second);
    const bool keep_name = rng.coin();
    recreate(path, type.id(), shape, std::move(bytes), keep_name);
    log.push_back("retype " + path + " to " + h5::describe_type(type.id()) + (keep_name ? "" : ", without dtype_name"));
  }

  void set_dtype_name() const {
    const std::vector<std::string> all = datasets();
    if (all.empty()) return;
    const std::string& path = rng.pick(all);
    const h5::Dataset d = open_dataset(path);
    if (rng.below(3) == 0) {
      if (d.has_attribute("dtype_name")) d.remove_attribute("dtype_name");
      log.push_back("remove dtype_name of " + path);
    } else {
      const std::string value = interesting_string(rng);
      d.write_string_attribute("dtype_name", value);
      log.push_back("dtype_name of " + path + " = '" + value.substr(0, 40) + "'");
    }
  }

  void remove_item() const {
    const std::vector<Item> all = items();
    if (all.empty()) return;
    const Item& item = rng.pick(all);
    open_group(file, parent_of(item.path)).remove_child(name_of(item.path));
    log.push_back("remove " + item.path);
  }

  // A dataset turned into an empty group, a scalar or a null dataspace.
  void replace_dataset() const {
    const std::vector<std::string> all = datasets();
    if (all.empty()) return;
    const std::string& path = rng.pick(all);
    const h5::Group parent = open_group(file, parent_of(path));
    parent.remove_child(name_of(path));
    switch (rng.below(3)) {
      case 0: parent.create_group(name_of(path)); log.push_back("replace " + path + " with a group"); break;
      case 1: {
        const h5::Type type = h5::Type::copy_of(H5T_IEEE_F32LE);
        const float value = 1.0f;
        parent.create_dataset(name_of(path), type.id(), {}).write_raw(type.id(), &value);
        log.push_back("replace " + path + " with a float32 scalar");
        break;
      }
      default: {
        const h5::Type type = h5::Type::copy_of(H5T_STD_I32LE);
        parent.create_null_dataset(name_of(path), type.id());
        log.push_back("replace " + path + " with a null dataspace");
      }
    }
  }

  void add_dataset() const {
    std::vector<std::string> groups = {"/"};
    for (const Item& item : items()) {
      if (!item.is_dataset) groups.push_back(item.path);
    }
    const std::string& group = rng.pick(groups);
    // Names the reader knows (optional items appearing where they may or may not belong) or not.
    static const std::vector<std::string> names = {"fuzz_extra", "ssm", "weights", "sinks", "alibi_slopes",
                                                   "output_scale", "k_scale_cache", "mm_prefix_range",
                                                   "ssm_block_table", "num_accepted_tokens", "expected", "outputs",
                                                   "state"};
    const std::string& name = rng.pick(names);
    const h5::Group parent = open_group(file, group);
    if (parent.child_kind(name) != h5::ObjectKind::kMissing) return;
    const h5::Type type = h5::Type::copy_of(rng.coin() ? H5T_IEEE_F32LE : H5T_STD_I32LE);
    const Shape shape{1 + static_cast<int64_t>(rng.below(8)), 1 + static_cast<int64_t>(rng.below(4))};
    std::vector<unsigned char> bytes(static_cast<size_t>(shape[0] * shape[1]) * 4);
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rng.below(4));  // small values
    parent.create_dataset(name, type.id(), shape).write_raw(type.id(), bytes.data());
    log.push_back("add dataset " + (group == "/" ? "" : group) + "/" + name + " " + shape_to_string(shape));
  }

  void apply_one() const {
    // Value edits are the most productive (they reach the validator and the backend), so they
    // come up most often; structural edits mostly exercise the reader.
    switch (rng.below(16)) {
      case 0: case 1: case 2: mutate_integers(); break;
      case 3: case 4: set_attribute(); break;
      case 5: mutate_bytes(); break;
      case 6: reshape(); break;
      case 7: retype(); break;
      case 8: set_dtype_name(); break;
      case 9: remove_item(); break;
      case 10: remove_attribute(); break;
      case 11: replace_dataset(); break;
      case 12: add_dataset(); break;
      case 13: add_attribute(); break;
      default: mutate_integers(); break;
    }
  }
};

// --- loading a mutated file as hybridtb does ---------------------------------------------------------

enum class Outcome { kRan, kLoaded, kRejected };

Outcome exercise(const std::string& path, bool run, std::string* message) {
  try {
    const BatchFile file = read_batch_file(path);
    const StepTensors views = file.inputs.views();
    if (file.config.is_linear_layer()) {
      reference::ssm::validate_linear_tensors(file.config, views.ssm_state, views.weights);
    } else if (file.config.has_ssm_branch()) {
      reference::ssm::validate_ssm_tensors(file.config, views.ssm_state, views.weights);
    }
    if (!run) return Outcome::kLoaded;
    auto backend = create_backend("reference", BackendSettings{file.config, file.builder});
    const StepOutputs outputs = run_step(*backend, file);
    if (file.expected) {
      CompareOptions options;
      options.check_expected_padding = false;  // as replay does
      (void)compare_step(file, outputs, *file.expected, options);
    }
    return Outcome::kRan;
  } catch (const Error& e) {  // NotSupported included: both are clean refusals
    *message = e.what();
    return Outcome::kRejected;
  }
}

struct Options {
  fs::path work;
  uint64_t seed = 1;
  int64_t iterations = 0;
  double seconds = 0;
  int64_t only = -1;
  bool run = true;
  std::vector<fs::path> seeds;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "fuzz_batch_file: " << problem
            << "\nusage: fuzz_batch_file --work DIR (--iterations N | --seconds S) [--seed S] [--only I] [--no-run] "
               "SEED_FILE_OR_DIR...\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--work") opt.work = value();
      else if (arg == "--seed") opt.seed = std::stoull(value());
      else if (arg == "--iterations") opt.iterations = std::stoll(value());
      else if (arg == "--seconds") opt.seconds = std::stod(value());
      else if (arg == "--only") opt.only = std::stoll(value());
      else if (arg == "--no-run") opt.run = false;
      else if (!arg.empty() && arg[0] == '-') usage("unknown option " + arg);
      else if (fs::is_directory(arg)) {
        for (const auto& entry : fs::directory_iterator(arg)) {
          if (entry.path().extension() == ".h5") opt.seeds.push_back(entry.path());
        }
      } else if (fs::is_regular_file(arg)) {
        opt.seeds.push_back(arg);
      } else {
        usage("no such seed file or directory: " + arg);
      }
    } catch (const std::logic_error&) {
      usage("bad value for " + arg);
    }
  }
  if (opt.work.empty()) usage("--work DIR is required");
  if (opt.iterations <= 0 && opt.seconds <= 0 && opt.only < 0) usage("give a budget: --iterations N or --seconds S");
  if (opt.seeds.empty()) usage("no seed files");
  std::sort(opt.seeds.begin(), opt.seeds.end());  // directory order is not deterministic
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  fs::create_directories(opt.work);
  const h5::ErrorSilencer silence;
  const fs::path current = opt.work / "current.h5";
  const fs::path current_log = opt.work / "current.txt";

  std::map<std::string, int64_t> outcomes;
  std::set<std::string> distinct_errors;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int64_t iteration = opt.only >= 0 ? opt.only : 0;
  int64_t done = 0;
  for (;; ++iteration, ++done) {
    if (opt.only >= 0 ? done == 1
                      : (opt.iterations > 0 && done >= opt.iterations) || (opt.seconds > 0 && elapsed() >= opt.seconds)) {
      break;
    }
    Rng rng(mix(opt.seed ^ mix(static_cast<uint64_t>(iteration))));
    const fs::path& source = rng.pick(opt.seeds);
    fs::copy_file(source, current, fs::copy_options::overwrite_existing);
    fs::permissions(current, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    std::vector<std::string> log = {"iteration " + std::to_string(iteration) + " (seed " + std::to_string(opt.seed) +
                                    ") of " + source.string()};
    try {
      h5::File file = h5::File::open_read_write(current.string());
      const Mutator mutator{file, rng, log};
      const size_t count = 1 + rng.below(3);
      for (size_t m = 0; m < count; ++m) {
        try {
          mutator.apply_one();
        } catch (const Error& e) {
          log.push_back(std::string("(mutation skipped: ") + e.what() + ")");
          ++outcomes["mutations skipped"];
        }
      }
      file.close();
    } catch (const Error& e) {
      log.push_back(std::string("(file could not be mutated: ") + e.what() + ")");
    }
    {
      std::ofstream out(current_log);
      for (const std::string& line : log) out << line << "\n";
    }
    if (opt.only >= 0) {
      for (const std::string& line : log) std::cout << line << "\n";
    }

    std::string message;
    try {
      switch (exercise(current.string(), opt.run, &message)) {
        case Outcome::kRan: ++outcomes["loaded and ran"]; break;
        case Outcome::kLoaded: ++outcomes["loaded"]; break;
        case Outcome::kRejected:
          ++outcomes["rejected (hybridtb::Error)"];
          distinct_errors.insert(message.substr(message.find(": ") + 2, 60));
          if (opt.only >= 0) std::cout << "rejected: " << message << "\n";
          break;
      }
    } catch (const std::exception& e) {
      const fs::path kept = opt.work / ("finding-" + std::to_string(iteration) + ".h5");
      fs::copy_file(current, kept, fs::copy_options::overwrite_existing);
      std::cerr << "fuzz_batch_file: FINDING: not a hybridtb::Error: " << typeid(e).name() << ": " << e.what() << "\n";
      for (const std::string& line : log) std::cerr << "  " << line << "\n";
      std::cerr << "  kept as " << kept.string() << "; reproduce: --seed " << opt.seed << " --only " << iteration << "\n";
      return 1;
    }
  }
  std::cout << "fuzz_batch_file: " << done << " iterations in " << std::fixed;
  std::cout.precision(1);
  std::cout << elapsed() << " s (seed " << opt.seed << ", " << opt.seeds.size() << " seed files):";
  for (const auto& [what, n] : outcomes) std::cout << " " << what << " " << n << ";";
  std::cout << " " << distinct_errors.size() << " distinct error messages; no findings\n";
  return 0;
}
