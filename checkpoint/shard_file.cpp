// The HDF5 side of a checkpoint shard file (HDF5 C API). Failures come back from HDF5 as negative return
// values with an error stack; its automatic printing is switched off and the innermost message of the
// stack goes into our error: BadInput for a file that cannot be read, Internal (MOE_FAIL) for a write that
// failed.
#include "checkpoint/shard_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <type_traits>
#include <utility>

#include "core/error.h"

namespace moe::ckpt {

static_assert(std::is_same_v<hid_t, int64_t>, "the header stores hid_t as int64_t (HDF5 >= 1.10)");

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    MOE_CHECK(d >= 0, "negative dimension " << d);
    n *= d;
  }
  return n;
}

namespace {

// Closes an HDF5 identifier when it goes out of scope.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& other) noexcept : id_(std::exchange(other.id_, -1)), close_(other.close_) {}
  Hid& operator=(Hid&& other) noexcept {
    std::swap(id_, other.id_);
    std::swap(close_, other.close_);
    return *this;
  }
  ~Hid() {
    if (id_ >= 0) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  // Closes now and says whether it worked: closing a dataset writes its cached chunks.
  bool close() { return close_(std::exchange(id_, -1)) >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// Before the first HDF5 call. HDF5 1.10 leaves a file whose H5Fclose failed (a full disk) half closed, and
// its clean-up at exit then crashes on it: a failed save would end in SIGSEGV instead of our error. So no
// clean-up at exit; every file is closed by its owner. And HDF5 prints its error stack to stderr by
// default; we report errors ourselves.
void init_hdf5() {
  static const bool once = [] {
    H5dont_atexit();  // fails harmlessly if HDF5 was started already
    // A file names the filters its datasets need; HDF5 would load a plugin library for one it lacks. A
    // checkpoint needs none (shuffle, deflate and Fletcher-32 are built in), so no file can make us load code.
    H5PLset_loading_state(0);
    return true;
  }();
  (void)once;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

herr_t innermost_error(unsigned n, const H5E_error2_t* error, void* client_data) {
  auto* out = static_cast<std::string*>(client_data);
  if (n == 0 && error->desc != nullptr) *out = error->desc;
  return 0;
}

// The innermost message of the current error stack (what failed, e.g. "data error detected by Fletcher32
// checksum"). Call it right after the failing call: the next HDF5 call clears the stack.
std::string hdf5_error_detail() {
  std::string detail;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost_error, &detail);
  return detail.empty() ? std::string("no detail from HDF5") : detail;
}

hid_t file_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return H5T_IEEE_F32LE;
    case DType::F64:
      return H5T_IEEE_F64LE;
    case DType::I64:
      return H5T_STD_I64LE;
    case DType::U32:
      return H5T_STD_U32LE;
  }
  return -1;
}

hid_t memory_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return H5T_NATIVE_FLOAT;
    case DType::F64:
      return H5T_NATIVE_DOUBLE;
    case DType::I64:
      return H5T_NATIVE_INT64;
    case DType::U32:
      return H5T_NATIVE_UINT32;
  }
  return -1;
}

// Both sides use the 1.8 format: every HDF5 >= 1.8 (and h5py) reads it, object headers carry checksums, and
// there is no 1.10 "file in use" superblock flag that a crash would leave behind.
Hid file_access_properties() {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  MOE_CHECK(fapl.ok(), "H5Pcreate(H5P_FILE_ACCESS) failed: " << hdf5_error_detail());
  MOE_CHECK(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18) >= 0,
            "H5Pset_libver_bounds failed: " << hdf5_error_detail());
#if H5_VERSION_GE(1, 10, 7)
  // Lock where the file system can; go on without a lock where it cannot (some network file systems).
  MOE_CHECK(H5Pset_file_locking(fapl.get(), true, true) >= 0, "H5Pset_file_locking failed: " << hdf5_error_detail());
#endif
  return fapl;
}

bool valid_dataset_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/') return false;
  if (name.find("//") != std::string::npos) return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

