// Forged checkpoints (docs/checkpoint.md, "What is verified"): consistent-looking, yet not what the run
// needs. One process, in process (run_train), a tiny MoE model; the shared runs and checks are in
// checkpoint_damage_harness.h.
#include <hdf5.h>

#include "checkpoint_damage_harness.h"

namespace moe {
namespace {

// ---- Forged checkpoints: consistent-looking, yet not what the run needs ----------------------------------
// An attacker (or a careless copy) edits a manifest, rewrites a shard and recomputes its checksum, or
// points a file name elsewhere. Each is refused by the one verification: `--resume auto` falls back to
// step 10 and ends bit for bit where the reference ends, `--resume PATH` is BadInput naming the reason.

json read_json(const std::string& path) { return json::parse(read_text(path)); }

// Applies `edit` to the manifest of `dir`, written back as the writer writes it.
void edit_manifest(const std::string& dir, const std::function<void(json&)>& edit) {
  const std::string path = dir + "/manifest.json";
  json m = read_json(path);
  edit(m);
  write_text(path, m.dump(1) + "\n");
}

// Puts the size and xxh64 of the file now at dir/name into the manifest, as a forger would.
void rehash_in_manifest(const std::string& dir, const std::string& name) {
  int64_t size = 0;
  const std::string hash = ckpt::file_xxh64(dir + "/" + name, &size);
  edit_manifest(dir, [&](json& m) {
    for (json& f : m["files"])
      if (f["name"] == name) f["size"] = size, f["xxh64"] = hash;
  });
}

// What a forger changes in one dataset of a shard: its dtype, where it lies in the tensor, and its bytes.
struct Forgery {
  std::string name;
  ckpt::DType dtype;
  ckpt::Slab slab;
  std::vector<uint8_t> bytes;
};

// Rewrites dir/rank-00000.h5 with the real shard writer, dataset `target` changed by `change` and
// `stowaway` added when given, then recomputes its size and xxh64 in the manifest.
void forge_shard(const std::string& dir, const std::string& target, const std::function<void(Forgery&)>& change,
                 const std::optional<Forgery>& stowaway = std::nullopt) {
  const std::string path = dir + "/rank-00000.h5", forged = path + ".forged";
  {
    const ckpt::ShardReader reader(path);
    ckpt::ShardWriter writer(forged);
    writer.set_attribute("step", reader.attribute("step"));
    writer.set_attribute("kind", reader.attribute("kind"));
    bool found = false;
    for (const ckpt::DatasetInfo& info : reader.datasets()) {
      const size_t esize = info.dtype == ckpt::DType::F64 || info.dtype == ckpt::DType::I64 ? 8 : 4;
      Forgery f{info.name, info.dtype, info.slab, std::vector<uint8_t>(size_t(info.numel()) * esize)};
      reader.read(info.name, info.dtype, 0, info.numel(), f.bytes.data());
      if (info.name == target) change(f), found = true;
      writer.write(f.name, f.dtype, f.bytes.data(), f.slab);
    }
    if (stowaway) writer.write(stowaway->name, stowaway->dtype, stowaway->bytes.data(), stowaway->slab);
    writer.close();
    ASSERT_TRUE(found) << "no dataset " << target << " in " << path;
  }
  fs::rename(forged, path);
  rehash_in_manifest(dir, "rank-00000.h5");
}

// params/embed.weight [vocab, d_model] stored as [d_model, vocab]: the same elements, another shape.
void transpose_embedding(Forgery& f) {
  std::vector<int64_t> shape = f.slab.global_shape;
  ASSERT_EQ(shape.size(), 2u);
  std::swap(shape[0], shape[1]);
  f.slab = ckpt::Slab::whole(shape);
}

// params/embed.weight stored as float64 (the same values).
void widen_embedding(Forgery& f) {
  ASSERT_EQ(f.dtype, ckpt::DType::F32);
  std::vector<uint8_t> wide(f.bytes.size() * 2);
  for (size_t i = 0; i < f.bytes.size() / 4; ++i) {
    float x;
    std::memcpy(&x, f.bytes.data() + 4 * i, 4);
    const double y = x;
    std::memcpy(wide.data() + 8 * i, &y, 8);
  }
  f.dtype = ckpt::DType::F64;
  f.bytes = std::move(wide);
}

// The manifest entry of params/embed.weight in dir's manifest, changed by `edit`.
void edit_embedding_entry(const std::string& dir, const std::function<void(json&)>& edit) {
  edit_manifest(dir, [&](json& m) {
    for (json& f : m["files"])
      for (json& d : f["datasets"])
        if (d["tensor"] == "params/embed.weight") edit(d);
  });
}

// The forged step 15 of `run`: verify_checkpoint refuses it (when `verify_refuses`: some forgeries are
// consistent in themselves and only the model's needs refuse them), `--resume PATH` is BadInput naming
// `mention`, and `--resume auto` falls back to step 10 and ends as the reference ends.
void expect_forgery_refused(const std::string& run, const std::string& mention, const std::string& what,
                            bool verify_refuses = true) {
  if (verify_refuses) expect_refused(ckpt_dir(run, 15), mention);
  expect_bad_input(options_for(run, {}, ckpt_dir(run, 15), 0), {"--resume", mention});
  expect_falls_back(run, {{15, mention}}, 10, what);
}

TEST(CheckpointForgery, ManifestStepEditedIsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  edit_manifest(ckpt_dir(run, 15), [](json& m) { m["step"] = 20; });
  expect_forgery_refused(run, "step 20, but the directory is step-00000015", "manifest step edited");
}

TEST(CheckpointForgery, CheckpointMovedToAnotherStepIsRefused) {
  // Renamed to step-17, its manifest's step and chain edited to match, `latest` too: only the shards say 15.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const std::string moved = (fs::path(run) / "checkpoints" / "step-00000017").string();
  fs::rename(ckpt_dir(run, 15), moved);
  edit_manifest(moved, [](json& m) {
    m["step"] = 17;
    m["chain"] = json::array({"step-00000017"});
  });
  write_text(run + "/checkpoints/latest", "step-00000017\n");
  expect_refused(moved, "says step '15'");
  expect_bad_input(options_for(run, {}, moved, 0), {"--resume", "says step '15'"});
  const RunOutput r = train(run);
  EXPECT_TRUE(has_line(r.out, {"checkpoint: skipped " + moved + ": ", "says step '15'"})) << r.out;
  EXPECT_TRUE(has_line(r.out, {resumed_line(ckpt_dir(run, 10), 10)})) << r.out;
  expect_equals_reference(r, "checkpoint moved to another step");
}

TEST(CheckpointForgery, ShardWithAnotherShapeIsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", transpose_embedding);
  expect_forgery_refused(run, "dataset params/embed.weight: the file holds f32", "shard of another shape");
}

TEST(CheckpointForgery, ShardAndManifestWithAnotherShapeAreRefused) {
  // Consistent in itself (the manifest says what the file holds): only the model's needs refuse it.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", transpose_embedding);
  edit_embedding_entry(ckpt_dir(run, 15), [](json& d) { d["global_shape"] = d["shape"] = {32, 256}; });
  expect_forgery_refused(run, "params/embed.weight is f32 [32,256], this run needs f32 [256,32]",
                         "shard and manifest of another shape", false);
}

TEST(CheckpointForgery, ShardOfFloat64IsRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", widen_embedding);
  expect_forgery_refused(run, "the file holds f64", "shard of float64");
}

TEST(CheckpointForgery, ShardAndManifestOfFloat64AreRefused) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "params/embed.weight", widen_embedding);
  edit_embedding_entry(ckpt_dir(run, 15), [](json& d) { d["dtype"] = "f64"; });
  expect_forgery_refused(run, "params/embed.weight is f64 [256,32], this run needs f32 [256,32]",
                         "shard and manifest of float64", false);
}

