// Tests of the HDF5 shard file: bit-exact round trips of every element type (NaN and Inf patterns
// included), scalars and empty datasets, datasets spanning several chunks read in pieces across chunk
// borders, compression, file attributes; and the failures: overwriting, a full disk, truncated, flipped and
// foreign files, each with the error kind and the names the message must carry.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/shard_file.h"
#include "core/error.h"

namespace moe::ckpt {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class ShardFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "moe_test_shard_file_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

template <typename T>
std::vector<T> from_bits(const std::vector<uint64_t>& bits) {
  std::vector<T> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    if constexpr (sizeof(T) == 4) {
      const uint32_t b = static_cast<uint32_t>(bits[i]);
      std::memcpy(&out[i], &b, 4);
    } else {
      std::memcpy(&out[i], &bits[i], 8);
    }
  }
  return out;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `f`, expects a moe::Error of `kind`, returns its message.
template <typename F>
std::string error_message(ErrorKind kind, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.message();
    return e.message();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a moe::Error: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no error thrown";
  return {};
}

TEST_F(ShardFileTest, EveryDtypeRoundTripsBitForBit) {
  // Quiet and signalling NaNs with payloads, both infinities, -0, denormals, extremes.
  const auto f32 = from_bits<float>({0x7fc00000, 0xffc00123, 0x7fa00001, 0x7f800000, 0xff800000, 0x80000000, 0x00000001,
                                     0x807fffff, 0x3f800000, 0x7f7fffff});
  const auto f64 =
      from_bits<double>({0x7ff8000000000000ull, 0xfff8000000000abcull, 0x7ff0000000000001ull, 0x7ff0000000000000ull,
                         0xfff0000000000000ull, 0x8000000000000000ull, 0x0000000000000001ull, 0x3ff0000000000000ull});
  const std::vector<int64_t> i64 = {INT64_MIN, INT64_MAX, -1, 0, 1, 1234567890123};
  const std::vector<uint32_t> u32 = {0, 1, 0xffffffffu, 0x80000000u, 42, 7};
  {
    ShardWriter w(path("a.h5"));
    w.write("params/layers.0.attn.wq", DType::F32, f32.data(), {2, 5}, {4, 5}, 10);
    w.write("params/embed", DType::F64, f64.data(), {8}, {8}, 0);
    w.write("adam/step", DType::I64, i64.data(), {3, 2}, {3, 2}, 0);
    w.write("data/positions", DType::U32, u32.data(), {6}, {20}, 14);
    w.close();
  }
  ShardReader r(path("a.h5"));
  std::vector<std::string> names;
  for (const DatasetInfo& d : r.datasets()) names.push_back(d.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"adam/step", "data/positions", "params/embed", "params/layers.0.attn.wq"}));
  EXPECT_TRUE(r.has("params/embed"));
  EXPECT_FALSE(r.has("params"));  // a group, not a dataset
  EXPECT_FALSE(r.has("params/missing"));

  const DatasetInfo& wq = r.info("params/layers.0.attn.wq");
  EXPECT_EQ(wq.dtype, DType::F32);
  EXPECT_EQ(wq.shape, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(wq.global_shape, (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(wq.flat_offset, 10);
  EXPECT_EQ(wq.numel(), 10);
  EXPECT_EQ(r.info("data/positions").flat_offset, 14);
  EXPECT_EQ(r.info("data/positions").global_shape, (std::vector<int64_t>{20}));

  std::vector<float> f32_back(f32.size());
  r.read("params/layers.0.attn.wq", DType::F32, 0, 10, f32_back.data());
  EXPECT_TRUE(same_bits(f32, f32_back));
  std::vector<double> f64_back(f64.size());
  r.read("params/embed", DType::F64, 0, 8, f64_back.data());
  EXPECT_TRUE(same_bits(f64, f64_back));
  std::vector<int64_t> i64_back(i64.size());
  r.read("adam/step", DType::I64, 0, 6, i64_back.data());
  EXPECT_EQ(i64, i64_back);
  std::vector<uint32_t> u32_back(u32.size());
  r.read("data/positions", DType::U32, 0, 6, u32_back.data());
  EXPECT_EQ(u32, u32_back);

  // No conversion: asking for another dtype is a bug of the caller.
  error_message(ErrorKind::Internal, [&] { r.read("params/embed", DType::F32, 0, 1, f32_back.data()); });
  error_message(ErrorKind::Internal, [&] { r.read("params/embed", DType::F64, 4, 5, f64_back.data()); });
  const std::string missing = error_message(ErrorKind::BadInput, [&] { r.info("params/missing"); });
  EXPECT_NE(missing.find("params/missing"), std::string::npos) << missing;
}

TEST_F(ShardFileTest, ScalarsAndEmptyDatasetsRoundTrip) {
  const double scalar = -3.25;
  {
    ShardWriter w(path("e.h5"));
    w.write("scalar", DType::F64, &scalar, {}, {}, 0);
    w.write("empty/vector", DType::F32, nullptr, {0}, {10}, 10);
    w.write("empty/rows", DType::I64, nullptr, {0, 7}, {5, 7}, 35);
    w.write("empty/cols", DType::U32, nullptr, {3, 0}, {3, 0}, 0, /*compress=*/true);
    w.close();
  }
  ShardReader r(path("e.h5"));
  ASSERT_EQ(r.datasets().size(), 4u);
  EXPECT_EQ(r.info("scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(r.info("scalar").global_shape, std::vector<int64_t>{});
  EXPECT_EQ(r.info("scalar").numel(), 1);
  double back = 0;
  r.read("scalar", DType::F64, 0, 1, &back);
  EXPECT_EQ(back, scalar);

  EXPECT_EQ(r.info("empty/vector").shape, (std::vector<int64_t>{0}));
  EXPECT_EQ(r.info("empty/vector").flat_offset, 10);
  EXPECT_EQ(r.info("empty/rows").shape, (std::vector<int64_t>{0, 7}));
  EXPECT_EQ(r.info("empty/rows").global_shape, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(r.info("empty/cols").shape, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(r.info("empty/cols").numel(), 0);
  r.read("empty/vector", DType::F32, 0, 0, nullptr);
  r.read("empty/cols", DType::U32, 0, 0, nullptr);
}

TEST_F(ShardFileTest, EveryFlatRangeOfASmallArray) {
  // Every [begin, begin + count) of a (3, 4, 5) array: partial rows and planes on both ends.
  std::vector<int64_t> values(60);
  for (int64_t i = 0; i < 60; ++i) values[i] = 1000 + i;
  {
    ShardWriter w(path("s.h5"));
    w.write("t", DType::I64, values.data(), {3, 4, 5}, {3, 4, 5}, 0);
    w.close();
  }
  ShardReader r(path("s.h5"));
  int64_t wrong = 0;
  for (int64_t begin = 0; begin <= 60; ++begin) {
    for (int64_t count = 0; begin + count <= 60; ++count) {
      std::vector<int64_t> out(count + 1, -1);
      r.read("t", DType::I64, begin, count, out.data());
      for (int64_t i = 0; i < count; ++i) wrong += out[i] != values[begin + i];
      wrong += out[count] != -1;  // nothing written past the range
    }
  }
  EXPECT_EQ(wrong, 0);
}

uint32_t pattern(uint64_t i) { return static_cast<uint32_t>(i * 2654435761u) ^ 0x5bd1e995u; }

int64_t chunks_in(const std::string& file, const std::string& name) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  // HDF5 1.10 refuses H5S_ALL here (1.12 takes it): pass the dataset's own dataspace.
  hid_t space = H5Dget_space(d);
  hsize_t n = 0;
  EXPECT_GE(H5Dget_num_chunks(d, space, &n), 0) << name;
  H5Sclose(space);
  hid_t dcpl = H5Dget_create_plist(d);
  hsize_t chunk[8] = {};
  const int rank = H5Pget_chunk(dcpl, 8, chunk);
  hsize_t elements = 1;
  for (int i = 0; i < rank; ++i) elements *= chunk[i];
  EXPECT_LE(elements, static_cast<hsize_t>(kShardChunkElements)) << name;
  H5Pclose(dcpl);
  H5Dclose(d);
  H5Fclose(f);
  return static_cast<int64_t>(n);
}

TEST_F(ShardFileTest, LargeDatasetsReadInPiecesAcrossChunkBorders) {
  // (3077, 1024): chunks of 1024 whole rows. (3, 5, 300001): a plane is over a chunk, so chunks are
  // (1, 3, 300001) and the second plane's rows are split 3 + 2.
  const std::vector<std::vector<int64_t>> shapes = {{3077, 1024}, {3, 5, 300001}};
  std::vector<std::vector<uint32_t>> data;
  {
    ShardWriter w(path("big.h5"));
    for (size_t s = 0; s < shapes.size(); ++s) {
      std::vector<uint32_t> v(numel(shapes[s]));
      for (size_t i = 0; i < v.size(); ++i) v[i] = pattern(i + s);
      w.write("big/" + std::to_string(s), DType::U32, v.data(), shapes[s], shapes[s], 0, /*compress=*/s == 1);
      data.push_back(std::move(v));
    }
    w.close();
  }
  EXPECT_EQ(chunks_in(path("big.h5"), "big/0"), 4);
  EXPECT_EQ(chunks_in(path("big.h5"), "big/1"), 6);

  ShardReader r(path("big.h5"));
  std::mt19937_64 rng(7);
  for (size_t s = 0; s < shapes.size(); ++s) {
    const std::string name = "big/" + std::to_string(s);
    const int64_t n = numel(shapes[s]);
    std::vector<std::pair<int64_t, int64_t>> ranges = {
        {0, n}, {kShardChunkElements - 3, 8}, {2 * kShardChunkElements - 1000, 5000}, {n - 1, 1}};
    for (int k = 0; k < 40; ++k) {
      const int64_t begin = static_cast<int64_t>(rng() % n);
      ranges.push_back({begin, static_cast<int64_t>(rng() % std::min<int64_t>(n - begin, 3 * kShardChunkElements))});
    }
    for (const auto& [begin, count] : ranges) {
      std::vector<uint32_t> out(count);
      r.read(name, DType::U32, begin, count, out.data());
      EXPECT_TRUE(std::equal(out.begin(), out.end(), data[s].begin() + begin))
          << name << " [" << begin << ", " << begin + count << ")";
    }
  }
}

TEST_F(ShardFileTest, CompressedDatasetsAreSmallAndExact) {
  // An XOR delta between two nearby checkpoints: mostly zero bits.
  std::vector<uint32_t> delta(1 << 20, 0);
  std::vector<double> doubles(1 << 18);
  for (size_t i = 0; i < delta.size(); i += 97) delta[i] = static_cast<uint32_t>(i) & 0x3ff;
  for (size_t i = 0; i < doubles.size(); ++i) doubles[i] = static_cast<double>(i % 1000) * 0.5;
  {
    ShardWriter w(path("c.h5"));
    w.write("delta/params", DType::U32, delta.data(), {1024, 1024}, {2048, 1024}, 1 << 20, /*compress=*/true);
    w.write("delta/f64", DType::F64, doubles.data(), {1 << 18}, {1 << 18}, 0, /*compress=*/true);
    w.close();
  }
  const auto raw_bytes = delta.size() * 4 + doubles.size() * 8;
  EXPECT_LT(fs::file_size(path("c.h5")), raw_bytes / 8);
  ShardReader r(path("c.h5"));
  std::vector<uint32_t> back(delta.size());
  r.read("delta/params", DType::U32, 0, static_cast<int64_t>(back.size()), back.data());
  EXPECT_EQ(back, delta);
  std::vector<double> doubles_back(1000);
  r.read("delta/f64", DType::F64, 123456, 1000, doubles_back.data());
  EXPECT_TRUE(std::equal(doubles_back.begin(), doubles_back.end(), doubles.begin() + 123456));
}

TEST_F(ShardFileTest, FileAttributes) {
  const std::string long_value(100000, 'x');  // over HDF5's 64 KiB compact attribute limit
  {
    ShardWriter w(path("attr.h5"));
    w.set_attribute("format", "moe-shard-1");
    w.set_attribute("empty", "");
    w.set_attribute("config", long_value);
    w.set_attribute("utf8",
                    "Gr\xc3\xbc\xc3\x9f"
                    "e \xe2\x9c\x93");
    w.set_attribute("step", "100");
    w.set_attribute("step", "200");  // replaced
    w.close();
    w.close();  // a second close does nothing
  }
  ShardReader r(path("attr.h5"));
  EXPECT_EQ(r.attribute("format"), "moe-shard-1");
  EXPECT_EQ(r.attribute("empty"), "");
  EXPECT_EQ(r.attribute("config"), long_value);
  EXPECT_EQ(r.attribute("utf8"),
            "Gr\xc3\xbc\xc3\x9f"
            "e \xe2\x9c\x93");
  EXPECT_EQ(r.attribute("step"), "200");
  EXPECT_EQ(r.attribute("absent"), "");
  EXPECT_TRUE(r.datasets().empty());
}

TEST_F(ShardFileTest, RefusesToOverwriteAndMisuse) {
  write_bytes(path("exists.h5"), "precious");
  const std::string message = error_message(ErrorKind::Internal, [&] { ShardWriter w(path("exists.h5")); });
  EXPECT_NE(message.find(path("exists.h5")), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path("exists.h5")), "precious");

  const std::string no_dir = path("no/such/dir/x.h5");
  const std::string create = error_message(ErrorKind::Internal, [&] { ShardWriter w(no_dir); });
  EXPECT_NE(create.find(no_dir), std::string::npos) << create;

  const float x[2] = {1, 2};
  ShardWriter w(path("w.h5"));
  w.write("a/b", DType::F32, x, {2}, {2}, 0);
  error_message(ErrorKind::Internal, [&] { w.write("a/b", DType::F32, x, {2}, {2}, 0); });   // twice
  error_message(ErrorKind::Internal, [&] { w.write("c", DType::F32, x, {2}, {3}, 2); });     // past the end
  error_message(ErrorKind::Internal, [&] { w.write("/d", DType::F32, x, {2}, {2}, 0); });    // bad name
  error_message(ErrorKind::Internal, [&] { w.write("e//f", DType::F32, x, {2}, {2}, 0); });  // bad name
  w.close();
  error_message(ErrorKind::Internal, [&] { w.write("g", DType::F32, x, {2}, {2}, 0); });  // after close
  ShardReader r(path("w.h5"));
  EXPECT_EQ(r.datasets().size(), 1u);
}

// A file-size limit makes writes fail with EFBIG, as a full disk fails them with ENOSPC. Each case runs in
// a child process that then exits normally: HDF5 1.10 crashed at exit after a failed close unless told not
// to clean up (shard_file.cpp), so the exit status is part of the test.
TEST_F(ShardFileTest, FailedWritesAreErrorsNamingTheFileAndTheProcessExitsCleanly) {
  struct Case {
    const char* name;
    int64_t datasets, elements;  // one big dataset fails in H5Dwrite; small ones fail when their cache is flushed
  };
  for (const Case& c : {Case{"big", 1, 4 << 20}, Case{"small", 40, 100000}}) {
    const std::string file = path(std::string(c.name) + ".h5");
    const std::string message_file = path(std::string(c.name) + ".txt");
    std::fflush(nullptr);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      rlimit limit{};
      ::getrlimit(RLIMIT_FSIZE, &limit);
      limit.rlim_cur = 1 << 20;
      ::setrlimit(RLIMIT_FSIZE, &limit);
      int status = 3;  // no error
      std::string message;
      try {
        const std::vector<float> data(c.elements, 1.5f);
        ShardWriter w(file);
        for (int64_t i = 0; i < c.datasets; ++i)
          w.write("params/" + std::to_string(i), DType::F32, data.data(), {c.elements}, {c.elements}, 0);
        w.close();
      } catch (const Error& e) {
        status = e.kind() == ErrorKind::Internal ? 0 : 4;
        message = e.message();
      } catch (...) {
        status = 5;
      }
      write_bytes(message_file, message);
      std::exit(status);  // runs the exit handlers
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status)) << c.name << ": killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << c.name << ": 3 no error, 4 BadInput, 5 not a moe::Error";
    const std::string message = read_bytes(message_file);
    EXPECT_NE(message.find(file), std::string::npos) << message;
  }
}

TEST_F(ShardFileTest, TruncatedFileIsBadInputNamingThePath) {
  std::vector<float> v(50000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  {
    ShardWriter w(path("t.h5"));
    w.write("params/w", DType::F32, v.data(), {500, 100}, {500, 100}, 0);
    w.set_attribute("format", "moe-shard-1");
    w.close();
  }
  const std::string whole = read_bytes(path("t.h5"));
  for (size_t size : {whole.size() - 1, whole.size() / 2, size_t{100}, size_t{0}}) {
    const std::string file = path("truncated_" + std::to_string(size));
    write_bytes(file, whole.substr(0, size));
    const std::string message = error_message(ErrorKind::BadInput, [&] {
      ShardReader r(file);
      std::vector<float> out(v.size());
      r.read("params/w", DType::F32, 0, static_cast<int64_t>(out.size()), out.data());
    });
    EXPECT_NE(message.find(file), std::string::npos) << message;
  }
}

TEST_F(ShardFileTest, FlippedDataByteIsBadInputNamingTheDataset) {
  // A recognisable pattern, so the stored bytes can be found in the file.
  std::vector<uint32_t> v(8192);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0xa5a50000u + static_cast<uint32_t>(i);
  const std::vector<double> other = {1, 2, 3};
  {
    ShardWriter w(path("f.h5"));
    w.write("params/layers.3.ffn.w1", DType::U32, v.data(), {64, 128}, {128, 128}, 64 * 128);
    w.write("params/other", DType::F64, other.data(), {3}, {3}, 0);
    w.close();
  }
  std::string bytes = read_bytes(path("f.h5"));
  const std::string needle(reinterpret_cast<const char*>(v.data() + 100), 64);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos);
  bytes[at + 4 * 3000 + 1] ^= 0x10;  // element 3100
  write_bytes(path("f.h5"), bytes);

  ShardReader r(path("f.h5"));  // the metadata are intact
  std::vector<uint32_t> out(v.size());
  for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 8192}, {3100, 1}, {5000, 10}}) {
    // One chunk: any read of it checks the whole chunk.
    const std::string message = error_message(
        ErrorKind::BadInput, [&] { r.read("params/layers.3.ffn.w1", DType::U32, begin, count, out.data()); });
    EXPECT_NE(message.find("params/layers.3.ffn.w1"), std::string::npos) << message;
    EXPECT_NE(message.find(path("f.h5")), std::string::npos) << message;
  }
  std::vector<double> other_back(3);
  r.read("params/other", DType::F64, 0, 3, other_back.data());  // the damage stays in its chunk
  EXPECT_EQ(other_back, other);
}