// Chunk dimensions: whole trailing dimensions while they fit in kShardChunkElements, then as many
// indices of the next dimension as fit (at least one), then 1. HDF5 wants every chunk dimension >= 1
// and, for a non-empty dimension, <= its size.
std::vector<hsize_t> chunk_dims(const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> chunk(dims.size(), 1);
  hsize_t elements = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    const hsize_t d = std::max<hsize_t>(dims[i], 1);
    if (elements * d <= static_cast<hsize_t>(kShardChunkElements)) {
      chunk[i] = d;
      elements *= d;
    } else {
      chunk[i] = std::max<hsize_t>(1, static_cast<hsize_t>(kShardChunkElements) / elements);
      break;
    }
  }
  return chunk;
}

struct Block {
  std::vector<hsize_t> start, count;
};

// The flat range [begin, end) of a row-major array of shape dims as at most 2 * rank - 1 rectangular
// blocks, in flat order. `prefix` fixes the indices of the axes before `axis`.
void flat_range_blocks(const std::vector<hsize_t>& dims, size_t axis, std::vector<hsize_t>& prefix, hsize_t begin,
                       hsize_t end, std::vector<Block>& out) {
  if (begin >= end) return;
  auto emit = [&](std::vector<hsize_t> start_tail, std::vector<hsize_t> count_tail) {
    Block b;
    b.start = prefix;
    b.start.insert(b.start.end(), start_tail.begin(), start_tail.end());
    b.count.assign(prefix.size(), 1);
    b.count.insert(b.count.end(), count_tail.begin(), count_tail.end());
    out.push_back(std::move(b));
  };
  if (axis + 1 == dims.size()) {
    emit({begin}, {end - begin});
    return;
  }
  hsize_t inner = 1;
  for (size_t i = axis + 1; i < dims.size(); ++i) inner *= dims[i];
  auto recurse_into_row = [&](hsize_t row, hsize_t row_begin, hsize_t row_end) {
    prefix.push_back(row);
    flat_range_blocks(dims, axis + 1, prefix, row_begin, row_end, out);
    prefix.pop_back();
  };
  if (begin % inner != 0) {  // a partial first row
    const hsize_t row = begin / inner;
    const hsize_t stop = std::min(end, (row + 1) * inner);
    recurse_into_row(row, begin - row * inner, stop - row * inner);
    begin = stop;
  }
  const hsize_t full_rows = (end - begin) / inner;
  if (full_rows > 0) {
    std::vector<hsize_t> start_tail(dims.size() - axis, 0), count_tail(dims.begin() + axis, dims.end());
    start_tail[0] = begin / inner;
    count_tail[0] = full_rows;
    emit(start_tail, count_tail);
    begin += full_rows * inner;
  }
  if (begin < end) recurse_into_row(begin / inner, 0, end - begin);  // a partial last row
}