TEST(CheckpointForgery, RenamedTensorIsRefused) {
  // optim/step renamed in the file and in the manifest alike: consistent, but the model needs optim/step.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  forge_shard(ckpt_dir(run, 15), "optim/step", [](Forgery& f) { f.name = "optim/steps_taken"; });
  expect_refused(ckpt_dir(run, 15), "has no dataset optim/step");  // the manifest still lists it
  edit_manifest(ckpt_dir(run, 15), [](json& m) {
    for (json& f : m["files"])
      for (json& d : f["datasets"])
        if (d["tensor"] == "optim/step") d["tensor"] = d["dataset"] = "optim/steps_taken";
  });
  expect_forgery_refused(run, "holds no tensor optim/step, which this run needs", "renamed tensor", false);
}

TEST(CheckpointForgery, ForeignTensorIsRefused) {
  // One tensor more than the model has, in the file and the manifest alike.
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const Forgery stowaway{"params/stowaway", ckpt::DType::F32, ckpt::Slab::whole({4}), std::vector<uint8_t>(16, 0)};
  forge_shard(
      ckpt_dir(run, 15), "optim/step", [](Forgery&) {}, stowaway);
  edit_manifest(ckpt_dir(run, 15), [](json& m) {
    m["files"][0]["datasets"].push_back({{"dataset", "params/stowaway"},
                                         {"tensor", "params/stowaway"},
                                         {"dtype", "f32"},
                                         {"global_shape", {4}},
                                         {"start", {0}},
                                         {"shape", {4}},
                                         {"range", {0, 4}},
                                         {"xor_delta", false}});
  });
  std::string why;
  EXPECT_TRUE(ckpt::verify_checkpoint(ckpt_dir(run, 15), {}, &why).has_value()) << "consistent in itself: " << why;
  expect_forgery_refused(run, "holds tensor params/stowaway, which this run's model does not have", "foreign tensor",
                         false);
}

