// Reading, validating and atomically writing hybrid-batch files (schema in datasets/SCHEMA.md).
//
// The reader is liberal where h5py users differ (integer widths, fixed or variable strings, 0-d or
// one-element scalars) and strict about meaning: every required item must be present with the
// shape the config implies, and errors name the dataset and the expected shape. The writer is
// strict and canonical. Tested by tests/io/.
#include "hybridtb/batch_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <string>
#include <utility>

#include "hybridtb/engine_rules.h"
#include "hybridtb/error.h"
#include "hybridtb/linear_layer.h"
#include "hybridtb/temporary_files.h"
#include "io/hdf5.h"

namespace hybridtb {

namespace {

// --- progress of a file transfer ---------------------------------------------------------------

// The read or write of one file in progress on this thread (read_batch_file and the writers set
// it for their duration), reported in MiB to a FileProgress sink. read_tensor_data and
// write_tensor report to it and move tensors above kSliceBytes in slices of rows.
class Transfer {
 public:
  static constexpr int64_t kSliceBytes = int64_t{64} << 20;

  Transfer(const FileProgress& progress, std::string stage, int64_t total_bytes)
      : sink_(progress.sink), stage_(std::move(stage)), total_mib_(mib(total_bytes)), previous_(active_) {
    active_ = this;
    if (sink_ != nullptr) sink_->report(stage_, 0, total_mib_, 0.0);
  }
  ~Transfer() { active_ = previous_; }
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  static Transfer* active() { return active_; }
  bool reporting() const { return sink_ != nullptr; }

  void moved(int64_t bytes) {
    done_bytes_ += bytes;
    if (sink_ == nullptr) return;
    // The total is an estimate: never report the end before finish().
    const int64_t done = std::min(mib(done_bytes_), std::max<int64_t>(total_mib_ - 1, 0));
    if (done > reported_) {
      reported_ = done;
      sink_->report(stage_, done, total_mib_, static_cast<double>(done) / static_cast<double>(total_mib_));
    }
  }
  void finish() {
    if (sink_ != nullptr) sink_->report(stage_, total_mib_, total_mib_, 1.0);
  }

 private:
  static int64_t mib(int64_t bytes) { return std::max<int64_t>((bytes + (int64_t{1} << 20) - 1) >> 20, 1); }

  ProgressSink* sink_;
  std::string stage_;
  int64_t total_mib_;
  int64_t done_bytes_ = 0;
  int64_t reported_ = 0;
  Transfer* previous_;
  static thread_local Transfer* active_;
};

thread_local Transfer* Transfer::active_ = nullptr;

// Moves a dataset of `total_bytes` whose dimension 0 is shape[0]: in one call
// (move(kWholeDataset, 0)), or, while a listening transfer is active and it is above kSliceBytes,
// in slices of rows (move(first_row, row_count)), reporting the bytes moved to the transfer.
constexpr int64_t kWholeDataset = -1;

template <typename MoveRows>
void move_in_slices(const Shape& shape, int64_t total_bytes, MoveRows move) {
  Transfer* transfer = Transfer::active();
  const bool sliced = transfer != nullptr && transfer->reporting() && !shape.empty() && shape[0] >= 2 &&
                      total_bytes > Transfer::kSliceBytes;
  if (!sliced) {
    move(kWholeDataset, int64_t{0});
    if (transfer != nullptr) transfer->moved(total_bytes);
    return;
  }
  const int64_t row_bytes = total_bytes / shape[0];
  const int64_t slice = std::max<int64_t>(Transfer::kSliceBytes / std::max<int64_t>(row_bytes, 1), 1);
  for (int64_t row = 0; row < shape[0]; row += slice) {
    const int64_t rows = std::min(slice, shape[0] - row);
    move(row, rows);
    transfer->moved(rows * row_bytes);
  }
}

int64_t tensor_data_bytes(const StepOutputs& out) {
  int64_t bytes = out.output.nbytes() + out.attn_output.nbytes() + out.kv_cache.nbytes() + out.k_scale_cache.nbytes() +
                  out.v_scale_cache.nbytes() + out.ssm_output.nbytes();
  for (const auto& [name, pool] : out.ssm_state) bytes += pool.nbytes();
  return bytes;
}

// The bytes of tensor data a writer moves: the progress total of a write.
int64_t tensor_data_bytes(const BatchFile& file, bool with_inputs) {
  int64_t bytes = 0;
  if (with_inputs) {
    bytes += file.inputs.nbytes();
    if (file.expected) bytes += tensor_data_bytes(*file.expected);
  }
  if (file.outputs) bytes += tensor_data_bytes(*file.outputs);
  return bytes;
}


using h5::AttributeKind;
using h5::Dataset;
using h5::Group;
using h5::ObjectKind;

constexpr const char* kDtypeName = "dtype_name";

// --- shapes ------------------------------------------------------------------------------------

// One expected dimension: a named size ("T=7"), a literal ("2") or a free one (size < 0).
struct Dim {
  std::string name;
  int64_t size = -1;
};
using Dims = std::vector<Dim>;

std::string dims_to_string(const Dims& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) out += ", ";
    if (dims[i].name.empty()) {
      out += std::to_string(dims[i].size);
    } else if (dims[i].size < 0) {
      out += dims[i].name;
    } else {
      out += dims[i].name + "=" + std::to_string(dims[i].size);
    }
  }
  return out + "]";
}

// "[T, num_heads, head_size]": the dims without sizes, for "required: …" messages.
std::string dim_names(const Dims& dims) {
  Dims names = dims;
  for (Dim& dim : names) {
    if (!dim.name.empty()) dim.size = -1;
  }
  return dims_to_string(names);
}

void check_shape(const std::string& path, const Shape& shape, const Dims& dims) {
  bool ok = shape.size() == dims.size();
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = dims[i].size < 0 || dims[i].size == shape[i];
  HYBRIDTB_CHECK(ok, path, ": shape ", shape_to_string(shape), " does not match ", dims_to_string(dims));
}

Dims token_dims(int64_t tokens, const AttentionConfig& c, bool kv_heads) {
  return {{"T", tokens},
          kv_heads ? Dim{"num_kv_heads", c.num_kv_heads} : Dim{"num_heads", c.num_heads},
          {"head_size", c.head_size}};
}
Dims kv_cache_dims(int64_t num_blocks, const AttentionConfig& c) {
  return {{"num_blocks", num_blocks}, {"", 2}, {"block_size", c.block_size}, {"num_kv_heads", c.num_kv_heads},
          {"head_size", c.head_size}};
}
Dims scale_cache_dims(int64_t num_blocks, const AttentionConfig& c) {
  return {{"num_blocks", num_blocks}, {"block_size", c.block_size}, {"num_kv_heads", c.num_kv_heads}};
}

// --- element types -----------------------------------------------------------------------------

bool is_integer_dtype(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kInt32 || dtype == DType::kInt64;
}

// Whether HDF5 storage `info` can hold elements of `dtype` bit for bit.
bool storage_holds(DType dtype, const h5::TypeInfo& info) {
  const bool integer = info.type_class == H5T_INTEGER;
  switch (dtype) {
    case DType::kFloat64:
    case DType::kFloat32:
      return info.float_dtype == dtype;
    case DType::kFloat16:
    case DType::kBFloat16:
      // uint16/int16 bit patterns are what h5py users write when they cannot build a float type.
      return info.float_dtype == dtype || (integer && info.size == 2);
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return integer && info.size == 1;
    case DType::kInt8:
      return integer && info.size == 1 && info.is_signed;
    case DType::kInt32:
      return integer && info.size == 4 && info.is_signed;
    case DType::kInt64:
      return integer && info.size == 8 && info.is_signed;
    case DType::kBool:
      return (integer || info.type_class == H5T_ENUM) && info.size == 1;  // h5py stores bool as an enum
  }
  return false;
}

void check_little_endian(const Dataset& dataset, const h5::TypeInfo& info) {
  HYBRIDTB_CHECK(!(info.big_endian && info.size > 1), dataset.path(),
                 ": big-endian data is not supported (store it little-endian, e.g. numpy '<' dtypes)");
}

std::optional<DType> named_dtype(const Dataset& dataset) {
  if (!dataset.has_attribute(kDtypeName)) return std::nullopt;
  const std::string where = "attribute " + dataset.child_path(kDtypeName);
  return dtype_from_string(dataset.read_string_attribute(kDtypeName), where);
}

// The element type of a tensor dataset: its dtype_name when present (checked against the
// storage), else what the HDF5 type unambiguously says.
DType tensor_dtype(const Dataset& dataset) {
  const h5::Type type = dataset.file_type();
  const h5::TypeInfo info = h5::inspect_type(type.id());
  check_little_endian(dataset, info);
  if (const std::optional<DType> named = named_dtype(dataset)) {
    HYBRIDTB_CHECK(storage_holds(*named, info), dataset.path(), ": dtype_name ", to_string(*named),
                   " does not match its HDF5 storage ", h5::describe_type(type.id()));
    return *named;
  }
  if (info.float_dtype) return *info.float_dtype;
  if (info.type_class == H5T_INTEGER) {
    if (info.size == 1 && info.is_signed) return DType::kInt8;
    if (info.size == 4 && info.is_signed) return DType::kInt32;
    if (info.size == 8 && info.is_signed) return DType::kInt64;
    HYBRIDTB_CHECK(!(info.size == 1 && !info.is_signed), dataset.path(),
                   ": uint8 storage is ambiguous (float8_e4m3fn, float8_e5m2 or bool?): add a string attribute "
                   "dtype_name");
  }
  if (info.type_class == H5T_ENUM && info.size == 1) return DType::kBool;
  throw Error(detail::concat(dataset.path(), ": unsupported HDF5 type ", h5::describe_type(type.id()),
                             " (add a dtype_name attribute or store a supported type, see datasets/SCHEMA.md)"));
}