void write_int64_attribute(hid_t object, const char* key, const std::vector<int64_t>& values, bool scalar,
                           const std::string& where) {
  const hsize_t n = values.size();
  Hid space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (!space.ok()) MOE_FAIL("could not create the dataspace of attribute " << key << " of " << where);
  Hid attribute(H5Acreate2(object, key, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok()) MOE_FAIL("could not create attribute " << key << " of " << where << ": " << hdf5_error_detail());
  const int64_t none = 0;  // HDF5 refuses a null buffer even for zero elements
  if (H5Awrite(attribute.get(), H5T_NATIVE_INT64, values.empty() ? &none : values.data()) < 0)
    MOE_FAIL("could not write attribute " << key << " of " << where << ": " << hdf5_error_detail());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(const std::string& path) : path_(path) {
  init_hdf5();
  std::error_code ec;
  if (std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::not_found)
    MOE_FAIL("refusing to overwrite " << path << ": checkpoint files are written once, into a new directory");
  Hid fapl = file_access_properties();
  // H5F_ACC_EXCL also refuses a file that appeared since the check above.
  file_ = H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
  if (file_ < 0) MOE_FAIL("could not create checkpoint shard " << path << ": " << hdf5_error_detail());
}

ShardWriter::~ShardWriter() {
  if (file_ >= 0) H5Fclose(file_);
}

void ShardWriter::check_writable(const std::string& name) {
  MOE_CHECK(file_ >= 0, "write of " << name << " to " << path_ << " after close()");
  MOE_CHECK(valid_dataset_name(name), "bad dataset name '" << name << "' (non-empty, '/' between non-empty parts)");
  MOE_CHECK(names_written_.insert(name).second, "dataset " << name << " written twice to " << path_);
}

namespace {

// Creates dataset `name` of `shape`, chunked with a Fletcher-32 checksum per chunk, and writes its elements.
Hid create_dataset(hid_t file, const std::string& name, DType dtype, const void* data,
                   const std::vector<int64_t>& shape, bool compress, const std::string& where) {
  const int64_t n = numel(shape);
  MOE_CHECK(n == 0 || data != nullptr, where << ": null data for " << n << " elements");
  // A scalar is stored as one element: chunked storage (and so the checksum) needs a rank >= 1.
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(1);
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  if (!space.ok()) MOE_FAIL("could not create the dataspace of " << where << ": " << hdf5_error_detail());

  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  const std::vector<hsize_t> chunk = chunk_dims(dims);
  if (!dcpl.ok() || H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()) < 0)
    MOE_FAIL("could not set the chunks of " << where << ": " << hdf5_error_detail());
  if (compress) {
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0)
      MOE_FAIL("this HDF5 library has no deflate filter; cannot write compressed " << where);
    if (H5Pset_shuffle(dcpl.get()) < 0 || H5Pset_deflate(dcpl.get(), 4) < 0)
      MOE_FAIL("could not set the compression of " << where << ": " << hdf5_error_detail());
  }
  // Last in the pipeline, so the checksum covers the bytes as stored and is checked first on read.
  if (H5Pset_fletcher32(dcpl.get()) < 0)
    MOE_FAIL("could not set the checksum of " << where << ": " << hdf5_error_detail());

  Hid lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  if (!lcpl.ok() || H5Pset_create_intermediate_group(lcpl.get(), 1) < 0)
    MOE_FAIL("could not set up link creation for " << where << ": " << hdf5_error_detail());

  Hid dataset(H5Dcreate2(file, name.c_str(), file_type(dtype), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
              H5Dclose);
  if (!dataset.ok()) MOE_FAIL("could not create " << where << ": " << hdf5_error_detail());
  if (n > 0 && H5Dwrite(dataset.get(), memory_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    MOE_FAIL("could not write " << where << " (disk full?): " << hdf5_error_detail());
  return dataset;
}

// Chunks smaller than the chunk cache are written here, not by H5Dwrite.
void close_dataset(Hid& dataset, const std::string& where) {
  if (!dataset.close()) MOE_FAIL("could not write " << where << " (disk full?): " << hdf5_error_detail());
}

}  // namespace

void ShardWriter::write(const std::string& name, DType dtype, const void* data, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& global_shape, int64_t flat_offset, bool compress) {
  check_writable(name);
  const int64_t n = numel(shape);
  const int64_t global_n = numel(global_shape);
  MOE_CHECK(flat_offset >= 0 && flat_offset + n <= global_n, name << ": elements [" << flat_offset << ", "
                                                                  << flat_offset + n
                                                                  << ") outside the global tensor of " << global_n);
  const std::string where = "dataset " + name + " of " + path_;
  Hid dataset = create_dataset(file_, name, dtype, data, shape, compress, where);
  write_int64_attribute(dataset.get(), "global_shape", global_shape, false, where);
  write_int64_attribute(dataset.get(), "flat_offset", {flat_offset}, true, where);
  close_dataset(dataset, where);
}

void ShardWriter::write(const std::string& name, DType dtype, const void* data, const Slab& slab, bool compress) {
  check_writable(name);
  const std::string problem = slab.problem();
  MOE_CHECK(problem.empty(), name << ": " << slab.text() << ": " << problem);
  const std::string where = "dataset " + name + " of " + path_;
  Hid dataset = create_dataset(file_, name, dtype, data, slab.stored_shape(), compress, where);
  write_int64_attribute(dataset.get(), "global_shape", slab.global_shape, false, where);
  write_int64_attribute(dataset.get(), "slab_start", slab.start, false, where);
  write_int64_attribute(dataset.get(), "slab_shape", slab.shape, false, where);
  write_int64_attribute(dataset.get(), "range", {slab.begin, slab.count}, false, where);
  close_dataset(dataset, where);
}

void ShardWriter::set_attribute(const std::string& key, const std::string& value) {
  MOE_CHECK(file_ >= 0, "attribute " << key << " set on " << path_ << " after close()");
  MOE_CHECK(!key.empty(), "empty attribute name");
  MOE_CHECK(value.find('\0') == std::string::npos, "attribute " << key << " holds a NUL character");
  const std::string where = "file attribute " + key + " of " + path_;
  const htri_t exists = H5Aexists(file_, key.c_str());
  if (exists < 0 || (exists > 0 && H5Adelete(file_, key.c_str()) < 0))
    MOE_FAIL("could not replace " << where << ": " << hdf5_error_detail());
  // Variable-length UTF-8, so h5py reads a str.
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.ok() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
    MOE_FAIL("could not make the string type of " << where << ": " << hdf5_error_detail());
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attribute(H5Acreate2(file_, key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok()) MOE_FAIL("could not create " << where << ": " << hdf5_error_detail());
  const char* text = value.c_str();
  if (H5Awrite(attribute.get(), type.get(), &text) < 0)
    MOE_FAIL("could not write " << where << ": " << hdf5_error_detail());
}

void ShardWriter::close() {
  if (file_ < 0) return;
  const hid_t file = std::exchange(file_, -1);
  // Metadata still cached is written here, so a full disk can show up at close.
  if (H5Fclose(file) < 0) MOE_FAIL("could not finish writing " << path_ << " (disk full?): " << hdf5_error_detail());
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MOE_FAIL("could not reopen " << path_ << " to sync it: " << std::strerror(errno));
  const int synced = ::fsync(fd);
  const int sync_errno = errno;
  ::close(fd);
  if (synced != 0) MOE_FAIL("could not sync " << path_ << " to disk: " << std::strerror(sync_errno));
}

// ---------------------------------------------------------------------------------------------------------
// ShardReader

namespace {

struct LinkList {
  std::vector<std::string> hard;       // objects of the file itself
  std::vector<std::string> elsewhere;  // soft, external and user-defined links, with their kind
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* client_data) {
  auto* links = static_cast<LinkList*>(client_data);
  if (info->type == H5L_TYPE_HARD) {
    links->hard.push_back(name);
  } else {
    const char* kind = info->type == H5L_TYPE_SOFT       ? "a soft link"
                       : info->type == H5L_TYPE_EXTERNAL ? "an external link"
                                                         : "a user-defined link";
    links->elsewhere.push_back(std::string(name) + " (" + kind + ")");
  }
  return 0;
}

[[noreturn]] void damaged(const std::string& path, const std::string& what, const std::string& detail) {
  MOE_BAD_INPUT("checkpoint shard " << path << " is damaged: " << what << " (" << detail
                                    << "); resume from another checkpoint");
}

std::vector<int64_t> read_int64_attribute(hid_t object, const char* key, const std::string& path,
                                          const std::string& name) {
  Hid attribute(H5Aopen(object, key, H5P_DEFAULT), H5Aclose);
  if (!attribute.ok())
    damaged(path, "cannot open attribute " + std::string(key) + " of dataset " + name, hdf5_error_detail());
  Hid space(H5Aget_space(attribute.get()), H5Sclose);
  const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
  Hid type(H5Aget_type(attribute.get()), H5Tclose);
  if (n < 0 || !type.ok() || H5Tget_class(type.get()) != H5T_INTEGER)
    damaged(path, "attribute " + std::string(key) + " of dataset " + name + " is not an integer array", "bad type");
  std::vector<int64_t> values(std::max<hssize_t>(n, 1));
  if (H5Aread(attribute.get(), H5T_NATIVE_INT64, values.data()) < 0)
    damaged(path, "cannot read attribute " + std::string(key) + " of dataset " + name, hdf5_error_detail());
  values.resize(n);
  return values;
}

[[noreturn]] void foreign_storage(const std::string& path, const std::string& name, const std::string& what) {
  MOE_BAD_INPUT("dataset " << name << " of checkpoint shard " << path << " " << what
                           << ": the writer stores every dataset in its own file, chunked, with a Fletcher-32 "
                              "checksum and at most the shuffle and deflate filters; not a checkpoint written by "
                              "this program, refused before reading it");
}

const char* layout_name(H5D_layout_t layout) {
  if (layout == H5D_CONTIGUOUS) return "contiguous";
  return layout == H5D_COMPACT ? "compact" : "unknown";
}

// Refuses every storage the writer does not produce, before a byte of the dataset is read: external raw data
// files, virtual datasets (which read other files), contiguous or compact layouts, and filters other than
// shuffle, deflate and Fletcher-32 (another filter could be a plugin to load; the checksum is required).
void check_storage(hid_t dataset, const std::string& name, const std::string& path) {
  Hid dcpl(H5Dget_create_plist(dataset), H5Pclose);
  if (!dcpl.ok()) damaged(path, "cannot read the storage properties of dataset " + name, hdf5_error_detail());
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  if (layout == H5D_VIRTUAL) foreign_storage(path, name, "is a virtual dataset (its elements are in other files)");
  const int externals = H5Pget_external_count(dcpl.get());
  if (externals != 0)
    foreign_storage(path, name, "keeps its bytes in " + std::to_string(externals) + " external file(s)");
  if (layout != H5D_CHUNKED) foreign_storage(path, name, std::string("has the ") + layout_name(layout) + " layout");
  const int filters = H5Pget_nfilters(dcpl.get());
  if (filters < 0) damaged(path, "cannot list the filters of dataset " + name, hdf5_error_detail());
  bool checksum = false;
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char filter_name[64] = {};
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl.get(), unsigned(i), &flags, &values, nullptr, sizeof filter_name, filter_name, &config);
    if (id == H5Z_FILTER_FLETCHER32) {
      checksum = true;
    } else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_DEFLATE) {
      foreign_storage(
          path, name,
          "uses filter " + std::to_string(id) + (filter_name[0] ? std::string(" (") + filter_name + ")" : ""));
    }
  }
  if (!checksum) foreign_storage(path, name, "has no Fletcher-32 checksum");
}

DatasetInfo read_dataset_info(hid_t file, const std::string& name, const std::string& path) {
  DatasetInfo info;
  info.name = name;
  Hid dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) damaged(path, "cannot open dataset " + name, hdf5_error_detail());
  check_storage(dataset.get(), name, path);

  Hid type(H5Dget_type(dataset.get()), H5Tclose);
  if (!type.ok()) damaged(path, "cannot read the element type of dataset " + name, hdf5_error_detail());
  const H5T_class_t type_class = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (type_class == H5T_FLOAT && size == 4) {
    info.dtype = DType::F32;
  } else if (type_class == H5T_FLOAT && size == 8) {
    info.dtype = DType::F64;
  } else if (type_class == H5T_INTEGER && size == 8 && H5Tget_sign(type.get()) == H5T_SGN_2) {
    info.dtype = DType::I64;
  } else if (type_class == H5T_INTEGER && size == 4 && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    info.dtype = DType::U32;
  } else {
    MOE_BAD_INPUT("dataset " << name << " of checkpoint shard " << path
                             << " has an element type other than f32, f64, i64, u32 (HDF5 class " << type_class << ", "
                             << size << " bytes): not a checkpoint written by this program");
  }

  Hid space(H5Dget_space(dataset.get()), H5Sclose);
  if (!space.ok() || H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE)
    MOE_BAD_INPUT("dataset " << name << " of checkpoint shard " << path
                             << " is not a simple array: not a checkpoint written by this program");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
    damaged(path, "cannot read the shape of dataset " + name, hdf5_error_detail());
  info.shape.assign(dims.begin(), dims.end());

  // Datasets written by other tools lack the attributes: they are whole tensors.
  const htri_t has_global = H5Aexists(dataset.get(), "global_shape");
  const htri_t has_offset = H5Aexists(dataset.get(), "flat_offset");
  const htri_t has_slab = H5Aexists(dataset.get(), "slab_start");
  if (has_global < 0 || has_offset < 0 || has_slab < 0)
    damaged(path, "cannot list the attributes of dataset " + name, hdf5_error_detail());
  info.global_shape = has_global ? read_int64_attribute(dataset.get(), "global_shape", path, name) : info.shape;
  if (has_offset) {
    const std::vector<int64_t> offset = read_int64_attribute(dataset.get(), "flat_offset", path, name);
    if (offset.size() != 1)
      damaged(path, "attribute flat_offset of dataset " + name + " is not one number", "bad shape");
    info.flat_offset = offset[0];
  }
  // The writer stores a scalar as {1}; a scalar global tensor means the stored slice is that scalar.
  if (info.global_shape.empty() && info.shape == std::vector<int64_t>{1}) info.shape.clear();

  for (int64_t d : info.global_shape)
    if (d < 0) damaged(path, "dataset " + name + " has a negative global dimension", std::to_string(d));
  info.has_slab = has_slab > 0;
  if (info.has_slab) {
    info.slab.global_shape = info.global_shape;
    info.slab.start = read_int64_attribute(dataset.get(), "slab_start", path, name);
    if (H5Aexists(dataset.get(), "slab_shape") <= 0 || H5Aexists(dataset.get(), "range") <= 0)
      damaged(path, "dataset " + name + " has slab_start but not slab_shape and range", "missing attributes");
    info.slab.shape = read_int64_attribute(dataset.get(), "slab_shape", path, name);
    const std::vector<int64_t> range = read_int64_attribute(dataset.get(), "range", path, name);
    if (range.size() != 2) damaged(path, "attribute range of dataset " + name + " is not two numbers", "bad shape");
    info.slab.begin = range[0], info.slab.count = range[1];
  } else {
    info.slab = Slab::flat(info.global_shape, info.flat_offset, info.numel());
  }
  const std::string problem = info.slab.problem();
  if (!problem.empty() || info.slab.count != info.numel())
    damaged(path,
            "dataset " + name + " of " + std::to_string(info.numel()) + " elements says it holds " + info.slab.text() +
                (problem.empty() ? "" : ": " + problem),
            "inconsistent attributes");
  return info;
}

}  // namespace