TEST(CheckpointForgery, FileNamesOutsideTheCheckpointAreRefused) {
  // The named files hold the very bytes the manifest lists: only the names are wrong.
  for (const bool absolute : {false, true}) {
    SCOPED_TRACE(absolute ? "absolute" : "../../etc/passwd");
    TempDir tmp("ckpt_forgery");
    const std::string run = tmp / "run";
    copy_base("sync", run);
    const std::string outside = absolute ? tmp / "elsewhere.h5" : run + "/etc/passwd";
    fs::create_directories(fs::path(outside).parent_path());
    fs::copy_file(shard(run, 15), outside);
    const std::string name = absolute ? outside : "../../etc/passwd";
    edit_manifest(ckpt_dir(run, 15), [&](json& m) { m["files"][0]["name"] = name; });
    expect_forgery_refused(run, "file name '" + name + "' points outside the checkpoint directory",
                           "file name outside the checkpoint");
  }
}

// ---- Bytes kept outside the checkpoint ----------------------------------------------------------------------
// The dataset's bytes moved to a file outside the checkpoint, the same values, the shard's checksum recomputed:
// the values are right, so only the storage says what it is. HDF5 would read the outside file on every read.

struct H5Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

herr_t copy_attribute(hid_t from, const char* name, const H5A_info_t*, void* to) {
  H5Handle a{H5Aopen(from, name, H5P_DEFAULT), H5Aclose};
  H5Handle type{H5Aget_type(a.id), H5Tclose}, space{H5Aget_space(a.id), H5Sclose};
  std::vector<uint8_t> bytes(H5Aget_storage_size(a.id));
  H5Aread(a.id, type.id, bytes.data());
  H5Handle b{H5Acreate2(*static_cast<hid_t*>(to), name, type.id, space.id, H5P_DEFAULT, H5P_DEFAULT), H5Aclose};
  return H5Awrite(b.id, type.id, bytes.data());
}

