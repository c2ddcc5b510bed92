// The RAII layer over the HDF5 C API declared in hdf5.h: handles, error translation, types,
// attributes and raw dataset I/O. Exercised by tests/io/hdf5_wrapper_test.cpp.
#include "io/hdf5.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "hybridtb/error.h"

namespace hybridtb::h5 {

static_assert(std::endian::native == std::endian::little,
              "hybridtb writes little-endian HDF5 types straight from host memory");

// --- errors ------------------------------------------------------------------------------------

ErrorSilencer::ErrorSilencer() {
  if (H5Eget_auto2(H5E_DEFAULT, &saved_func_, &saved_data_) >= 0) {
    restore_ = H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0;
  }
}

ErrorSilencer::~ErrorSilencer() {
  if (restore_) H5Eset_auto2(H5E_DEFAULT, saved_func_, saved_data_);
}

namespace {

struct StackEntry {
  std::string description;
  std::string minor;
};

herr_t collect_entry(unsigned /*n*/, const H5E_error2_t* error, void* data) noexcept {
  try {
    auto* entries = static_cast<std::vector<StackEntry>*>(data);
    StackEntry entry;
    if (error->desc != nullptr) entry.description = error->desc;
    std::array<char, 256> minor{};
    if (H5Eget_msg(error->min_num, nullptr, minor.data(), minor.size()) > 0) entry.minor = minor.data();
    entries->push_back(std::move(entry));
    return 0;
  } catch (...) {
    return -1;
  }
}

}  // namespace

std::string error_message() {
  std::vector<StackEntry> entries;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_entry, &entries);
  H5Eclear2(H5E_DEFAULT);
  if (entries.empty()) return "";
  // The outermost entry says what the API call was doing, the innermost why it failed; the
  // frames in between only repeat them.
  std::string message = entries.front().description;
  const StackEntry& cause = entries.back();
  if (entries.size() > 1 && !cause.description.empty() && cause.description != message) {
    message += ": " + cause.description;
  }
  if (!cause.minor.empty()) message += " (" + cause.minor + ")";
  return "HDF5: " + message;
}

void fail(const std::string& context) {
  const std::string detail = error_message();
  throw Error(detail.empty() ? context : context + ": " + detail);
}

// --- handles -----------------------------------------------------------------------------------

Handle::Handle(Handle&& other) noexcept
    : id_(std::exchange(other.id_, H5I_INVALID_HID)), close_(other.close_) {}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    close_ = other.close_;
  }
  return *this;
}

void Handle::reset() {
  if (id_ >= 0 && close_ != nullptr) {
    const ErrorSilencer silence;
    if (close_(id_) < 0) H5Eclear2(H5E_DEFAULT);
  }
  id_ = H5I_INVALID_HID;
}

hid_t Handle::release() { return std::exchange(id_, H5I_INVALID_HID); }

// --- types -------------------------------------------------------------------------------------

Type Type::copy_of(hid_t predefined) { return Type(check(H5Tcopy(predefined), "cannot copy an HDF5 datatype")); }

namespace {

// A 2-byte float built from IEEE single as h5py builds its half type. The calls must come in this
// order: fields first (they must fit the precision), then precision and size (which must still
// cover the fields), then the bias.
Type two_byte_float(size_t epos, size_t esize, size_t msize, size_t ebias) {
  Type type = Type::copy_of(H5T_IEEE_F32LE);
  const std::string what = "cannot build a 2-byte HDF5 float type";
  check_status(H5Tset_fields(type.id(), 15, epos, esize, 0, msize), what);
  check_status(H5Tset_precision(type.id(), 16), what);
  check_status(H5Tset_size(type.id(), 2), what);
  check_status(H5Tset_ebias(type.id(), ebias), what);
  return type;
}

struct FloatLayout {
  DType dtype;
  size_t size, spos, epos, esize, msize, ebias;
};
constexpr std::array<FloatLayout, 4> kFloatLayouts{{
    {DType::kFloat64, 8, 63, 52, 11, 52, 1023},
    {DType::kFloat32, 4, 31, 23, 8, 23, 127},
    {DType::kFloat16, 2, 15, 10, 5, 10, 15},
    {DType::kBFloat16, 2, 15, 7, 8, 7, 127},
}};

}  // namespace