TEST_F(ShardFileTest, MissingAndForeignFilesAreBadInput) {
  write_bytes(path("text.h5"), "this is not an HDF5 file, just some text that is long enough to look like one\n");
  write_bytes(path("empty.h5"), "");
  for (const std::string& file : {path("missing.h5"), path("text.h5"), path("empty.h5"), dir_.string()}) {
    const std::string message = error_message(ErrorKind::BadInput, [&] { ShardReader r(file); });
    EXPECT_NE(message.find(file), std::string::npos) << message;
  }
}

// ---- Storage the writer never produces -----------------------------------------------------------------------
// A forger can keep a dataset's bytes in another file (external raw storage, a virtual dataset, an external
// link) or ask for a filter HDF5 would load as a plugin. The reader refuses each before reading a byte.

// An HDF5 handle closed by `close` (the test's own, the library's is private to shard_file.cpp).
struct H5 {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5() {
    if (id >= 0) close(id);
  }
};

// Opens `file` for writing, lets `add` add one object to it, closes it.
void add_to_file(const std::string& file, const std::function<void(hid_t)>& add) {
  H5 f{H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(f.id, 0) << file;
  add(f.id);
}

// A 1-D dataset of 4 doubles named `name` with the creation properties `dcpl`.
void add_dataset(hid_t file, const char* name, hid_t dcpl) {
  const hsize_t n = 4;
  const double values[4] = {1, 2, 3, 4};
  H5 space{H5Screate_simple(1, &n, nullptr), H5Sclose};
  H5 d{H5Dcreate2(file, name, H5T_IEEE_F64LE, space.id, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose};
  ASSERT_GE(d.id, 0) << name;
  if (H5Pget_layout(dcpl) != H5D_VIRTUAL) {
    ASSERT_GE(H5Dwrite(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values), 0) << name;
  }
}

TEST_F(ShardFileTest, StorageOutsideTheFileAndForeignFiltersAreRefused) {
  const std::string secret = path("secret.bin"), other = path("other.h5");
  write_bytes(secret, std::string(32, 'S'));
  {
    ShardWriter w(other);  // a file another dataset could map
    const std::vector<double> v = {5, 6, 7, 8};
    w.write("data", DType::F64, v.data(), {4}, {4}, 0);
    w.close();
  }
  const hsize_t n = 4, chunk = 4;
  struct Case {
    std::string name, mention;
    std::function<void(hid_t)> add;
  };
  const auto with_dcpl = [&](const char* name, const std::function<void(hid_t)>& set) {
    return [=](hid_t file) {
      H5 dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
      set(dcpl.id);
      add_dataset(file, name, dcpl.id);
    };
  };
  const std::vector<Case> cases = {
      {"params/external", "external file",
       with_dcpl("params/external", [&](hid_t p) { ASSERT_GE(H5Pset_external(p, secret.c_str(), 0, 32), 0); })},
      {"params/virtual", "virtual dataset",
       with_dcpl("params/virtual",
                 [&](hid_t p) {
                   H5 space{H5Screate_simple(1, &n, nullptr), H5Sclose};
                   ASSERT_GE(H5Pset_virtual(p, space.id, other.c_str(), "/data", space.id), 0);
                 })},
      {"params/contiguous", "contiguous layout", with_dcpl("params/contiguous", [](hid_t) {})},
      {"params/compact", "compact layout",
       with_dcpl("params/compact", [](hid_t p) { ASSERT_GE(H5Pset_layout(p, H5D_COMPACT), 0); })},
      {"params/no_checksum", "no Fletcher-32 checksum",
       with_dcpl("params/no_checksum", [&](hid_t p) { ASSERT_GE(H5Pset_chunk(p, 1, &chunk), 0); })},
      {"params/scaleoffset", "filter",
       with_dcpl("params/scaleoffset",
                 [&](hid_t p) {
                   ASSERT_GE(H5Pset_chunk(p, 1, &chunk), 0);
                   ASSERT_GE(H5Pset_scaleoffset(p, H5Z_SO_FLOAT_DSCALE, 2), 0);
                   ASSERT_GE(H5Pset_fletcher32(p), 0);
                 })},
      {"params/ext_link", "external link",
       [&](hid_t file) {
         ASSERT_GE(H5Lcreate_external(other.c_str(), "/data", file, "params/ext_link", H5P_DEFAULT, H5P_DEFAULT), 0);
       }},
      {"params/soft_link", "soft link",
       [](hid_t file) {
         ASSERT_GE(H5Lcreate_soft("/params/a", file, "params/soft_link", H5P_DEFAULT, H5P_DEFAULT), 0);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = path("forged.h5");
    fs::remove(file);
    {
      ShardWriter w(file);
      const std::vector<float> v = {1, 2, 3};
      w.write("params/a", DType::F32, v.data(), {3}, {3}, 0);
      w.close();
    }
    add_to_file(file, c.add);
    const std::string message = error_message(ErrorKind::BadInput, [&] { ShardReader r(file); });
    EXPECT_NE(message.find(file), std::string::npos) << message;
    EXPECT_NE(message.find(c.name), std::string::npos) << message;
    EXPECT_NE(message.find(c.mention), std::string::npos) << message;
  }
}

TEST_F(ShardFileTest, H5dumpShowsDatasetsWithAttributes) {
  if (!fs::exists("/usr/bin/h5dump")) GTEST_SKIP() << "no /usr/bin/h5dump";
  const std::vector<float> v = {0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f};
  {
    ShardWriter w(path("d.h5"));
    w.write("params/layers.0.attn.wq", DType::F32, v.data(), {2, 3}, {4, 3}, 6);
    w.set_attribute("format", "moe-shard-1");
    w.close();
  }
  const std::string out = path("dump.txt");
  const std::string command = "/usr/bin/h5dump -p -d /params/layers.0.attn.wq " + path("d.h5") + " > " + out + " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << read_bytes(out);
  const std::string dump = read_bytes(out);
  for (const char* expected : {"layers.0.attn.wq", "H5T_IEEE_F32LE", "( 2, 3 )", "ATTRIBUTE \"global_shape\"",
                               "(0): 4, 3", "ATTRIBUTE \"flat_offset\"", "(0): 6", "FLETCHER32", "5.5"}) {
    EXPECT_NE(dump.find(expected), std::string::npos) << expected << " not in\n" << dump;
  }
  const std::string header = path("header.txt");
  ASSERT_EQ(std::system(("/usr/bin/h5dump -A " + path("d.h5") + " > " + header + " 2>&1").c_str()), 0);
  EXPECT_NE(read_bytes(header).find("moe-shard-1"), std::string::npos) << read_bytes(header);
}

}  // namespace
}  // namespace moe::ckpt