// Replaces dataset `name` of `shard` by one whose elements live in `outside`: raw external storage
// (`virtual_dataset` false) or a virtual dataset mapping an HDF5 file (true); its attributes are kept.
void move_outside(const std::string& shard, const std::string& name, const std::string& outside, bool virtual_dataset) {
  H5Handle file{H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose};
  ASSERT_GE(file.id, 0);
  H5Handle old{H5Dopen2(file.id, name.c_str(), H5P_DEFAULT), H5Dclose};
  H5Handle type{H5Dget_type(old.id), H5Tclose}, space{H5Dget_space(old.id), H5Sclose};
  const hssize_t n = H5Sget_simple_extent_npoints(space.id);
  std::vector<uint8_t> bytes(size_t(n) * H5Tget_size(type.id));
  ASSERT_GE(H5Dread(old.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
  H5Handle dcpl{H5Pcreate(H5P_DATASET_CREATE), H5Pclose};
  if (virtual_dataset) {
    {
      H5Handle source{H5Fcreate(outside.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose};
      H5Handle d{H5Dcreate2(source.id, "data", type.id, space.id, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose};
      ASSERT_GE(H5Dwrite(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
    }
    ASSERT_GE(H5Pset_virtual(dcpl.id, space.id, outside.c_str(), "/data", space.id), 0);
  } else {
    write_text(outside, std::string(bytes.begin(), bytes.end()));
    ASSERT_GE(H5Pset_external(dcpl.id, outside.c_str(), 0, hsize_t(bytes.size())), 0);
  }
  const std::string moved = name + "_moved";
  {
    H5Handle d{H5Dcreate2(file.id, moved.c_str(), type.id, space.id, H5P_DEFAULT, dcpl.id, H5P_DEFAULT), H5Dclose};
    ASSERT_GE(d.id, 0);
    if (!virtual_dataset) {
      ASSERT_GE(H5Dwrite(d.id, type.id, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()), 0);
    }
    hid_t target = d.id;
    ASSERT_GE(H5Aiterate2(old.id, H5_INDEX_NAME, H5_ITER_INC, nullptr, copy_attribute, &target), 0);
  }
  ASSERT_GE(H5Ldelete(file.id, name.c_str(), H5P_DEFAULT), 0);
  ASSERT_GE(H5Lmove(file.id, moved.c_str(), file.id, name.c_str(), H5P_DEFAULT, H5P_DEFAULT), 0);
}

TEST(CheckpointForgery, BytesKeptOutsideTheCheckpointAreRefused) {
  for (const bool virtual_dataset : {false, true}) {
    SCOPED_TRACE(virtual_dataset ? "virtual dataset" : "external raw storage");
    TempDir tmp("ckpt_forgery");
    const std::string run = tmp / "run", outside = tmp / "outside.bin";
    copy_base("sync", run);
    move_outside(shard(run, 15), "params/embed.weight", outside, virtual_dataset);
    rehash_in_manifest(ckpt_dir(run, 15), "rank-00000.h5");
    const std::string mention = virtual_dataset ? "is a virtual dataset" : "external file";
    expect_forgery_refused(run, mention, virtual_dataset ? "virtual dataset" : "external storage");
  }
}

// Runs `f` on a thread; fails unless it ends within `seconds`. `unblock` is called if it does not.
template <typename F>
void within(double seconds, const std::string& what, F&& f, const std::function<void()>& unblock) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread worker([&] {
    f();
    done.set_value();
  });
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not end within " << seconds << " s";
    unblock();
  }
  worker.join();
}

TEST(CheckpointForgery, SymlinkToAHugeSparseFileIsRefusedWithoutReadingIt) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run", big = tmp / "big";
  copy_base("sync", run);
  write_text(big, "");
  fs::resize_file(big, uint64_t{20} << 30);  // 20 GiB, sparse
  fs::remove(shard(run, 15));
  fs::create_symlink(big, shard(run, 15));
  within(
      3.0, "verify_checkpoint of a symlink to 20 GiB", [&] { expect_refused(ckpt_dir(run, 15), "symbolic link"); },
      [] {});
  expect_forgery_refused(run, "a symbolic link, not a regular file", "symlink to a sparse file");

  // The same file in place of the shard: its size is compared before a byte is hashed.
  TempDir tmp2("ckpt_forgery");
  const std::string run2 = tmp2 / "run";
  copy_base("sync", run2);
  fs::resize_file(shard(run2, 15), uint64_t{20} << 30);
  within(
      3.0, "verify_checkpoint of a 20 GiB sparse shard", [&] { expect_refused(ckpt_dir(run2, 15), "size"); }, [] {});
}

TEST(CheckpointForgery, FifoInPlaceOfAShardOrManifestDoesNotHang) {
  for (const char* victim : {"rank-00000.h5", "manifest.json"}) {
    SCOPED_TRACE(victim);
    TempDir tmp("ckpt_forgery");
    const std::string run = tmp / "run";
    copy_base("sync", run);
    const std::string fifo = ckpt_dir(run, 15) + "/" + victim;
    fs::remove(fifo);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    // If a reader blocks in open(), a writer that opens and closes the FIFO lets it go on.
    const auto unblock = [&] { ::close(::open(fifo.c_str(), O_WRONLY | O_NONBLOCK)); };
    const std::string mention = std::string(victim) == "manifest.json" ? "not a regular file" : "a FIFO";
    within(
        5.0, "verify_checkpoint of a FIFO", [&] { expect_refused(ckpt_dir(run, 15), mention); }, unblock);
    within(
        30.0, "a resume past a FIFO", [&] { expect_forgery_refused(run, mention, "FIFO"); }, unblock);
  }
}

// ---- --resume none in a directory that holds checkpoints --------------------------------------------------

TEST(CheckpointForgery, ResumeNoneSaysWhatIsThereAndWhatToDo) {
  TempDir tmp("ckpt_forgery");
  const std::string run = tmp / "run";
  copy_base("sync", run);
  const auto before = snapshot(run);
  expect_bad_input(options_for(run, {}, "none", 0),
                   {"3 checkpoint(s)", "step-00000015", "--resume auto", "--overwrite", "delete them"});
  expect_unchanged(before, run);
}

// ---- Retention and `latest` --------------------------------------------------------------------------------

TEST(CheckpointDamage, RetentionKeepsTheNewestTwoCompleteChains) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    TempDir tmp("ckpt_damage");
    const std::string run = tmp / "run", replica = tmp / "replica";
    std::vector<std::string> extra = {"checkpoint.every=2", "checkpoint.keep=2", "checkpoint.full_every=2",
                                      std::string("checkpoint.async=") + (async ? "true" : "false")};
    if (async) extra.push_back("checkpoint.replicas=[\"" + replica + "\"]");
    const RunOutput r = train(run, extra);
    expect_equals_reference(r, "retention");
    // Saves at 2, 4, ..., 20 in chains [2, 4], [6, 8], ..., [18, 20]: the newest two chains stay.
    std::vector<std::string> roots = {run + "/checkpoints"};
    if (async) roots.push_back(replica);
    for (const std::string& root : roots) {
      std::vector<std::string> names;
      for (const std::string& dir : ckpt::list_checkpoints(root)) names.push_back(fs::path(dir).filename().string());
      EXPECT_EQ(names, (std::vector<std::string>{"step-00000020", "step-00000018", "step-00000016", "step-00000014"}))
          << root;
      for (const auto& entry : fs::directory_iterator(root))
        EXPECT_NE(entry.path().filename().string().rfind("tmp-", 0), 0u) << "left behind: " << entry.path();
    }
    const std::string root = roots.front();
    for (const std::string& dir : ckpt::list_checkpoints(root)) {
      std::string why;
      const auto resolved = ckpt::verify_checkpoint(dir, {}, &why);
      ASSERT_TRUE(resolved.has_value()) << dir << ": " << why;
      const int64_t step = resolved->chain.back().step;
      EXPECT_EQ(resolved->chain.size(), step % 4 == 0 ? 2u : 1u) << dir;
      EXPECT_EQ(resolved->chain.back().kind, step % 4 == 0 ? "delta" : "full") << dir;
    }
    std::vector<std::string> notes;
    const auto newest = ckpt::find_newest(root, {}, &notes);
    ASSERT_TRUE(newest.has_value());
    EXPECT_EQ(fs::path(newest->dir).filename().string(), "step-00000020");
    EXPECT_EQ(newest->chain_dirs, (std::vector<std::string>{root + "/step-00000018", root + "/step-00000020"}));
    EXPECT_TRUE(notes.empty());
    EXPECT_EQ(read_text(root + "/latest"), "step-00000020\n");
  }
}

TEST(CheckpointDamage, LatestNamesTheNewestCommittedCheckpoint) {
  for (const char* base : {"sync", "async"}) {
    SCOPED_TRACE(base);
    TempDir tmp("ckpt_damage");
    const std::string run = tmp / "run";
    copy_base(base, run);  // stopped after step 15
    const std::string root = run + "/checkpoints";
    EXPECT_EQ(read_text(root + "/latest"), "step-00000015\n");
    EXPECT_EQ(ckpt::list_checkpoints(root).front(), ckpt_dir(run, 15));
    EXPECT_FALSE(fs::exists(root + "/latest.tmp"));
    std::string why;
    EXPECT_TRUE(ckpt::verify_checkpoint(ckpt_dir(run, 15), {}, &why).has_value()) << why;
    // Resumed to the end, `latest` moves to step 20.
    const RunOutput r = train(run, bases().at(base).extra);
    EXPECT_TRUE(has_line(r.out, {resumed_line(ckpt_dir(run, 15), 15)})) << r.out;
    expect_equals_reference(r, base);
    EXPECT_EQ(read_text(root + "/latest"), "step-00000020\n");
  }
}

}  // namespace
}  // namespace moe
