// A thin RAII layer over the HDF5 C API (1.10), private to the batch-file code in io/.
//
// Every handle closes itself; every failing call becomes a hybridtb::Error naming our object path
// plus HDF5's own message (the automatic stack printing is silenced by ErrorSilencer). Raw reads
// and writes never ask HDF5 to convert dataset elements: 1.10's software conversion is very slow,
// so callers read with the file type and convert in dtype.h. See datasets/SCHEMA.md for the format.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hybridtb/dtype.h"
#include "hybridtb/tensor.h"

namespace hybridtb::h5 {

// --- errors ------------------------------------------------------------------------------------

// While alive, HDF5 failures on this thread are not printed to stderr (the stack stays available
// for error_message()). The previous handler is restored on destruction; guards nest.
class ErrorSilencer {
 public:
  ErrorSilencer();
  ~ErrorSilencer();
  ErrorSilencer(const ErrorSilencer&) = delete;
  ErrorSilencer& operator=(const ErrorSilencer&) = delete;

 private:
  H5E_auto2_t saved_func_ = nullptr;
  void* saved_data_ = nullptr;
  bool restore_ = false;
};

// HDF5's description of the last failure on this thread ("" if none), then clears the stack.
std::string error_message();
// Throws Error("<context>: <HDF5 message>").
[[noreturn]] void fail(const std::string& context);
inline hid_t check(hid_t id, const std::string& context) {
  if (id < 0) fail(context);
  return id;
}
inline void check_status(herr_t status, const std::string& context) {
  if (status < 0) fail(context);
}

// --- handles -----------------------------------------------------------------------------------

// Owns one hid_t and the H5*close function that releases it. Move-only.
class Handle {
 public:
  using CloseFn = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, CloseFn close) : id_(id), close_(close) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  hid_t id() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();     // closes now; errors are ignored (there is nobody to report them to)
  hid_t release();  // gives up ownership without closing

 private:
  hid_t id_ = H5I_INVALID_HID;
  CloseFn close_ = nullptr;
};

// A datatype handle (H5Tclose). Predefined types are copied so that every Type owns its id.
class Type {
 public:
  Type() = default;
  explicit Type(hid_t id) : handle_(id, H5Tclose) {}
  static Type copy_of(hid_t predefined);
  hid_t id() const { return handle_.id(); }

 private:
  Handle handle_;
};

// The custom 2-byte float types of the schema. bfloat16: sign bit 15, exponent bits 7–14 (bias
// 127), mantissa bits 0–6 — h5py reads it as exact float32. float16: IEEE half, as h5py builds it.
Type bfloat16_type();
Type float16_type();
// The little-endian storage type of a dtype (fp8 and bool as uint8, int8 as int8).
Type storage_type(DType dtype);

// What a file datatype is, in the terms our readers care about.
struct TypeInfo {
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t size = 0;               // bytes
  bool is_signed = false;        // integers (enums: of their base type)
  bool big_endian = false;       // only meaningful for size > 1
  bool variable_string = false;  // strings
  // Floats whose bit layout is exactly one of our IEEE-like formats (fields, bias, precision,
  // implied normalisation); nullopt for any other float layout and for non-floats.
  std::optional<DType> float_dtype;
  size_t mantissa_bits = 0;      // floats: for messages about unknown layouts
};
TypeInfo inspect_type(hid_t type);
// "float32", "bfloat16", "int32", "uint8", "string", "float(size 2, mantissa 9 bits)", … for listings.
std::string describe_type(hid_t type);

// --- objects -----------------------------------------------------------------------------------

enum class ObjectKind { kMissing, kGroup, kDataset, kOther };
enum class AttributeKind { kString, kInteger, kFloat, kOther };

// Something that can carry attributes (a group or a dataset), with its path for messages.
class Object {
 public:
  hid_t id() const { return handle_.id(); }
  const std::string& path() const { return path_; }
  std::string child_path(const std::string& name) const;

  bool has_attribute(const std::string& name) const;
  std::vector<std::string> attribute_names() const;  // in name order
  AttributeKind attribute_kind(const std::string& name) const;