ShardReader::ShardReader(const std::string& path) : path_(path) {
  init_hdf5();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) MOE_BAD_INPUT("checkpoint shard " << path << " does not exist");
  Hid fapl = file_access_properties();
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (file_ < 0)
    MOE_BAD_INPUT("checkpoint shard " << path << " is not a readable HDF5 file (" << hdf5_error_detail()
                                      << "): it is truncated, damaged or not a checkpoint; resume from another one");
  try {
    LinkList links;
    if (H5Lvisit(file_, H5_INDEX_NAME, H5_ITER_INC, collect_link, &links) < 0)
      damaged(path, "cannot list its contents", hdf5_error_detail());
    // A link to elsewhere (another file, or a path that may name one) is never followed: refused.
    if (!links.elsewhere.empty())
      MOE_BAD_INPUT("checkpoint shard " << path << " holds " << links.elsewhere.front()
                                        << ": the writer makes no links, a checkpoint reads nothing outside its "
                                           "own files; refused before following it");
    for (const std::string& name : links.hard) {
      Hid object(H5Oopen(file_, name.c_str(), H5P_DEFAULT), H5Oclose);
      if (!object.ok()) damaged(path, "cannot open object " + name, hdf5_error_detail());
      if (H5Iget_type(object.get()) == H5I_DATASET) datasets_.push_back(read_dataset_info(file_, name, path));
    }
  } catch (...) {
    H5Fclose(std::exchange(file_, -1));
    throw;
  }
  std::sort(datasets_.begin(), datasets_.end(),
            [](const DatasetInfo& a, const DatasetInfo& b) { return a.name < b.name; });
}