// --- lookups -----------------------------------------------------------------------------------

std::optional<Dataset> find_dataset(const Group& group, const std::string& name) {
  switch (group.child_kind(name)) {
    case ObjectKind::kMissing: return std::nullopt;
    case ObjectKind::kDataset: return group.open_dataset(name);
    case ObjectKind::kGroup: throw Error(group.child_path(name) + " is a group, expected a dataset");
    case ObjectKind::kOther: break;
  }
  throw Error(group.child_path(name) + " is not a dataset (a dangling link or a named datatype?)");
}

Dataset require_dataset(const Group& group, const std::string& name, const std::string& requirement) {
  std::optional<Dataset> dataset = find_dataset(group, name);
  HYBRIDTB_CHECK(dataset.has_value(), "missing dataset ", group.child_path(name), " (required: ", requirement, ")");
  return std::move(*dataset);
}

std::optional<Group> find_group(const Group& parent, const std::string& name) {
  switch (parent.child_kind(name)) {
    case ObjectKind::kMissing: return std::nullopt;
    case ObjectKind::kGroup: return parent.open_group(name);
    default: break;
  }
  throw Error(parent.child_path(name) + " is not a group");
}

Group require_group(const Group& parent, const std::string& name) {
  std::optional<Group> group = find_group(parent, name);
  HYBRIDTB_CHECK(group.has_value(), "missing group ", parent.child_path(name));
  return std::move(*group);
}

void require_attribute(const h5::Object& object, const std::string& name, const std::string& requirement) {
  HYBRIDTB_CHECK(object.has_attribute(name), "missing attribute ", object.child_path(name), " (required: ",
                 requirement, ")");
}

int64_t int_attribute(const h5::Object& object, const std::string& name, const std::string& requirement) {
  require_attribute(object, name, requirement);
  return object.read_int_attribute(name);
}

// A size or count of the layer: vLLM keeps them in int32 (kernel arguments, index arithmetic), and
// bounding them here keeps every product the readers and backends form (num_heads · head_size,
// block · block_size + offset, …) far from int64 overflow, whatever a hostile file declares.
int64_t fits_int32(const std::string& where, int64_t value) {
  HYBRIDTB_CHECK(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max(), where,
                 ": value ", value, " does not fit int32");
  return value;
}
int64_t int32_attribute(const h5::Object& object, const std::string& name, const std::string& requirement) {
  return fits_int32("attribute " + object.child_path(name), int_attribute(object, name, requirement));
}
double float_attribute(const h5::Object& object, const std::string& name, const std::string& requirement) {
  require_attribute(object, name, requirement);
  return object.read_float_attribute(name);
}
std::string string_attribute(const h5::Object& object, const std::string& name, const std::string& requirement) {
  require_attribute(object, name, requirement);
  return object.read_string_attribute(name);
}

// --- reading data ------------------------------------------------------------------------------

// product(shape), refusing shapes whose byte size would overflow (a corrupt or hostile header).
int64_t checked_numel(const std::string& path, const Shape& shape) {
  int64_t count = 1;
  for (const int64_t dim : shape) {
    HYBRIDTB_CHECK(dim == 0 || count <= std::numeric_limits<int64_t>::max() / 16 / dim, path, ": shape ",
                   shape_to_string(shape), " is too large");
    count *= dim;
  }
  return count;
}

// The most a filtered (compressed) dataset may expand. Deflate, the only filter Debian's HDF5
// decodes out of the box, tops out near 1032:1; anything beyond 4096:1 is a decompression bomb.
constexpr uint64_t kMaxExpansion = 4096;

// Refuses to allocate memory for data the file does not hold. HDF5 hands out fill values for
// storage that was never written (a dataset created but not written, chunks never allocated), so a
// few-kilobyte file could otherwise declare terabytes and have the reader allocate them (and fill
// them: an out-of-memory kill is a crash too). Raw data in other files (external storage, virtual
// datasets) is refused as well: a batch file must be self-contained, and a hostile file must not
// make the reader open arbitrary paths.
void check_backed_by_storage(const Dataset& dataset, int64_t count, size_t element_size) {
  HYBRIDTB_CHECK(!dataset.stored_elsewhere(), dataset.path(),
                 ": its data lives outside this file (external storage or a virtual dataset); store it in the file");
  if (count == 0) return;
  const uint64_t declared = static_cast<uint64_t>(count) * element_size;  // < 2^63: checked_numel bounds count
  const uint64_t stored = dataset.storage_bytes();
  if (dataset.filter_count() == 0) {
    HYBRIDTB_CHECK(stored >= declared, dataset.path(), ": the file stores ", stored, " of its ", declared,
                   " bytes (a dataset never written, or unallocated chunks); write every element");
  } else {
    HYBRIDTB_CHECK(stored > 0 && declared / stored <= kMaxExpansion, dataset.path(), ": ", stored,
                   " stored (compressed) bytes would expand to ", declared, ", more than ", kMaxExpansion,
                   ":1 (unallocated chunks or a decompression bomb)");
  }
}

Tensor allocate(const std::string& path, DType dtype, const Shape& shape) {
  try {
    return Tensor::host(dtype, shape);
  } catch (const std::bad_alloc&) {
    throw Error(detail::concat(path, ": cannot allocate ", to_string(dtype), shape_to_string(shape)));
  }
}

// Reads the whole dataset in its own storage type (HDF5 converts nothing) into a tensor of `dtype`.
Tensor read_tensor_data(const Dataset& dataset, DType dtype, const Shape& shape) {
  HYBRIDTB_CHECK(shape.size() <= static_cast<size_t>(TensorView::kMaxRank), dataset.path(), ": rank ", shape.size(),
                 " is above the supported ", TensorView::kMaxRank);
  const int64_t count = checked_numel(dataset.path(), shape);
  check_backed_by_storage(dataset, count, dataset.type_info().size);
  Tensor tensor = allocate(dataset.path(), dtype, shape);
  if (tensor.numel() > 0) {
    const h5::Type type = dataset.file_type();
    const int64_t bytes = tensor.nbytes();
    auto* data = static_cast<char*>(tensor.data());
    move_in_slices(shape, bytes, [&](int64_t row, int64_t rows) {
      if (row == kWholeDataset) return dataset.read_raw(type.id(), data);
      dataset.read_rows(type.id(), row, rows, data + row * (bytes / shape[0]));
    });
  }
  return tensor;
}

// A tensor dataset with checked shape and (when `expected` is set) dtype; `expected_what`
// describes where the expected dtype comes from ("/config dtype bfloat16").
Tensor read_tensor(const Dataset& dataset, const Dims& dims, std::optional<DType> expected,
                   const std::string& expected_what) {
  const DType dtype = tensor_dtype(dataset);
  HYBRIDTB_CHECK(!expected || dtype == *expected, dataset.path(), ": dtype ", to_string(dtype), " does not match ",
                 expected_what);
  const Shape shape = dataset.shape();
  check_shape(dataset.path(), shape, dims);
  return read_tensor_data(dataset, dtype, shape);
}

// Integers of any width and sign, converted exactly to int64 (uint64 above int64 max is refused).
std::vector<int64_t> read_integers(const Dataset& dataset, Shape* shape_out) {
  const h5::Type type = dataset.file_type();
  const h5::TypeInfo info = h5::inspect_type(type.id());
  HYBRIDTB_CHECK(info.type_class == H5T_INTEGER && info.size <= 8, dataset.path(), ": expected an integer dataset, found ",
                 h5::describe_type(type.id()));
  check_little_endian(dataset, info);
  if (const std::optional<DType> named = named_dtype(dataset)) {
    HYBRIDTB_CHECK(is_integer_dtype(*named) && storage_holds(*named, info), dataset.path(), ": dtype_name ",
                   to_string(*named), " does not match its HDF5 storage ", h5::describe_type(type.id()));
  }
  const Shape shape = dataset.shape();
  const int64_t count = checked_numel(dataset.path(), shape);
  check_backed_by_storage(dataset, count, info.size);
  std::vector<unsigned char> bytes;
  try {
    bytes.resize(static_cast<size_t>(count) * info.size);
  } catch (const std::bad_alloc&) {
    throw Error(detail::concat(dataset.path(), ": cannot allocate ", count, " integers"));
  }
  if (count > 0) dataset.read_raw(type.id(), bytes.data());
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (size_t i = 0; i < values.size(); ++i) {
    const unsigned char* p = bytes.data() + i * info.size;
    switch (info.size) {
      case 1: values[i] = info.is_signed ? int64_t{static_cast<int8_t>(p[0])} : int64_t{p[0]}; break;
      case 2: {
        uint16_t v = 0;
        std::memcpy(&v, p, 2);
        values[i] = info.is_signed ? int64_t{static_cast<int16_t>(v)} : int64_t{v};
        break;
      }
      case 4: {
        uint32_t v = 0;
        std::memcpy(&v, p, 4);
        values[i] = info.is_signed ? int64_t{static_cast<int32_t>(v)} : int64_t{v};
        break;
      }
      case 8: {
        uint64_t v = 0;
        std::memcpy(&v, p, 8);
        HYBRIDTB_CHECK(info.is_signed || v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                       dataset.path(), ": value ", v, " at index ", i, " does not fit int64");
        values[i] = static_cast<int64_t>(v);
        break;
      }
      default:
        throw Error(detail::concat(dataset.path(), ": unsupported integer size ", info.size));
    }
  }
  if (shape_out != nullptr) *shape_out = shape;
  return values;
}