  // Liberal readers: scalar or one-element attributes. Strings may be fixed- or variable-length,
  // ASCII or UTF-8 (fixed-length ones lose NUL/space padding). Integers of any width and sign
  // (and integer-valued floats) are read exactly; floats of any IEEE width (and integers) as double.
  std::string read_string_attribute(const std::string& name) const;
  int64_t read_int_attribute(const std::string& name) const;
  double read_float_attribute(const std::string& name) const;

  // Strict writers: variable-length UTF-8 strings, int64 and float64 scalars.
  void write_string_attribute(const std::string& name, const std::string& value) const;
  void write_int_attribute(const std::string& name, int64_t value) const;
  void write_float_attribute(const std::string& name, double value) const;
  void remove_attribute(const std::string& name) const;

 protected:
  Object(Handle handle, std::string path) : handle_(std::move(handle)), path_(std::move(path)) {}

 private:
  std::string attribute_path(const std::string& name) const;  // "/config@num_heads"
  Handle handle_;
  std::string path_;
};

class Dataset : public Object {
 public:
  Dataset(hid_t id, std::string path) : Object(Handle(id, H5Dclose), std::move(path)) {}

  // [] for a scalar dataspace; throws for a null dataspace (h5py.Empty) or a rank above 32.
  Shape shape() const;
  bool is_null() const;  // a null dataspace: no shape and no elements (h5py.Empty)
  Type file_type() const;
  TypeInfo type_info() const;
  // Bytes of raw data the file holds for this dataset (H5Dget_storage_size): 0 for storage never
  // written, less than the declared size for unallocated chunks, the compressed size with filters.
  uint64_t storage_bytes() const;
  int filter_count() const;
  // Whether the raw data lives outside this file (external raw files or a virtual dataset).
  bool stored_elsewhere() const;
  // Reads/writes the whole dataset. `mem_type` must equal the file type (no conversion happens);
  // `data` holds product(shape) elements of that type.
  void read_raw(hid_t mem_type, void* data) const;
  void write_raw(hid_t mem_type, const void* data) const;
  // The same for rows [first_row, first_row + row_count) of dimension 0 (rank >= 1); `data` holds
  // those rows only. Lets a caller move a large dataset in slices and report progress between them.
  void read_rows(hid_t mem_type, int64_t first_row, int64_t row_count, void* data) const;
  void write_rows(hid_t mem_type, int64_t first_row, int64_t row_count, const void* data) const;
};

class Group : public Object {
 public:
  Group(hid_t id, std::string path) : Object(Handle(id, H5Gclose), std::move(path)) {}

  ObjectKind child_kind(const std::string& name) const;
  std::vector<std::string> child_names() const;  // link names, in name order
  bool is_hard_link(const std::string& name) const;

  Group open_group(const std::string& name) const;
  Group create_group(const std::string& name) const;
  void remove_child(const std::string& name) const;  // unlinks it (the space is not reclaimed)
  Dataset open_dataset(const std::string& name) const;
  // A contiguous dataset of `type` and `shape` (Shape{} = scalar) with object timestamps off, so
  // identical content gives identical bytes.
  Dataset create_dataset(const std::string& name, hid_t type, const Shape& shape) const;
  // A dataset with a null dataspace (no shape, no elements; h5py reads it as h5py.Empty).
  Dataset create_null_dataset(const std::string& name, hid_t type) const;
};

class File {
 public:
  // Throws Error "cannot open '<path>' …" for a missing, unreadable, truncated or non-HDF5 file.
  static File open_read_only(const std::string& path);
  // Creates (truncates) `path` with default (earliest) format bounds so HDF5 1.8+ can read it.
  static File create(const std::string& path);
  // Opens an existing file for modification (tests use it to build malformed files).
  static File open_read_write(const std::string& path);

  Group root() const;
  // Flushes and closes; throws if HDF5 reports a failure (e.g. the disk filled up).
  void close();
  const std::string& path() const { return path_; }

 private:
  File(hid_t id, std::string path) : handle_(id, H5Fclose), path_(std::move(path)) {}
  Handle handle_;
  std::string path_;
};

}  // namespace hybridtb::h5