ShardReader::~ShardReader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool ShardReader::has(const std::string& name) const {
  auto it = std::lower_bound(datasets_.begin(), datasets_.end(), name,
                             [](const DatasetInfo& d, const std::string& n) { return d.name < n; });
  return it != datasets_.end() && it->name == name;
}

const DatasetInfo& ShardReader::info(const std::string& name) const {
  auto it = std::lower_bound(datasets_.begin(), datasets_.end(), name,
                             [](const DatasetInfo& d, const std::string& n) { return d.name < n; });
  if (it == datasets_.end() || it->name != name)
    MOE_BAD_INPUT("checkpoint shard " << path_ << " has no dataset " << name
                                      << ": the checkpoint does not fit this model or is incomplete");
  return *it;
}

void ShardReader::read(const std::string& name, DType dtype, int64_t begin, int64_t count, void* out) const {
  const DatasetInfo& meta = info(name);
  MOE_CHECK(dtype == meta.dtype, "dataset " << name << " of " << path_ << " holds " << dtype_name(meta.dtype)
                                            << ", asked for " << dtype_name(dtype));
  MOE_CHECK(begin >= 0 && count >= 0 && begin + count <= meta.numel(),
            "elements [" << begin << ", " << begin + count << ") outside dataset " << name << " of " << meta.numel());
  if (count == 0) return;
  MOE_CHECK(out != nullptr, "null output for " << count << " elements of " << name);

  Hid dataset(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dataset.ok()) damaged(path_, "cannot open dataset " + name, hdf5_error_detail());
  Hid file_space(H5Dget_space(dataset.get()), H5Sclose);
  const int rank = file_space.ok() ? H5Sget_simple_extent_ndims(file_space.get()) : -1;
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank <= 0 || H5Sget_simple_extent_dims(file_space.get(), dims.data(), nullptr) < 0)
    damaged(path_, "cannot read the shape of dataset " + name, hdf5_error_detail());

  if (begin == 0 && count == meta.numel()) {  // the whole dataset: HDF5's "all" selections skip its span iteration
    if (H5Dread(dataset.get(), memory_type(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
      damaged(path_, "cannot read dataset " + name, hdf5_error_detail());
    return;
  }
  std::vector<Block> blocks;
  std::vector<hsize_t> prefix;
  flat_range_blocks(dims, 0, prefix, static_cast<hsize_t>(begin), static_cast<hsize_t>(begin + count), blocks);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (H5Sselect_hyperslab(file_space.get(), i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, blocks[i].start.data(), nullptr,
                            blocks[i].count.data(), nullptr) < 0)
      MOE_FAIL("could not select elements [" << begin << ", " << begin + count << ") of " << name << ": "
                                             << hdf5_error_detail());
  }
  const hsize_t n = static_cast<hsize_t>(count);
  Hid memory_space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (H5Dread(dataset.get(), memory_type(dtype), memory_space.get(), file_space.get(), H5P_DEFAULT, out) < 0)
    damaged(path_,
            "cannot read elements [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ") of dataset " +
                name,
            hdf5_error_detail());
}