Type bfloat16_type() { return two_byte_float(7, 8, 7, 127); }
Type float16_type() { return two_byte_float(10, 5, 10, 15); }

Type storage_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return Type::copy_of(H5T_IEEE_F64LE);
    case DType::kFloat32: return Type::copy_of(H5T_IEEE_F32LE);
    case DType::kFloat16: return float16_type();
    case DType::kBFloat16: return bfloat16_type();
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kBool: return Type::copy_of(H5T_STD_U8LE);
    case DType::kInt8: return Type::copy_of(H5T_STD_I8LE);
    case DType::kInt32: return Type::copy_of(H5T_STD_I32LE);
    case DType::kInt64: return Type::copy_of(H5T_STD_I64LE);
  }
  throw Error("storage_type: unknown dtype");
}

TypeInfo inspect_type(hid_t type) {
  TypeInfo info;
  info.type_class = H5Tget_class(type);
  info.size = H5Tget_size(type);
  switch (info.type_class) {
    case H5T_INTEGER:
      info.is_signed = H5Tget_sign(type) == H5T_SGN_2;
      info.big_endian = H5Tget_order(type) == H5T_ORDER_BE;
      break;
    case H5T_ENUM: {
      const Type base(check(H5Tget_super(type), "cannot get the base type of an HDF5 enum"));
      info.is_signed = H5Tget_sign(base.id()) == H5T_SGN_2;
      info.big_endian = H5Tget_order(base.id()) == H5T_ORDER_BE;
      break;
    }
    case H5T_FLOAT: {
      info.big_endian = H5Tget_order(type) == H5T_ORDER_BE;
      size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
      if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) {
        H5Eclear2(H5E_DEFAULT);
        break;
      }
      info.mantissa_bits = msize;
      const size_t ebias = H5Tget_ebias(type);
      const bool plain = H5Tget_offset(type) == 0 && H5Tget_precision(type) == 8 * info.size &&
                         H5Tget_norm(type) == H5T_NORM_IMPLIED && mpos == 0;
      for (const FloatLayout& layout : kFloatLayouts) {
        if (plain && layout.size == info.size && layout.spos == spos && layout.epos == epos &&
            layout.esize == esize && layout.msize == msize && layout.ebias == ebias) {
          info.float_dtype = layout.dtype;
        }
      }
      break;
    }
    case H5T_STRING:
      info.variable_string = H5Tis_variable_str(type) > 0;
      break;
    default:
      break;
  }
  return info;
}

std::string describe_type(hid_t type) {
  const TypeInfo info = inspect_type(type);
  const std::string order = info.big_endian && info.size > 1 ? " big-endian" : "";
  switch (info.type_class) {
    case H5T_INTEGER:
      return (info.is_signed ? "int" : "uint") + std::to_string(8 * info.size) + order;
    case H5T_ENUM:
      return "enum of " + std::string(info.is_signed ? "int" : "uint") + std::to_string(8 * info.size);
    case H5T_FLOAT:
      if (info.float_dtype) return std::string(to_string(*info.float_dtype)) + order;
      return "float(size " + std::to_string(info.size) + ", mantissa " + std::to_string(info.mantissa_bits) +
             " bits)" + order;
    case H5T_STRING:
      return info.variable_string ? "string" : "string[" + std::to_string(info.size) + "]";
    case H5T_COMPOUND: return "compound";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_BITFIELD: return "bitfield";
    case H5T_TIME: return "time";
    default: return "unknown type";
  }
}

// --- attributes --------------------------------------------------------------------------------