IntArray read_int_array(const Dataset& dataset, const Dims* dims) {
  if (dataset.is_null()) {
    // The writer's form of a default-constructed IntArray (no shape, no values).
    HYBRIDTB_CHECK(dims == nullptr, dataset.path(), ": dataset has no elements (null dataspace), expected ",
                   dims_to_string(*dims));
    return IntArray();
  }
  Shape shape;
  const std::vector<int64_t> wide = read_integers(dataset, &shape);
  if (dims != nullptr) check_shape(dataset.path(), shape, *dims);
  std::vector<int32_t> values(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    HYBRIDTB_CHECK(wide[i] >= std::numeric_limits<int32_t>::min() && wide[i] <= std::numeric_limits<int32_t>::max(),
                   dataset.path(), ": value ", wide[i], " at index ", i, " does not fit int32");
    values[i] = static_cast<int32_t>(wide[i]);
  }
  return IntArray(std::move(shape), std::move(values));
}

// A float scalar: a 0-d or one-element dataset (float32/float64, or an integer), else an attribute
// of the same name on the group.
std::optional<double> read_scalar(const Group& group, const std::string& name) {
  std::optional<Dataset> dataset = find_dataset(group, name);
  if (!dataset) {
    if (group.has_attribute(name)) return group.read_float_attribute(name);
    return std::nullopt;
  }
  const Shape shape = dataset->shape();
  const int64_t count = checked_numel(dataset->path(), shape);
  HYBRIDTB_CHECK(count == 1 && shape.size() <= 1, dataset->path(), ": expected a scalar (0-d or [1]), found shape ",
                 shape_to_string(shape));
  const h5::TypeInfo info = dataset->type_info();
  if (info.type_class == H5T_INTEGER) return static_cast<double>(read_integers(*dataset, nullptr).at(0));
  const DType dtype = tensor_dtype(*dataset);
  HYBRIDTB_CHECK(is_floating(dtype) || is_integer_dtype(dtype), dataset->path(), ": expected a number, found ",
                 to_string(dtype));
  const Tensor value = read_tensor_data(*dataset, dtype, shape);
  return load_as_double(value.data(), dtype, 0);
}

// float32/float64 (or any float dtype) [n] → float values.
std::vector<float> read_float_vector(const Dataset& dataset, const Dims& dims) {
  const DType dtype = tensor_dtype(dataset);
  HYBRIDTB_CHECK(is_floating(dtype), dataset.path(), ": dtype ", to_string(dtype), " is not a float type (expected float32)");
  const Shape shape = dataset.shape();
  check_shape(dataset.path(), shape, dims);
  const Tensor values = read_tensor_data(dataset, dtype, shape);
  std::vector<float> out(static_cast<size_t>(values.numel()));
  for (int64_t i = 0; i < values.numel(); ++i) {
    out[static_cast<size_t>(i)] = static_cast<float>(load_as_double(values.data(), dtype, i));
  }
  return out;
}

// --- the SSM branch (schema 1.1) ---------------------------------------------------------------
//
// Generic on purpose: /config/ssm, /inputs/ssm, /weights and /outputs/ssm hold whatever names the
// layer's ssm_mode defines (reference/ssm/README.md), and the mode checks its own names and shapes
// (spec::ssm::validate_ssm_tensors). This layer checks only element types, ranks and the
// invariants every mode shares: all pools hold the same slots, and the pools after the step are
// the pools before it.