std::string ShardReader::attribute(const std::string& key) const {
  const htri_t exists = H5Aexists(file_, key.c_str());
  if (exists < 0) damaged(path_, "cannot look up file attribute " + key, hdf5_error_detail());
  if (exists == 0) return {};
  Hid attribute(H5Aopen(file_, key.c_str(), H5P_DEFAULT), H5Aclose);
  Hid type(attribute.ok() ? H5Aget_type(attribute.get()) : -1, H5Tclose);
  if (!type.ok()) damaged(path_, "cannot open file attribute " + key, hdf5_error_detail());
  if (H5Tget_class(type.get()) != H5T_STRING)
    MOE_BAD_INPUT("file attribute " << key << " of checkpoint shard " << path_ << " is not a string");
  // HDF5 converts no character set into another: read in the file's own.
  const H5T_cset_t cset = H5Tget_cset(type.get());
  const htri_t variable = H5Tis_variable_str(type.get());
  if (variable > 0) {
    Hid memory(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(memory.get(), H5T_VARIABLE);
    H5Tset_cset(memory.get(), cset);
    char* text = nullptr;
    if (H5Aread(attribute.get(), memory.get(), &text) < 0)
      damaged(path_, "cannot read file attribute " + key, hdf5_error_detail());
    std::string value = text != nullptr ? text : "";
    H5free_memory(text);
    return value;
  }
  // A fixed-length string (other writers): read as is, drop the padding.
  const size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  Hid memory(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(memory.get(), size);
  H5Tset_cset(memory.get(), cset);
  if (H5Aread(attribute.get(), memory.get(), value.data()) < 0)
    damaged(path_, "cannot read file attribute " + key, hdf5_error_detail());
  value.resize(std::strlen(value.c_str()));
  return value;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
    case DType::I64:
      return "i64";
    case DType::U32:
      return "u32";
  }
  return "?";
}

}  // namespace moe::ckpt