namespace {

// Little-endian (or big-endian) two's-complement/unsigned bytes → int64, or nullopt on overflow.
std::optional<int64_t> decode_integer(const unsigned char* bytes, size_t size, bool is_signed, bool big_endian) {
  uint64_t bits = 0;
  for (size_t i = 0; i < size; ++i) {
    const size_t source = big_endian ? size - 1 - i : i;
    bits |= static_cast<uint64_t>(bytes[source]) << (8 * i);
  }
  if (is_signed) {
    if (size < 8 && (bits >> (8 * size - 1)) != 0) bits |= ~uint64_t{0} << (8 * size);  // sign-extend
    return static_cast<int64_t>(bits);
  }
  if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(bits);
}

herr_t collect_attribute_name(hid_t /*location*/, const char* name, const H5A_info_t* /*info*/,
                              void* data) noexcept {
  try {
    static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    return 0;
  } catch (...) {
    return -1;
  }
}

// An open attribute plus its type, checked to hold exactly one element.
struct OpenAttribute {
  Handle attribute;
  Type type;
  TypeInfo info;
};

OpenAttribute open_single_attribute(hid_t object, const std::string& name, const std::string& where) {
  OpenAttribute open;
  open.attribute = Handle(check(H5Aopen(object, name.c_str(), H5P_DEFAULT), "cannot open " + where), H5Aclose);
  open.type = Type(check(H5Aget_type(open.attribute.id()), "cannot get the type of " + where));
  open.info = inspect_type(open.type.id());
  const Handle space(check(H5Aget_space(open.attribute.id()), "cannot get the shape of " + where), H5Sclose);
  const H5S_class_t space_class = H5Sget_simple_extent_type(space.id());
  const hssize_t points = H5Sget_simple_extent_npoints(space.id());
  if (space_class == H5S_NULL || points != 1) {
    throw Error(where + ": expected a single value, found " + std::to_string(points < 0 ? 0 : points) + " values");
  }
  return open;
}

}  // namespace

std::string Object::child_path(const std::string& name) const {
  return path_ == "/" ? "/" + name : path_ + "/" + name;
}

std::string Object::attribute_path(const std::string& name) const { return "attribute " + child_path(name); }

bool Object::has_attribute(const std::string& name) const {
  const htri_t exists = H5Aexists(id(), name.c_str());
  if (exists < 0) fail("cannot look up " + attribute_path(name));
  return exists > 0;
}