// State pools and weights are kept in a model float type (fp8 would need scales no mode defines).
bool is_ssm_tensor_dtype(DType dtype) {
  return dtype == DType::kFloat64 || dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// A name that is one HDF5 link or attribute name, so that the item lands where the schema says.
void check_item_name(const std::string& group_path, const std::string& name, const char* what) {
  HYBRIDTB_CHECK(!name.empty() && name != "." && name.find('/') == std::string::npos &&
                     name.find('\0') == std::string::npos,
                 group_path, ": ", what, " name '", name, "' is not a valid item name (non-empty, no '/', not '.')");
}

// One state pool or weight: a float type and rank >= 1 (`what`: "state pools" or "weights").
void check_ssm_tensor(const std::string& path, DType dtype, const Shape& shape, const char* what) {
  HYBRIDTB_CHECK(is_ssm_tensor_dtype(dtype), path, ": dtype ", to_string(dtype), " is not allowed (", what,
                 " must be float64, float32, float16 or bfloat16)");
  HYBRIDTB_CHECK(!shape.empty(), path, ": shape [] (a scalar) is not allowed (", what, " must have rank >= 1",
                 std::strcmp(what, "state pools") == 0 ? ": [num_slots, ...])" : ")");
}

std::string names_of(const std::map<std::string, Tensor>& tensors) {
  std::string out;
  for (const auto& [name, tensor] : tensors) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Every pool of a group holds the same slots: the first dimensions (num_slots) agree.
void check_num_slots(const std::string& group_path, const std::map<std::string, Tensor>& pools) {
  if (pools.empty()) return;
  const auto& [first_name, first] = *pools.begin();
  for (const auto& [name, pool] : pools) {
    HYBRIDTB_CHECK(pool.size(0) == first.size(0), group_path, "/", name, ": shape ", shape_to_string(pool.shape()),
                   " has num_slots ", pool.size(0), " (dimension 0), but ", group_path, "/", first_name, " ",
                   shape_to_string(first.shape()), " has ", first.size(0),
                   "; every state pool must hold the same slots");
  }
}

// /outputs/ssm or /expected/ssm (the pools after the step) against /inputs/ssm (before it): when
// both are present, the same names with the same shapes. Dtypes may differ (results keep the
// producer's dtype).
void check_pools_after(const std::string& group_path, const std::map<std::string, Tensor>& after,
                       const std::map<std::string, Tensor>& before) {
  if (after.empty() || before.empty()) return;
  for (const auto& [name, pool] : after) {
    const auto found = before.find(name);
    HYBRIDTB_CHECK(found != before.end(), group_path, "/", name, ": no state pool of that name in /inputs/ssm (",
                   names_of(before), "); the pools after the step must be the pools before it");
    HYBRIDTB_CHECK(pool.shape() == found->second.shape(), group_path, "/", name, ": shape ",
                   shape_to_string(pool.shape()), " does not match /inputs/ssm/", name, " ",
                   shape_to_string(found->second.shape()), " (the same pool before the step)");
  }
  for (const auto& [name, pool] : before) {
    HYBRIDTB_CHECK(after.count(name) == 1, "missing dataset ", group_path, "/", name, " (required: ",
                   shape_to_string(pool.shape()), ", the pool /inputs/ssm/", name,
                   " after the step; every pool is stored when ", group_path, " exists)");
  }
}

// Every child of `group` as a named float tensor (the reader side of /inputs/ssm, /weights, …).
std::map<std::string, Tensor> read_named_tensors(const Group& group, const char* what) {
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : group.child_names()) {
    const std::optional<Dataset> dataset = find_dataset(group, name);
    if (!dataset) continue;
    const DType dtype = tensor_dtype(*dataset);
    const Shape shape = dataset->shape();
    check_ssm_tensor(dataset->path(), dtype, shape, what);
    tensors.emplace(name, read_tensor_data(*dataset, dtype, shape));
  }
  return tensors;
}

// /config/ssm: the mode's integer hyper-parameters (any integer width; absent = none).
void read_ssm_params(const Group& config, AttentionConfig& c) {
  const std::optional<Group> g = find_group(config, "ssm");
  if (!g) return;
  for (const std::string& name : g->attribute_names()) {
    c.ssm_params[name] = fits_int32("attribute " + g->child_path(name), g->read_int_attribute(name));
  }
}

// /inputs/ssm/<name> (the pools before the step) and /weights/<name>, both optional.
void read_ssm_inputs(const Group& root, const Group& inputs, BatchInputs& in) {
  if (const std::optional<Group> g = find_group(inputs, "ssm")) {
    in.ssm_state = read_named_tensors(*g, "state pools");
    check_num_slots(g->path(), in.ssm_state);
  }
  if (const std::optional<Group> g = find_group(root, "weights")) in.weights = read_named_tensors(*g, "weights");
}

// The writer side: names that HDF5 stores as given, present tensors, float types, rank >= 1
// (`item`: "state pool" or "weight"; `what`: "state pools" or "weights").
void check_tensors_to_write(const std::string& group_path, const std::map<std::string, Tensor>& tensors,
                            const char* item, const char* what) {
  for (const auto& [name, tensor] : tensors) {
    check_item_name(group_path, name, item);
    const std::string path = group_path + "/" + name;
    HYBRIDTB_CHECK(!tensor.empty(), path, ": the tensor is empty (absent); leave it out of the map instead");
    check_ssm_tensor(path, tensor.dtype(), tensor.shape(), what);
  }
}

// The writer's checks of the SSM inputs, made before anything is created.
void check_ssm_inputs(const BatchFile& file) {
  for (const auto& [name, value] : file.config.ssm_params) check_item_name("/config/ssm", name, "parameter");
  check_tensors_to_write("/inputs/ssm", file.inputs.ssm_state, "state pool", "state pools");
  check_num_slots("/inputs/ssm", file.inputs.ssm_state);
  check_tensors_to_write("/weights", file.inputs.weights, "weight", "weights");
}

// --- root, config and batch --------------------------------------------------------------------

// "1.0" / "1.2.3" → (major, minor); throws naming the attribute otherwise.
std::pair<int, int> parse_version(const std::string& text) {
  int major = 0, minor = 0, consumed = 0;
  const bool two = std::sscanf(text.c_str(), "%d.%d%n", &major, &minor, &consumed) == 2;
  bool ok = two && major >= 0 && minor >= 0;
  if (ok && static_cast<size_t>(consumed) != text.size()) {
    int patch = 0, more = 0;
    ok = std::sscanf(text.c_str() + consumed, ".%d%n", &patch, &more) == 1 &&
         static_cast<size_t>(consumed + more) == text.size();
  }
  HYBRIDTB_CHECK(ok, "root attribute schema_version '", text, "' is not of the form <major>.<minor>");
  return {major, minor};
}

std::string number_to_string(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

void read_root(const Group& root, BatchFile& file, bool has_outputs) {
  const std::string schema =
      string_attribute(root, "schema", std::string("\"") + kSchemaName + "\"; is this a hybrid-batch file?");
  HYBRIDTB_CHECK(schema == kSchemaName, "root attribute schema is '", schema, "', expected '", kSchemaName, "'");
  file.schema_version = string_attribute(root, "schema_version", "a string such as \"1.1\"");
  // Any minor version is read: newer minors only add optional items, which this reader ignores and
  // names in file.warnings.
  const auto [major, minor] = parse_version(file.schema_version);
  HYBRIDTB_CHECK(major == kSchemaMajor, "schema_version ", file.schema_version, " is not supported: this build reads ",
                 kSchemaName, " ", kSchemaMajor, ".x");
  if (minor > kSchemaMinor) {
    file.warnings.push_back(detail::concat("schema_version ", file.schema_version, " is newer than this build's ",
                                           kSchemaMajor, ".", kSchemaMinor,
                                           ": the items it added are ignored here and dropped when the file is rewritten"));
  }
  // Top-level groups and datasets this version does not define (/capture: an engine capture's own
  // record, which readers ignore by design).
  for (const std::string& name : root.child_names()) {
    static const std::set<std::string> known = {"config", "batch", "inputs", "weights", "outputs", "expected", "capture"};
    if (known.count(name) == 0) {
      file.warnings.push_back(detail::concat("/", name, " is not part of ", kSchemaName, " ", kSchemaMajor, ".",
                                             kSchemaMinor, ": ignored, and dropped when the file is rewritten"));
    }
  }
  for (const std::string& name : root.attribute_names()) {
    if (name == "schema" || name == "schema_version" || (name == "backend" && has_outputs)) continue;
    switch (root.attribute_kind(name)) {
      case AttributeKind::kString: file.provenance[name] = root.read_string_attribute(name); break;
      // Numbers (seed = 42) are kept as their decimal text; arrays and other types are not provenance.
      case AttributeKind::kInteger:
        try {
          file.provenance[name] = std::to_string(root.read_int_attribute(name));
        } catch (const Error&) {
        }
        break;
      case AttributeKind::kFloat:
        try {
          file.provenance[name] = number_to_string(root.read_float_attribute(name));
        } catch (const Error&) {
        }
        break;
      case AttributeKind::kOther: break;
    }
  }
}

void read_config(const Group& root, BatchFile& file) {
  const Group g = require_group(root, "config");
  AttentionConfig& c = file.config;
  c.num_heads = int32_attribute(g, "num_heads", "int");
  c.num_kv_heads = int32_attribute(g, "num_kv_heads", "int");
  c.head_size = int32_attribute(g, "head_size", "int");
  c.block_size = int32_attribute(g, "block_size", "int");
  c.scale = float_attribute(g, "scale", "float");
  c.sliding_window = int32_attribute(g, "sliding_window", "int, 0 = none");
  c.logits_soft_cap = float_attribute(g, "logits_soft_cap", "float, 0 = off");
  const int64_t alibi_sqrt = int_attribute(g, "use_alibi_sqrt", "int 0 or 1");
  HYBRIDTB_CHECK(alibi_sqrt == 0 || alibi_sqrt == 1, "attribute /config/use_alibi_sqrt must be 0 or 1, got ", alibi_sqrt);
  c.use_alibi_sqrt = alibi_sqrt == 1;
  c.dtype = dtype_from_string(string_attribute(g, "dtype", "\"float32\" | \"float16\" | \"bfloat16\""),
                              "attribute /config/dtype");
  HYBRIDTB_CHECK(c.dtype == DType::kFloat32 || c.dtype == DType::kFloat16 || c.dtype == DType::kBFloat16,
                 "attribute /config/dtype must be float32, float16 or bfloat16, got ", to_string(c.dtype));
  c.kv_cache_dtype = kv_cache_dtype_from_string(string_attribute(
      g, "kv_cache_dtype", "\"auto\" | \"fp8_e4m3\" | \"fp8_e5m2\" | \"int8_per_token_head\" | \"fp8_per_token_head\""));
  c.attn_type = attn_type_from_string(string_attribute(g, "attn_type", "\"decoder\" | \"encoder_only\""));
  // Schema 1.2, optional: absent means full_attention, the only kind before it.
  if (g.has_attribute("layer_kind")) c.layer_kind = layer_kind_from_string(g.read_string_attribute("layer_kind"));
  c.ssm_mode = string_attribute(g, "ssm_mode", "string, \"none\" for a plain attention layer");
  c.mamba_cache_mode =
      mamba_cache_mode_from_string(string_attribute(g, "mamba_cache_mode", "\"none\" | \"all\" | \"align\""));
  c.mamba_block_size = int32_attribute(g, "mamba_block_size", "int");
  c.num_speculative_tokens = int32_attribute(g, "num_speculative_tokens", "int");
  // Schema 1.3, optional: the engine whose rules the batch follows (absent: the unversioned rules),
  // the gated norm's eps and Falcon-H1's mamba_rms_norm. validate(AttentionConfig) checks them.
  if (g.has_attribute("engine_version")) {
    c.engine_version = g.read_string_attribute("engine_version");
    engine_rules(c.engine_version);  // an unknown version is refused here, naming the supported list
  }
  if (g.has_attribute("norm_eps")) c.norm_eps = float_attribute(g, "norm_eps", "float > 0");
  if (g.has_attribute("mamba_rms_norm")) {
    const int64_t rms_norm = int_attribute(g, "mamba_rms_norm", "int 0 or 1");
    HYBRIDTB_CHECK(rms_norm == 0 || rms_norm == 1, "attribute /config/mamba_rms_norm must be 0 or 1, got ", rms_norm);
    c.mamba_rms_norm = rms_norm == 1;
  }
  // Schema 1.4, optional: a tensor-parallel rank file (absent: tp_size 1, tp_rank 0).
  if (g.has_attribute("tp_size")) c.tp_size = int_attribute(g, "tp_size", "int >= 1");
  if (g.has_attribute("tp_rank")) c.tp_rank = int_attribute(g, "tp_rank", "int in [0, tp_size)");
  const Dims per_head{{"num_heads", c.num_heads}};
  if (std::optional<Dataset> d = find_dataset(g, "alibi_slopes")) c.alibi_slopes = read_float_vector(*d, per_head);
  if (std::optional<Dataset> d = find_dataset(g, "sinks")) c.sinks = read_float_vector(*d, per_head);
  read_ssm_params(g, c);

  // Builder settings (optional, with the engine defaults).
  BuilderConfig& b = file.builder;
  if (g.has_attribute("cudagraph_mode")) b.cudagraph_mode = cudagraph_mode_from_string(g.read_string_attribute("cudagraph_mode"));
  if (g.has_attribute("max_num_seqs")) b.max_num_seqs = int32_attribute(g, "max_num_seqs", "int");
  if (std::optional<Dataset> d = find_dataset(g, "cudagraph_capture_sizes")) {
    const IntArray sizes = read_int_array(*d, nullptr);
    check_shape(d->path(), sizes.shape, {{"n", -1}});
    b.cudagraph_capture_sizes.assign(sizes.values.begin(), sizes.values.end());
  }
}

void read_batch(const Group& root, BatchFile& file) {
  const Group g = require_group(root, "batch");
  BatchDescription& b = file.batch;
  const Dataset qsl = require_dataset(g, "query_start_loc", "int32 [R+1]");
  b.query_start_loc = read_int_array(qsl, nullptr);
  HYBRIDTB_CHECK(b.query_start_loc.rank() == 1 && b.query_start_loc.numel() >= 1, qsl.path(), ": shape ",
                 shape_to_string(b.query_start_loc.shape), " does not match [R+1] (at least one entry)");
  const int64_t R = b.query_start_loc.numel() - 1;
  const Dims per_request{{"R", R}};
  b.seq_lens = read_int_array(require_dataset(g, "seq_lens", "int32 [R]"), &per_request);

  const Dims table_dims{{"R", R}, {"max_blocks", -1}};
  if (std::optional<Dataset> d = find_dataset(g, "block_table")) {
    b.block_table = read_int_array(*d, &table_dims);
  } else {
    HYBRIDTB_CHECK(file.config.attn_type == AttnType::kEncoderOnly,
                   "missing dataset /batch/block_table (required: int32 [R, max_blocks])");
    b.block_table = IntArray::matrix(R, 0);
  }

  const Dataset slots = require_dataset(g, "slot_mapping", "int64 [T]");
  Shape slot_shape;
  b.slot_mapping = read_integers(slots, &slot_shape);
  check_shape(slots.path(), slot_shape, {{"T", -1}});
  b.num_actual_tokens = int_attribute(g, "num_actual_tokens", "int");

  if (std::optional<Dataset> d = find_dataset(g, "mm_prefix_range")) {
    const Dims dims{{"R", R}, {"M", -1}, {"", 2}};
    b.mm_prefix_range = read_int_array(*d, &dims);
  }
  if (std::optional<Dataset> d = find_dataset(g, "ssm_block_table")) {
    const Dims dims{{"R", R}, {"max_ssm_blocks", -1}};
    b.ssm_block_table = read_int_array(*d, &dims);
  }
  if (std::optional<Dataset> d = find_dataset(g, "num_accepted_tokens")) {
    b.num_accepted_tokens = read_int_array(*d, &per_request);
  }
}

// --- inputs and outputs ------------------------------------------------------------------------

std::string required_tensor(DType dtype, const Dims& dims) { return std::string(to_string(dtype)) + " " + dim_names(dims); }

// /inputs of a linear-attention layer (schema 1.2): its kind's inputs, [T, width] in /config dtype,
// and none of the attention tensors.
void read_linear_inputs(const Group& root, const Group& g, BatchFile& file) {
  const AttentionConfig& c = file.config;
  const std::string kind(to_string(c.layer_kind));
  for (const char* name : {"query", "key", "value", "kv_cache", "k_scale", "v_scale", "k_scale_cache", "v_scale_cache",
                           "output_scale", "q_scale"}) {
    HYBRIDTB_CHECK(g.child_kind(name) == ObjectKind::kMissing && !g.has_attribute(name), g.child_path(name),
                   " is present, but /config layer_kind ", kind,
                   " is a linear-attention layer: it has no query, key, value, KV cache (nor its scales) or fp8 "
                   "output");
  }
  const int64_t T = file.batch.num_tokens();
  const std::string config_dtype = "/config dtype " + std::string(to_string(c.dtype));
  for (const LinearInput& input : linear_layer_spec(c).inputs) {
    const Dims dims{{"T", T}, {input.width_formula, input.width}};
    const std::string requirement = detail::concat(to_string(c.dtype), " ", dim_names(dims), ", ", input.meaning);
    file.inputs.linear_inputs[input.name] =
        read_tensor(require_dataset(g, input.name, requirement), dims, c.dtype, config_dtype);
  }
  read_ssm_inputs(root, g, file.inputs);
}

// An input of another linear kind is refused, not ignored: a linear layer whose layer_kind is
// missing or wrong would otherwise be read as something else.
void check_no_foreign_linear_inputs(const Group& g, LayerKind kind) {
  for (const auto& [name, owner] : foreign_linear_inputs(kind)) {
    HYBRIDTB_CHECK(g.child_kind(name) == ObjectKind::kMissing, g.child_path(name), " is an input of layer_kind ",
                   to_string(owner), ", but /config layer_kind is ", to_string(kind),
                   kind == LayerKind::kFullAttention ? " (the default when the attribute is absent)" : "");
  }
}

void read_inputs(const Group& root, BatchFile& file) {
  const Group g = require_group(root, "inputs");
  check_no_foreign_linear_inputs(g, file.config.layer_kind);
  if (file.config.is_linear_layer()) {
    read_linear_inputs(root, g, file);
    return;
  }
  const AttentionConfig& c = file.config;
  BatchInputs& in = file.inputs;
  const int64_t T = file.batch.num_tokens();
  const std::string config_dtype = "/config dtype " + std::string(to_string(c.dtype));
  const auto token_tensor = [&](const char* name, bool kv_heads) {
    const Dims dims = token_dims(T, c, kv_heads);
    return read_tensor(require_dataset(g, name, required_tensor(c.dtype, dims)), dims, c.dtype, config_dtype);
  };
  {
    // The query may be stored in fp8 with /inputs/q_scale (schema 1.3); validate() checks the pairing.
    const Dims dims = token_dims(T, c, false);
    const Dataset d = require_dataset(g, "query", required_tensor(c.dtype, dims));
    in.query = read_tensor(d, dims, std::nullopt, "");
    HYBRIDTB_CHECK(in.query.dtype() == c.dtype || is_fp8(in.query.dtype()), d.path(), ": dtype ",
                   to_string(in.query.dtype()), " does not match ", config_dtype,
                   " (or float8_e4m3fn / float8_e5m2 with /inputs/q_scale)");
  }
  in.key = token_tensor("key", true);
  in.value = token_tensor("value", true);

  const DType storage = kv_storage_dtype(c.kv_cache_dtype, c.dtype);
  const std::string storage_what = detail::concat("the cache storage dtype ", to_string(storage), " (kv_cache_dtype ",
                                                  to_string(c.kv_cache_dtype), ")");
  std::optional<Dataset> cache = find_dataset(g, "kv_cache");
  HYBRIDTB_CHECK(cache || c.attn_type == AttnType::kEncoderOnly, "missing dataset /inputs/kv_cache (required: ",
                 required_tensor(storage, kv_cache_dims(-1, c)), ")");
  int64_t num_blocks = -1;
  if (cache) {
    in.kv_cache = read_tensor(*cache, kv_cache_dims(-1, c), storage, storage_what);
    num_blocks = in.kv_cache.size(0);
  }

  const auto scale = [&](const char* name) { return read_scalar(g, name); };
  in.k_scale = static_cast<float>(scale("k_scale").value_or(1.0));
  in.v_scale = static_cast<float>(scale("v_scale").value_or(1.0));
  if (const std::optional<double> s = scale("output_scale")) in.output_scale = static_cast<float>(*s);
  if (const std::optional<double> s = scale("q_scale")) in.q_scale = static_cast<float>(*s);

  const Dims scale_dims = scale_cache_dims(num_blocks, c);
  for (const auto& [name, target] : {std::pair<const char*, Tensor*>{"k_scale_cache", &in.k_scale_cache},
                                     std::pair<const char*, Tensor*>{"v_scale_cache", &in.v_scale_cache}}) {
    std::optional<Dataset> d = find_dataset(g, name);
    if (is_per_token_head(c.kv_cache_dtype)) {
      HYBRIDTB_CHECK(d.has_value(), "missing dataset ", g.child_path(name), " (required with kv_cache_dtype ",
                     to_string(c.kv_cache_dtype), ": float32 ", dim_names(scale_dims), ")");
      *target = read_tensor(*d, scale_dims, DType::kFloat32, "float32 (per-token-head scales)");
    } else {
      HYBRIDTB_CHECK(!d.has_value(), d ? d->path() : std::string(), ": present, but kv_cache_dtype ",
                     to_string(c.kv_cache_dtype), " is not a per-token-head mode");
    }
  }
  // Schema 1.4: a tensor-parallel rank's SSM input, every head's query row; validate() checks that
  // it is present exactly when the file is such a rank with an SSM branch.
  if (std::optional<Dataset> d = find_dataset(g, "ssm_hidden")) {
    const Dims dims{{"T", T}, {"tp_size * num_heads * head_size", c.ssm_hidden_size()}};
    in.ssm_hidden = read_tensor(*d, dims, c.dtype, config_dtype);
  }
  read_ssm_inputs(root, g, in);
}

// Every field of the metadata tree: integer attributes are scalars, datasets are int32 arrays.
void collect_metadata(const Group& group, const std::string& prefix, std::vector<MetadataField>& fields, int depth) {
  HYBRIDTB_CHECK(depth < 16, group.path(), ": metadata groups nest too deeply (a link cycle?)");
  for (const std::string& name : group.attribute_names()) {
    fields.push_back({prefix + name, group.read_int_attribute(name)});
  }
  for (const std::string& name : group.child_names()) {
    switch (group.child_kind(name)) {
      case ObjectKind::kGroup:
        collect_metadata(group.open_group(name), prefix + name + "/", fields, depth + 1);
        break;
      case ObjectKind::kDataset:
        fields.push_back({prefix + name, read_int_array(group.open_dataset(name), nullptr)});
        break;
      default:
        throw Error(group.child_path(name) + " is neither a group nor a dataset");
    }
  }
}

// output (a float [T, output_width]) and nothing of the attention's: a linear layer has no
// attention output, KV cache or parallel SSM contribution.
void read_linear_outputs(const Group& g, const BatchFile& file, StepOutputs& out) {
  const AttentionConfig& c = file.config;
  const LinearLayerSpec spec = linear_layer_spec(c);
  const Dims dims{{"T", file.batch.num_tokens()}, {"output_width", spec.output_width}};
  const Dataset output = require_dataset(g, "output", dim_names(dims) + ", " + spec.output_meaning);
  const DType dtype = tensor_dtype(output);
  HYBRIDTB_CHECK(is_floating(dtype), output.path(), ": dtype ", to_string(dtype), " is not a float type");
  out.output = read_tensor(output, dims, dtype, "");
  for (const char* name : {"attn_output", "ssm_output", "kv_cache", "k_scale_cache", "v_scale_cache"}) {
    HYBRIDTB_CHECK(g.child_kind(name) == ObjectKind::kMissing, g.child_path(name), " is present, but /config layer_kind ",
                   to_string(c.layer_kind), " is a linear-attention layer (its only output is `output`)");
  }
}

// output, attn_output, the caches after the write and the SSM branch's contribution.
void read_attention_outputs(const Group& g, const BatchFile& file, StepOutputs& out) {
  const AttentionConfig& c = file.config;
  const int64_t T = file.batch.num_tokens();
  const Dims tokens = token_dims(T, c, false);
  out.output = read_tensor(require_dataset(g, "output", "[T, num_heads, head_size]"), tokens, std::nullopt, "");
  out.attn_output = read_tensor(require_dataset(g, "attn_output", "[T, num_heads, head_size]"), tokens, std::nullopt, "");
  const bool has_cache = !file.inputs.kv_cache.empty();
  const int64_t num_blocks = has_cache ? file.inputs.kv_cache.size(0) : -1;
  std::optional<Dataset> cache = find_dataset(g, "kv_cache");
  HYBRIDTB_CHECK(cache || !has_cache, "missing dataset ", g.child_path("kv_cache"), " (required: ",
                 dims_to_string(kv_cache_dims(num_blocks, c)), ", the cache after the write)");
  if (cache) out.kv_cache = read_tensor(*cache, kv_cache_dims(num_blocks, c), std::nullopt, "");
  const Dims scale_dims = scale_cache_dims(num_blocks, c);
  if (std::optional<Dataset> d = find_dataset(g, "k_scale_cache")) out.k_scale_cache = read_tensor(*d, scale_dims, std::nullopt, "");
  if (std::optional<Dataset> d = find_dataset(g, "v_scale_cache")) out.v_scale_cache = read_tensor(*d, scale_dims, std::nullopt, "");

  // The SSM branch (1.1, optional): its contribution alone and the state pools after the step.
  if (std::optional<Dataset> d = find_dataset(g, "ssm_output")) {
    const DType dtype = tensor_dtype(*d);
    HYBRIDTB_CHECK(is_floating(dtype), d->path(), ": dtype ", to_string(dtype), " is not a float type");
    out.ssm_output = read_tensor(*d, tokens, dtype, "");
  }
}

// `backend_holder`: /outputs names its backend at the root (it describes how the file was
// produced); /expected carries its own, as it may come from another run.
StepOutputs read_outputs(const Group& g, const h5::Object& backend_holder, const BatchFile& file) {
  const AttentionConfig& c = file.config;
  StepOutputs out;
  if (backend_holder.has_attribute("backend")) out.backend = backend_holder.read_string_attribute("backend");

  // Outputs keep whatever dtype the producer used (the reference writes float64), so only shapes
  // are checked here.
  if (c.is_linear_layer()) {
    read_linear_outputs(g, file, out);
  } else {
    read_attention_outputs(g, file, out);
  }
  if (std::optional<Group> ssm = find_group(g, "ssm")) {
    out.ssm_state = read_named_tensors(*ssm, "state pools");
    check_num_slots(ssm->path(), out.ssm_state);
    check_pools_after(ssm->path(), out.ssm_state, file.inputs.ssm_state);
  }

  const std::optional<Group> found = find_group(g, "metadata");
  if (!found) {
    // /outputs always carries the builders' metadata; /expected may come from an engine without it.
    HYBRIDTB_CHECK(g.path() == "/expected", "missing ", g.path(), "/metadata (the builders' metadata of the step)");
    out.has_metadata = false;
    return out;
  }
  const Group& metadata = *found;
  std::vector<MetadataField> fields;
  collect_metadata(metadata, "", fields, 0);
  try {
    out.metadata = unflatten(fields);
  } catch (const Error& e) {
    throw Error(metadata.path() + ": " + e.what());
  }
  return out;
}

// --- writing -----------------------------------------------------------------------------------

void write_tensor(const Group& group, const std::string& name, const TensorView& view) {
  HYBRIDTB_CHECK(view.device() == Device::kHost, group.child_path(name), ": tensor is on ", to_string(view.device()),
                 "; copy it to the host before writing");
  const Tensor contiguous = view.is_contiguous() ? Tensor() : clone_host(view);
  const TensorView& source = view.is_contiguous() ? view : contiguous.view();
  const h5::Type type = h5::storage_type(source.dtype());
  const Dataset dataset = group.create_dataset(name, type.id(), source.shape());
  if (source.numel() > 0) {
    const int64_t bytes = source.nbytes();
    const Shape& shape = source.shape();
    const auto* data = static_cast<const char*>(source.data());
    move_in_slices(shape, bytes, [&](int64_t row, int64_t rows) {
      if (row == kWholeDataset) return dataset.write_raw(type.id(), data);
      dataset.write_rows(type.id(), row, rows, data + row * (bytes / shape[0]));
    });
  }
  dataset.write_string_attribute(kDtypeName, std::string(to_string(source.dtype())));
}

void write_int32(const Group& group, const std::string& name, const IntArray& array) {
  const h5::Type type = h5::storage_type(DType::kInt32);
  if (array.shape.empty() && array.values.empty()) {
    // A default-constructed IntArray has no shape at all; a null dataspace keeps it distinct from [0].
    group.create_null_dataset(name, type.id()).write_string_attribute(kDtypeName, "int32");
    return;
  }
  const Shape& shape = array.shape;
  int64_t count = 1;
  for (const int64_t dim : shape) count *= dim;
  HYBRIDTB_CHECK(count == array.numel(), group.child_path(name), ": IntArray shape ", shape_to_string(shape), " holds ",
                 count, " values but has ", array.numel());
  const Dataset dataset = group.create_dataset(name, type.id(), shape);
  if (count > 0) dataset.write_raw(type.id(), array.values.data());
  dataset.write_string_attribute(kDtypeName, "int32");
}

void write_float32_scalar(const Group& group, const std::string& name, float value) {
  const h5::Type type = h5::storage_type(DType::kFloat32);
  const Dataset dataset = group.create_dataset(name, type.id(), {});
  dataset.write_raw(type.id(), &value);
  dataset.write_string_attribute(kDtypeName, "float32");
}

void write_float32_vector(const Group& group, const std::string& name, const std::vector<float>& values) {
  const h5::Type type = h5::storage_type(DType::kFloat32);
  const Dataset dataset = group.create_dataset(name, type.id(), {static_cast<int64_t>(values.size())});
  if (!values.empty()) dataset.write_raw(type.id(), values.data());
  dataset.write_string_attribute(kDtypeName, "float32");
}

void write_config(const Group& root, const BatchFile& file) {
  const Group g = root.create_group("config");
  const AttentionConfig& c = file.config;
  g.write_int_attribute("num_heads", c.num_heads);
  g.write_int_attribute("num_kv_heads", c.num_kv_heads);
  g.write_int_attribute("head_size", c.head_size);
  g.write_int_attribute("block_size", c.block_size);
  g.write_float_attribute("scale", c.scale);
  g.write_int_attribute("sliding_window", c.sliding_window);
  g.write_float_attribute("logits_soft_cap", c.logits_soft_cap);
  g.write_int_attribute("use_alibi_sqrt", c.use_alibi_sqrt ? 1 : 0);
  g.write_string_attribute("dtype", std::string(to_string(c.dtype)));
  g.write_string_attribute("kv_cache_dtype", std::string(to_string(c.kv_cache_dtype)));
  g.write_string_attribute("attn_type", std::string(to_string(c.attn_type)));
  // Only linear layers carry layer_kind: absent means full_attention (schema 1.2).
  if (c.is_linear_layer()) g.write_string_attribute("layer_kind", std::string(to_string(c.layer_kind)));
  g.write_string_attribute("ssm_mode", c.ssm_mode);
  g.write_string_attribute("mamba_cache_mode", std::string(to_string(c.mamba_cache_mode)));
  g.write_int_attribute("mamba_block_size", c.mamba_block_size);
  g.write_int_attribute("num_speculative_tokens", c.num_speculative_tokens);
  // Schema 1.3 items, only when they say something (absent = what they meant before 1.3).
  if (!c.engine_version.empty()) g.write_string_attribute("engine_version", c.engine_version);
  if (c.norm_eps) g.write_float_attribute("norm_eps", *c.norm_eps);
  if (!c.mamba_rms_norm) g.write_int_attribute("mamba_rms_norm", 0);
  // Schema 1.4: only rank files carry them.
  if (c.is_tensor_parallel_rank()) {
    g.write_int_attribute("tp_size", c.tp_size);
    g.write_int_attribute("tp_rank", c.tp_rank);
  }
  if (c.alibi_slopes) write_float32_vector(g, "alibi_slopes", *c.alibi_slopes);
  if (c.sinks) write_float32_vector(g, "sinks", *c.sinks);
  if (!c.ssm_params.empty()) {
    const Group ssm = g.create_group("ssm");
    for (const auto& [name, value] : c.ssm_params) ssm.write_int_attribute(name, value);
  }

  const BuilderConfig& b = file.builder;
  g.write_string_attribute("cudagraph_mode", std::string(to_string(b.cudagraph_mode)));
  g.write_int_attribute("max_num_seqs", b.max_num_seqs);
  std::vector<int32_t> sizes;
  for (const int64_t size : b.cudagraph_capture_sizes) {
    HYBRIDTB_CHECK(size >= 0 && size <= std::numeric_limits<int32_t>::max(),
                   "/config/cudagraph_capture_sizes: value ", size, " does not fit int32");
    sizes.push_back(static_cast<int32_t>(size));
  }
  write_int32(g, "cudagraph_capture_sizes", IntArray::vector(std::move(sizes)));
}

void write_batch(const Group& root, const BatchFile& file) {
  const Group g = root.create_group("batch");
  const BatchDescription& b = file.batch;
  write_int32(g, "query_start_loc", b.query_start_loc);
  write_int32(g, "seq_lens", b.seq_lens);
  // An encoder-only batch may leave the table default-constructed; store it as [R, 0].
  const bool no_table = b.block_table.shape.empty() && b.block_table.values.empty();
  write_int32(g, "block_table", no_table ? IntArray::matrix(b.num_reqs(), 0) : b.block_table);
  const h5::Type slot_type = h5::storage_type(DType::kInt64);
  const Dataset slots = g.create_dataset("slot_mapping", slot_type.id(), {b.num_tokens()});
  if (b.num_tokens() > 0) slots.write_raw(slot_type.id(), b.slot_mapping.data());
  slots.write_string_attribute(kDtypeName, "int64");
  g.write_int_attribute("num_actual_tokens", b.num_actual_tokens);
  if (b.mm_prefix_range) write_int32(g, "mm_prefix_range", *b.mm_prefix_range);
  if (b.ssm_block_table) write_int32(g, "ssm_block_table", *b.ssm_block_table);
  if (b.num_accepted_tokens) write_int32(g, "num_accepted_tokens", *b.num_accepted_tokens);
}

void write_inputs(const Group& root, const BatchFile& file) {
  const Group g = root.create_group("inputs");
  const BatchInputs& in = file.inputs;
  if (file.config.is_linear_layer()) {
    // A linear layer's own inputs (validated before the file was created); no attention tensors.
    for (const auto& [name, input] : in.linear_inputs) write_tensor(g, name, input);
  } else {
    write_tensor(g, "query", in.query);
    write_tensor(g, "key", in.key);
    write_tensor(g, "value", in.value);
    if (!in.kv_cache.empty()) write_tensor(g, "kv_cache", in.kv_cache);
    write_float32_scalar(g, "k_scale", in.k_scale);
    write_float32_scalar(g, "v_scale", in.v_scale);
    if (in.output_scale) write_float32_scalar(g, "output_scale", *in.output_scale);
    if (in.q_scale) write_float32_scalar(g, "q_scale", *in.q_scale);
    if (!in.k_scale_cache.empty()) write_tensor(g, "k_scale_cache", in.k_scale_cache);
    if (!in.v_scale_cache.empty()) write_tensor(g, "v_scale_cache", in.v_scale_cache);
    if (!in.ssm_hidden.empty()) write_tensor(g, "ssm_hidden", in.ssm_hidden);
  }
  // The SSM branch (1.1): checked by check_ssm_inputs() before the file was created.
  if (!in.ssm_state.empty()) {
    const Group ssm = g.create_group("ssm");
    for (const auto& [name, pool] : in.ssm_state) write_tensor(ssm, name, pool);
  }
  if (!in.weights.empty()) {
    const Group weights = root.create_group("weights");
    for (const auto& [name, weight] : in.weights) write_tensor(weights, name, weight);
  }
}

// "attention/use_3d_path" → int64 attribute use_3d_path on metadata/attention; arrays → datasets.
void write_metadata(const Group& parent, const HybridMetadata& metadata) {
  std::map<std::string, Group> groups;
  groups.emplace("", parent.create_group("metadata"));
  const std::function<const Group&(const std::string&)> group_for = [&](const std::string& prefix) -> const Group& {
    const auto found = groups.find(prefix);
    if (found != groups.end()) return found->second;
    const size_t slash = prefix.rfind('/');
    const std::string up = slash == std::string::npos ? "" : prefix.substr(0, slash);
    const std::string leaf = slash == std::string::npos ? prefix : prefix.substr(slash + 1);
    Group created = group_for(up).create_group(leaf);
    return groups.emplace(prefix, std::move(created)).first->second;
  };
  for (const MetadataField& field : flatten(metadata)) {
    const size_t slash = field.name.rfind('/');
    const std::string prefix = slash == std::string::npos ? "" : field.name.substr(0, slash);
    const std::string leaf = slash == std::string::npos ? field.name : field.name.substr(slash + 1);
    const Group& group = group_for(prefix);
    if (const auto* scalar = std::get_if<int64_t>(&field.value)) {
      group.write_int_attribute(leaf, *scalar);
    } else {
      write_int32(group, leaf, std::get<IntArray>(field.value));
    }
  }
}

// A linear layer's result: output [T, output_width] alone (checked before anything is created).
void write_linear_outputs(const Group& g, const StepOutputs& out, const BatchFile& file) {
  const LinearLayerSpec spec = linear_layer_spec(file.config);
  const Dims dims{{"T", file.batch.num_tokens()}, {"output_width", spec.output_width}};
  HYBRIDTB_CHECK(!out.output.empty(), "missing dataset ", g.child_path("output"), " (required: ", dim_names(dims),
                 "): the StepOutputs tensor is empty");
  check_shape(g.child_path("output"), out.output.shape(), dims);
  HYBRIDTB_CHECK(is_floating(out.output.dtype()), g.child_path("output"), ": dtype ", to_string(out.output.dtype()),
                 " is not a float type");
  for (const auto& [field, tensor] : {std::pair<const char*, const Tensor*>{"attn_output", &out.attn_output},
                                      {"ssm_output", &out.ssm_output},
                                      {"kv_cache", &out.kv_cache},
                                      {"k_scale_cache", &out.k_scale_cache},
                                      {"v_scale_cache", &out.v_scale_cache}}) {
    HYBRIDTB_CHECK(tensor->empty(), g.child_path(field), ": a linear-attention layer (layer_kind ",
                   to_string(file.config.layer_kind), ") has no such output; leave the StepOutputs tensor empty");
  }
  write_tensor(g, "output", out.output);
}

// A full-attention layer's result: output, attn_output, the caches, the SSM branch's contribution.
void write_attention_outputs(const Group& g, const StepOutputs& out, const BatchFile& file) {
  const AttentionConfig& c = file.config;
  const Dims tokens = token_dims(file.batch.num_tokens(), c, false);
  const int64_t num_blocks = file.inputs.kv_cache.empty() ? -1 : file.inputs.kv_cache.size(0);
  for (const auto& [field, tensor] : {std::pair<const char*, const Tensor*>{"output", &out.output},
                                      std::pair<const char*, const Tensor*>{"attn_output", &out.attn_output}}) {
    HYBRIDTB_CHECK(!tensor->empty(), "missing dataset ", g.child_path(field), " (required: ", dim_names(tokens),
                   "): the StepOutputs tensor is empty");
    check_shape(g.child_path(field), tensor->shape(), tokens);
    write_tensor(g, field, *tensor);
  }
  HYBRIDTB_CHECK(!out.kv_cache.empty() || file.inputs.kv_cache.empty(), "missing dataset ", g.child_path("kv_cache"),
                 " (required: the cache after the write): the StepOutputs tensor is empty");
  if (!out.kv_cache.empty()) {
    check_shape(g.child_path("kv_cache"), out.kv_cache.shape(), kv_cache_dims(num_blocks, c));
    write_tensor(g, "kv_cache", out.kv_cache);
  }
  for (const auto& [field, tensor] : {std::pair<const char*, const Tensor*>{"k_scale_cache", &out.k_scale_cache},
                                      std::pair<const char*, const Tensor*>{"v_scale_cache", &out.v_scale_cache}}) {
    if (tensor->empty()) continue;
    check_shape(g.child_path(field), tensor->shape(), scale_cache_dims(num_blocks, c));
    write_tensor(g, field, *tensor);
  }
  if (!out.ssm_output.empty()) {
    const std::string path = g.child_path("ssm_output");
    check_shape(path, out.ssm_output.shape(), tokens);
    HYBRIDTB_CHECK(is_floating(out.ssm_output.dtype()), path, ": dtype ", to_string(out.ssm_output.dtype()),
                   " is not a float type");
    write_tensor(g, "ssm_output", out.ssm_output);
  }
}

void write_outputs(const Group& root, const char* name, const StepOutputs& out, const BatchFile& file) {
  const Group g = root.create_group(name);
  const AttentionConfig& c = file.config;
  if (c.is_linear_layer()) {
    write_linear_outputs(g, out, file);
  } else {
    write_attention_outputs(g, out, file);
  }
  if (!out.ssm_state.empty()) {
    const std::string group_path = g.child_path("ssm");
    check_tensors_to_write(group_path, out.ssm_state, "state pool", "state pools");
    check_num_slots(group_path, out.ssm_state);
    check_pools_after(group_path, out.ssm_state, file.inputs.ssm_state);
    const Group ssm = g.create_group("ssm");
    for (const auto& [pool_name, pool] : out.ssm_state) write_tensor(ssm, pool_name, pool);
  }
  if (std::strcmp(name, "outputs") == 0) {
    root.write_string_attribute("backend", out.backend);
  } else {
    g.write_string_attribute("backend", out.backend);
  }
  if (out.has_metadata) write_metadata(g, out.metadata);
}

// The oldest 1.x that describes the file: 1.4 when it is a tensor-parallel rank file, 1.3 when it
// uses a 1.3 item (engine_version, norm_eps, mamba_rms_norm, an fp8 query), else 1.2. A file without
// them is byte for byte what a 1.2 build wrote, so regenerated datasets keep their recorded checksums.
std::string written_schema_version(const BatchFile& file) {
  const AttentionConfig& c = file.config;
  const bool uses_1_4 = c.is_tensor_parallel_rank() || !file.inputs.ssm_hidden.empty();
  const bool uses_1_3 = !c.engine_version.empty() || c.norm_eps.has_value() || !c.mamba_rms_norm ||
                        file.inputs.q_scale.has_value();
  const int minor = uses_1_4 ? 4 : uses_1_3 ? 3 : 2;
  return std::to_string(kSchemaMajor) + "." + std::to_string(minor);
}

void write_file_contents(const h5::File& h5file, const BatchFile& file) {
  const Group root = h5file.root();
  root.write_string_attribute("schema", kSchemaName);
  root.write_string_attribute("schema_version", written_schema_version(file));
  for (const auto& [key, value] : file.provenance) {
    HYBRIDTB_CHECK(key != "schema" && key != "schema_version", "provenance key '", key,
                   "' is reserved for the schema");
    if (key == "backend" && file.outputs) continue;  // outputs->backend owns this attribute then
    root.write_string_attribute(key, value);
  }
  write_config(root, file);
  write_batch(root, file);
  write_inputs(root, file);
  if (file.outputs) write_outputs(root, "outputs", *file.outputs, file);
  if (file.expected) write_outputs(root, "expected", *file.expected, file);
}

// Runs `body`, turning anything that is not already an Error (bad_alloc, filesystem errors) into one
// prefixed with `context`, so callers only ever see hybridtb::Error.
template <typename Body>
auto with_context(const std::string& context, Body&& body) {
  try {
    return body();
  } catch (const NotSupported& e) {
    throw NotSupported(context + e.what());
  } catch (const Error& e) {
    throw Error(context + e.what());
  } catch (const std::exception& e) {
    throw Error(context + e.what());
  }
}

}  // namespace

BatchFile read_batch_file(const std::string& path, const FileProgress& progress) {
  const h5::ErrorSilencer silence;
  h5::File h5file = h5::File::open_read_only(path);  // its errors already name the path
  std::error_code size_error;
  const auto file_bytes = std::filesystem::file_size(path, size_error);
  Transfer transfer(progress, "reading " + path, size_error ? 0 : static_cast<int64_t>(file_bytes));
  return with_context(path + ": ", [&] {
    const Group root = h5file.root();
    BatchFile file;
    const bool has_outputs = find_group(root, "outputs").has_value();
    read_root(root, file, has_outputs);
    read_config(root, file);
    validate(file.config);
    validate(file.builder);
    read_batch(root, file);
    read_inputs(root, file);
    validate(file.config, file.batch, file.inputs);
    if (std::optional<Group> g = find_group(root, "outputs")) file.outputs = read_outputs(*g, root, file);
    if (std::optional<Group> g = find_group(root, "expected")) file.expected = read_outputs(*g, *g, file);
    transfer.finish();
    return file;
  });
}

void write_batch_file(const std::string& path, const BatchFile& file, const FileProgress& progress) {
  const h5::ErrorSilencer silence;
  // Reported from here on: the checks below read every tensor of a large file too.
  Transfer transfer(progress, "writing " + path, tensor_data_bytes(file, /*with_inputs=*/true));
  with_context("cannot write '" + path + "': ", [&] {
    validate(file.config);
    validate(file.builder);
    validate(file.config, file.batch, file.inputs);
    check_ssm_inputs(file);
  });
  // Written under a temporary name in the same directory (so the rename is atomic on POSIX) and
  // renamed only once HDF5 has closed it: readers never see a partial file.
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  const TemporaryFile removed_if_interrupted(temporary);
  with_context("cannot write '" + path + "': ", [&] {
    try {
      h5::File h5file = h5::File::create(temporary);
      write_file_contents(h5file, file);
      h5file.close();
      transfer.finish();
      std::filesystem::rename(temporary, path);
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw;
    }
  });
}

std::vector<FileEntry> list_file_entries(const std::string& path) {
  const h5::ErrorSilencer silence;
  const h5::File h5file = h5::File::open_read_only(path);
  return with_context(path + ": ", [&] {
    std::vector<FileEntry> entries;
    entries.push_back({"/", "group", "", {}});
    const std::function<void(const Group&, int)> visit = [&](const Group& group, int depth) {
      if (depth > 32) return;  // hard-link cycles: HDF5 allows them, a listing need not follow
      for (const std::string& name : group.child_names()) {
        if (!group.is_hard_link(name)) continue;
        switch (group.child_kind(name)) {
          case ObjectKind::kGroup: {
            const Group child = group.open_group(name);
            entries.push_back({child.path(), "group", "", {}});
            visit(child, depth + 1);
            break;
          }
          case ObjectKind::kDataset: {
            const Dataset dataset = group.open_dataset(name);
            FileEntry entry{dataset.path(), "dataset", "", {}};
            try {
              entry.dtype_name = dataset.has_attribute(kDtypeName) &&
                                         dataset.attribute_kind(kDtypeName) == AttributeKind::kString
                                     ? dataset.read_string_attribute(kDtypeName)
                                     : h5::describe_type(dataset.file_type().id());
              entry.shape = dataset.shape();
            } catch (const Error&) {
              // A listing describes broken files too; leave what could not be read empty.
            }
            entries.push_back(std::move(entry));
            break;
          }
          default:
            break;
        }
      }
    };
    visit(h5file.root(), 0);
    return entries;
  });
}

// --- Outputs files (`hybridtb run --outputs-only`; SCHEMA.md §5.7) ------------------------------
// Root attributes schema, schema_version, outputs_of (the batch file, relative to the outputs
// file's directory unless absolute), outputs_of_bytes (its size when written: a cheap guard against
// pairing outputs with another file), backend; then /outputs exactly as in a batch file. Kept apart
// from the batch-file reader above: it calls it for the batch and adds only /outputs.

namespace {
constexpr const char* kOutputsOf = "outputs_of";
constexpr const char* kOutputsOfBytes = "outputs_of_bytes";

std::string resolve_outputs_of(const std::string& outputs_path, const std::string& reference) {
  const std::filesystem::path ref(reference);
  if (ref.is_absolute()) return ref.string();
  return (std::filesystem::path(outputs_path).parent_path() / ref).lexically_normal().string();
}
}  // namespace

bool is_outputs_file(const std::string& path) {
  const h5::ErrorSilencer silence;
  try {
    const h5::File h5file = h5::File::open_read_only(path);
    return h5file.root().has_attribute(kOutputsOf);
  } catch (const Error&) {
    return false;  // not HDF5 at all: read_batch_file reports it
  }
}

void write_outputs_file(const std::string& path, const BatchFile& file, const std::string& batch_path,
                        const FileProgress& progress) {
  HYBRIDTB_CHECK(file.outputs.has_value(), "cannot write '", path, "': an outputs file needs /outputs");
  std::error_code error;
  const auto batch_bytes_on_disk = std::filesystem::file_size(batch_path, error);
  HYBRIDTB_CHECK(!error, "cannot write '", path, "': its batch file '", batch_path, "' cannot be read: ",
                 error.message());
  // The batch file named relative to the outputs file's directory, so the pair can move together.
  const std::filesystem::path out_dir = std::filesystem::absolute(path).parent_path();
  const std::string reference =
      std::filesystem::absolute(batch_path).lexically_normal().lexically_relative(out_dir.lexically_normal()).string();
  const h5::ErrorSilencer silence;
  const std::string temporary = path + ".tmp-" + std::to_string(::getpid());
  const TemporaryFile removed_if_interrupted(temporary);
  with_context("cannot write '" + path + "': ", [&] {
    try {
      Transfer transfer(progress, "writing " + path, tensor_data_bytes(file, /*with_inputs=*/false));
      h5::File h5file = h5::File::create(temporary);
      const Group root = h5file.root();
      root.write_string_attribute("schema", kSchemaName);
      root.write_string_attribute("schema_version",
                                  std::to_string(kSchemaMajor) + "." + std::to_string(kSchemaMinor));
      root.write_string_attribute(kOutputsOf, reference.empty() ? batch_path : reference);
      root.write_string_attribute(kOutputsOfBytes, std::to_string(batch_bytes_on_disk));
      write_outputs(root, "outputs", *file.outputs, file);
      h5file.close();
      transfer.finish();
      std::filesystem::rename(temporary, path);
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw;
    }
  });
}

BatchFile read_outputs_file(const std::string& path, std::string* batch_path) {
  std::string reference, expected_bytes;
  {
    const h5::ErrorSilencer silence;
    const h5::File h5file = h5::File::open_read_only(path);
    with_context(path + ": ", [&] {
      const Group root = h5file.root();
      HYBRIDTB_CHECK(root.has_attribute(kOutputsOf), "root attribute ", kOutputsOf,
                     " is missing: not an outputs file (run --outputs-only writes one)");
      reference = root.read_string_attribute(kOutputsOf);
      if (root.has_attribute(kOutputsOfBytes)) expected_bytes = root.read_string_attribute(kOutputsOfBytes);
    });
  }
  const std::string input = resolve_outputs_of(path, reference);
  if (batch_path != nullptr) *batch_path = input;
  std::error_code error;
  const auto bytes = std::filesystem::file_size(input, error);
  HYBRIDTB_CHECK(!error, path, ": root attribute ", kOutputsOf, " names '", reference, "' (", input,
                 "), which cannot be read: ", error.message());
  HYBRIDTB_CHECK(expected_bytes.empty() || expected_bytes == std::to_string(bytes), path, ": root attribute ",
                 kOutputsOfBytes, " is ", expected_bytes, " but ", input, " has ", bytes,
                 " bytes: the batch file changed since these outputs were written");
  BatchFile file = read_batch_file(input);
  const h5::ErrorSilencer silence;
  const h5::File h5file = h5::File::open_read_only(path);
  with_context(path + ": ", [&] {
    const Group root = h5file.root();
    const std::string schema = root.read_string_attribute("schema");
    HYBRIDTB_CHECK(schema == kSchemaName, "root attribute schema is '", schema, "', expected '", kSchemaName, "'");
    const std::optional<Group> g = find_group(root, "outputs");
    HYBRIDTB_CHECK(g.has_value(), "missing group /outputs (an outputs file holds /outputs alone)");
    file.outputs = read_outputs(*g, root, file);
  });
  return file;
}

}  // namespace hybridtb