std::vector<std::string> Object::attribute_names() const {
  std::vector<std::string> names;
  hsize_t index = 0;
  check_status(H5Aiterate2(id(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute_name, &names),
               "cannot list the attributes of " + path_);
  return names;
}

AttributeKind Object::attribute_kind(const std::string& name) const {
  const Handle attribute(check(H5Aopen(id(), name.c_str(), H5P_DEFAULT), "cannot open " + attribute_path(name)),
                         H5Aclose);
  const Type type(check(H5Aget_type(attribute.id()), "cannot get the type of " + attribute_path(name)));
  switch (H5Tget_class(type.id())) {
    case H5T_STRING: return AttributeKind::kString;
    case H5T_INTEGER:
    case H5T_ENUM: return AttributeKind::kInteger;
    case H5T_FLOAT: return AttributeKind::kFloat;
    default: return AttributeKind::kOther;
  }
}

std::string Object::read_string_attribute(const std::string& name) const {
  const std::string where = attribute_path(name);
  const OpenAttribute open = open_single_attribute(id(), name, where);
  if (open.info.type_class != H5T_STRING) {
    throw Error(where + ": expected a string, found " + describe_type(open.type.id()));
  }
  if (open.info.variable_string) {
    // Read into a variable-length type of the same character set: HDF5 does not convert between
    // ASCII and UTF-8, and needs no conversion for identical ones.
    const Type memory = Type::copy_of(H5T_C_S1);
    check_status(H5Tset_size(memory.id(), H5T_VARIABLE), "cannot build a string type");
    check_status(H5Tset_cset(memory.id(), H5Tget_cset(open.type.id())), "cannot build a string type");
    char* text = nullptr;
    check_status(H5Aread(open.attribute.id(), memory.id(), &text), "cannot read " + where);
    std::string value = text != nullptr ? text : "";
    H5free_memory(text);
    return value;
  }
  std::string buffer(open.info.size, '\0');
  check_status(H5Aread(open.attribute.id(), open.type.id(), buffer.data()), "cannot read " + where);
  buffer.resize(std::strlen(buffer.c_str()));  // NUL-terminated or NUL-padded
  while (!buffer.empty() && buffer.back() == ' ') buffer.pop_back();  // space-padded (Fortran style)
  return buffer;
}

int64_t Object::read_int_attribute(const std::string& name) const {
  const std::string where = attribute_path(name);
  const OpenAttribute open = open_single_attribute(id(), name, where);
  const TypeInfo& info = open.info;
  if ((info.type_class == H5T_INTEGER || info.type_class == H5T_ENUM) && info.size <= 8) {
    std::array<unsigned char, 8> bytes{};
    check_status(H5Aread(open.attribute.id(), open.type.id(), bytes.data()), "cannot read " + where);
    const std::optional<int64_t> value = decode_integer(bytes.data(), info.size, info.is_signed, info.big_endian);
    if (!value) throw Error(where + ": value does not fit int64");
    return *value;
  }
  if (info.type_class == H5T_FLOAT) {
    double value = 0.0;
    check_status(H5Aread(open.attribute.id(), H5T_NATIVE_DOUBLE, &value), "cannot read " + where);
    // h5py users sometimes store counts as floats (numpy arithmetic); accept exact integers only.
    if (std::isfinite(value) && value == std::trunc(value) && std::abs(value) < 9.0e18) {
      return static_cast<int64_t>(value);
    }
    throw Error(where + ": expected an integer, found " + std::to_string(value));
  }
  throw Error(where + ": expected an integer, found " + describe_type(open.type.id()));
}

double Object::read_float_attribute(const std::string& name) const {
  const std::string where = attribute_path(name);
  const OpenAttribute open = open_single_attribute(id(), name, where);
  if (open.info.type_class == H5T_FLOAT) {
    double value = 0.0;
    check_status(H5Aread(open.attribute.id(), H5T_NATIVE_DOUBLE, &value), "cannot read " + where);
    return value;
  }
  if (open.info.type_class == H5T_INTEGER) return static_cast<double>(read_int_attribute(name));
  throw Error(where + ": expected a number, found " + describe_type(open.type.id()));
}

namespace {

void write_scalar_attribute(hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                            const void* value, const std::string& where) {
  const htri_t exists = H5Aexists(object, name.c_str());
  if (exists < 0) fail("cannot look up " + where);
  if (exists > 0) check_status(H5Adelete(object, name.c_str()), "cannot replace " + where);
  const Handle space(check(H5Screate(H5S_SCALAR), "cannot create a scalar dataspace"), H5Sclose);
  const Handle attribute(
      check(H5Acreate2(object, name.c_str(), file_type, space.id(), H5P_DEFAULT, H5P_DEFAULT), "cannot create " + where),
      H5Aclose);
  check_status(H5Awrite(attribute.id(), memory_type, value), "cannot write " + where);
}

}  // namespace

void Object::write_string_attribute(const std::string& name, const std::string& value) const {
  const Type type = Type::copy_of(H5T_C_S1);
  check_status(H5Tset_size(type.id(), H5T_VARIABLE), "cannot build a string type");
  check_status(H5Tset_cset(type.id(), H5T_CSET_UTF8), "cannot build a string type");
  const char* text = value.c_str();
  write_scalar_attribute(id(), name, type.id(), type.id(), &text, attribute_path(name));
}

void Object::write_int_attribute(const std::string& name, int64_t value) const {
  write_scalar_attribute(id(), name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, attribute_path(name));
}

void Object::write_float_attribute(const std::string& name, double value) const {
  write_scalar_attribute(id(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, attribute_path(name));
}

void Object::remove_attribute(const std::string& name) const {
  check_status(H5Adelete(id(), name.c_str()), "cannot remove " + attribute_path(name));
}

// --- datasets ----------------------------------------------------------------------------------

Shape Dataset::shape() const {
  const Handle space(check(H5Dget_space(id()), "cannot get the shape of " + path()), H5Sclose);
  switch (H5Sget_simple_extent_type(space.id())) {
    case H5S_SCALAR: return {};
    case H5S_SIMPLE: break;
    default: throw Error(path() + ": dataset has no elements (null dataspace)");
  }
  const int rank = H5Sget_simple_extent_ndims(space.id());
  if (rank < 0) fail("cannot get the rank of " + path());
  if (rank > 32) throw Error(path() + ": rank " + std::to_string(rank) + " is not supported");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  check_status(H5Sget_simple_extent_dims(space.id(), dims.data(), nullptr), "cannot get the shape of " + path());
  Shape shape;
  for (const hsize_t dim : dims) {
    if (dim > static_cast<hsize_t>(std::numeric_limits<int64_t>::max() / 2)) {
      throw Error(path() + ": dimension " + std::to_string(dim) + " is too large");
    }
    shape.push_back(static_cast<int64_t>(dim));
  }
  return shape;
}

bool Dataset::is_null() const {
  const Handle space(check(H5Dget_space(id()), "cannot get the shape of " + path()), H5Sclose);
  return H5Sget_simple_extent_type(space.id()) == H5S_NULL;
}

Type Dataset::file_type() const { return Type(check(H5Dget_type(id()), "cannot get the type of " + path())); }

TypeInfo Dataset::type_info() const { return inspect_type(file_type().id()); }

uint64_t Dataset::storage_bytes() const {
  // H5Dget_storage_size returns 0 both for "nothing stored" and on failure; both mean no data.
  const hsize_t bytes = H5Dget_storage_size(id());
  H5Eclear2(H5E_DEFAULT);
  return bytes;
}

int Dataset::filter_count() const {
  const Handle dcpl(check(H5Dget_create_plist(id()), "cannot get the storage properties of " + path()), H5Pclose);
  const int count = H5Pget_nfilters(dcpl.id());
  if (count < 0) fail("cannot get the filters of " + path());
  return count;
}

bool Dataset::stored_elsewhere() const {
  const Handle dcpl(check(H5Dget_create_plist(id()), "cannot get the storage properties of " + path()), H5Pclose);
  const H5D_layout_t layout = H5Pget_layout(dcpl.id());
  if (layout < 0) fail("cannot get the storage layout of " + path());
  const int external = H5Pget_external_count(dcpl.id());
  if (external < 0) fail("cannot get the storage layout of " + path());
  return layout == H5D_VIRTUAL || external > 0;
}

namespace {

void check_no_conversion(hid_t dataset, hid_t mem_type, const std::string& path) {
  const Type file(check(H5Dget_type(dataset), "cannot get the type of " + path));
  const htri_t equal = H5Tequal(file.id(), mem_type);
  if (equal < 0) fail("cannot compare the types of " + path);
  if (equal == 0) throw Error(path + ": internal error: raw I/O with a memory type that differs from the file type");
}

}  // namespace

void Dataset::read_raw(hid_t mem_type, void* data) const {
  check_no_conversion(id(), mem_type, path());
  check_status(H5Dread(id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "cannot read " + path());
}

void Dataset::write_raw(hid_t mem_type, const void* data) const {
  check_no_conversion(id(), mem_type, path());
  check_status(H5Dwrite(id(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "cannot write " + path());
}

namespace {

// The file and memory dataspaces of rows [first_row, first_row + row_count) of a dataset.
struct RowSelection {
  Handle file_space;
  Handle memory_space;
};

RowSelection select_rows(hid_t dataset, const std::string& path, int64_t first_row, int64_t row_count) {
  Handle file_space(check(H5Dget_space(dataset), "cannot get the dataspace of " + path), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(file_space.id());
  if (rank < 1) fail(path + ": a row selection needs rank >= 1");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (H5Sget_simple_extent_dims(file_space.id(), dims.data(), nullptr) < 0) fail("cannot get the shape of " + path);
  if (first_row < 0 || row_count < 0 || static_cast<hsize_t>(first_row + row_count) > dims[0]) {
    throw Error(path + ": rows [" + std::to_string(first_row) + ", " + std::to_string(first_row + row_count) +
                ") are outside its " + std::to_string(dims[0]) + " rows");
  }
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(first_row);
  count[0] = static_cast<hsize_t>(row_count);
  check_status(H5Sselect_hyperslab(file_space.id(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
               "cannot select rows of " + path);
  Handle memory_space(check(H5Screate_simple(rank, count.data(), nullptr), "cannot create a dataspace"), H5Sclose);
  return {std::move(file_space), std::move(memory_space)};
}

}  // namespace

void Dataset::read_rows(hid_t mem_type, int64_t first_row, int64_t row_count, void* data) const {
  check_no_conversion(id(), mem_type, path());
  const RowSelection rows = select_rows(id(), path(), first_row, row_count);
  check_status(H5Dread(id(), mem_type, rows.memory_space.id(), rows.file_space.id(), H5P_DEFAULT, data),
               "cannot read " + path());
}

void Dataset::write_rows(hid_t mem_type, int64_t first_row, int64_t row_count, const void* data) const {
  check_no_conversion(id(), mem_type, path());
  const RowSelection rows = select_rows(id(), path(), first_row, row_count);
  check_status(H5Dwrite(id(), mem_type, rows.memory_space.id(), rows.file_space.id(), H5P_DEFAULT, data),
               "cannot write " + path());
}

// --- groups ------------------------------------------------------------------------------------

ObjectKind Group::child_kind(const std::string& name) const {
  const htri_t exists = H5Lexists(id(), name.c_str(), H5P_DEFAULT);
  if (exists < 0) fail("cannot look up " + child_path(name));
  if (exists == 0) return ObjectKind::kMissing;
  const hid_t object = H5Oopen(id(), name.c_str(), H5P_DEFAULT);
  if (object < 0) {
    H5Eclear2(H5E_DEFAULT);  // a dangling soft or external link
    return ObjectKind::kOther;
  }
  const H5I_type_t type = H5Iget_type(object);
  H5Oclose(object);
  if (type == H5I_GROUP) return ObjectKind::kGroup;
  if (type == H5I_DATASET) return ObjectKind::kDataset;
  return ObjectKind::kOther;
}

std::vector<std::string> Group::child_names() const {
  H5G_info_t info{};
  check_status(H5Gget_info(id(), &info), "cannot list " + path());
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t length = H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (length < 0) fail("cannot list " + path());
    std::string name(static_cast<size_t>(length) + 1, '\0');
    if (H5Lget_name_by_idx(id(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT) < 0) {
      fail("cannot list " + path());
    }
    name.resize(static_cast<size_t>(length));
    names.push_back(std::move(name));
  }
  return names;
}

bool Group::is_hard_link(const std::string& name) const {
  H5L_info_t info{};
  check_status(H5Lget_info(id(), name.c_str(), &info, H5P_DEFAULT), "cannot look up " + child_path(name));
  return info.type == H5L_TYPE_HARD;
}

Group Group::open_group(const std::string& name) const {
  return Group(check(H5Gopen2(id(), name.c_str(), H5P_DEFAULT), "cannot open group " + child_path(name)),
               child_path(name));
}

namespace {

// Creation property lists with object timestamps off, so identical content gives identical bytes.
Handle untimed_creation_list(hid_t list_class) {
  Handle list(check(H5Pcreate(list_class), "cannot create an HDF5 property list"), H5Pclose);
  check_status(H5Pset_obj_track_times(list.id(), 0), "cannot disable HDF5 object timestamps");
  return list;
}

}  // namespace

Group Group::create_group(const std::string& name) const {
  const Handle gcpl = untimed_creation_list(H5P_GROUP_CREATE);
  return Group(check(H5Gcreate2(id(), name.c_str(), H5P_DEFAULT, gcpl.id(), H5P_DEFAULT),
                     "cannot create group " + child_path(name)),
               child_path(name));
}

void Group::remove_child(const std::string& name) const {
  check_status(H5Ldelete(id(), name.c_str(), H5P_DEFAULT), "cannot remove " + child_path(name));
}

Dataset Group::open_dataset(const std::string& name) const {
  return Dataset(check(H5Dopen2(id(), name.c_str(), H5P_DEFAULT), "cannot open dataset " + child_path(name)),
                 child_path(name));
}

namespace {

Dataset create_with_space(const Group& group, const std::string& name, hid_t type, hid_t space) {
  const Handle dcpl = untimed_creation_list(H5P_DATASET_CREATE);
  return Dataset(check(H5Dcreate2(group.id(), name.c_str(), type, space, H5P_DEFAULT, dcpl.id(), H5P_DEFAULT),
                       "cannot create dataset " + group.child_path(name)),
                 group.child_path(name));
}

}  // namespace

Dataset Group::create_dataset(const std::string& name, hid_t type, const Shape& shape) const {
  if (shape.empty()) {
    const Handle space(check(H5Screate(H5S_SCALAR), "cannot create a dataspace"), H5Sclose);
    return create_with_space(*this, name, type, space.id());
  }
  std::vector<hsize_t> dims;
  for (const int64_t dim : shape) {
    if (dim < 0) throw Error(child_path(name) + ": negative dimension in shape " + shape_to_string(shape));
    dims.push_back(static_cast<hsize_t>(dim));
  }
  const Handle space(check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                           "cannot create a dataspace for " + child_path(name)),
                     H5Sclose);
  return create_with_space(*this, name, type, space.id());
}

Dataset Group::create_null_dataset(const std::string& name, hid_t type) const {
  const Handle space(check(H5Screate(H5S_NULL), "cannot create a dataspace"), H5Sclose);
  return create_with_space(*this, name, type, space.id());
}

// --- files -------------------------------------------------------------------------------------

File File::open_read_only(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw Error("cannot open '" + path + "': no such file");
  if (std::filesystem::is_directory(status)) throw Error("cannot open '" + path + "': it is a directory");
  // A FIFO or a device would block or stream; HDF5 needs a regular file it can seek in.
  if (!std::filesystem::is_regular_file(status)) {
    throw Error("cannot open '" + path + "': not a regular file (a FIFO or device cannot be read as an HDF5 batch)");
  }
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    const std::string detail = error_message();
    throw Error("cannot open '" + path + "' as an HDF5 file (truncated or not HDF5?)" +
                (detail.empty() ? "" : ": " + detail));
  }
  return File(id, path);
}

File File::create(const std::string& path) {
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) fail("cannot create '" + path + "'");
  return File(id, path);
}

File File::open_read_write(const std::string& path) {
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (id < 0) fail("cannot open '" + path + "' for writing");
  return File(id, path);
}

Group File::root() const {
  return Group(check(H5Gopen2(handle_.id(), "/", H5P_DEFAULT), "cannot open the root group of '" + path_ + "'"),
               "/");
}

void File::close() {
  if (!handle_.valid()) return;
  const hid_t id = handle_.release();
  check_status(H5Fclose(id), "cannot close '" + path_ + "'");
}

}  // namespace hybridtb::h5
