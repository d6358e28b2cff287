// Tests of sharded safetensors: the shard plan, a round trip through several shards with the
// source asked for chunk-sized ranges only, the index, an error naming the file for every way an
// index and its shards can disagree, and writes that fail (a throwing source, a full disk) without
// leaving a file behind.
#include "io/sharded_safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

// Element `i` of tensor `t`: distinct everywhere, exact in float.
float value_of(size_t t, size_t i) {
  return static_cast<float>(t * 1000 + i) + 0.5f;
}

// Six tensors of 16, 16, 40, 8, 8 and 8 bytes (plus an empty one); with 32-byte shards the third
// is larger than the limit.
std::vector<SafetensorsTensorShape> test_tensors() {
  return {{"a", {2, 2}}, {"b", {4}},    {"big", {2, 5}}, {"c", {2}},
          {"d", {1, 2}}, {"e", {0, 3}}, {"f", {2}}};
}

size_t elements_of(const SafetensorsTensorShape& tensor) {
  size_t count = 1;
  for (size_t dim : tensor.shape) count *= dim;
  return count;
}

// A source that serves value_of and records what it was asked for.
struct RecordingSource {
  std::vector<std::pair<size_t, size_t>> asked;  // (tensor, first)
  size_t largest_request = 0;

  TensorRangeSource source() {
    return [this](size_t tensor, size_t first, std::span<float> out) {
      asked.emplace_back(tensor, first);
      largest_request = std::max(largest_request, out.size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = value_of(tensor, first + i);
    };
  }
};

ShardedWriteOptions small_shards(size_t chunk_bytes = 12) {
  ShardedWriteOptions options;
  options.max_shard_bytes = 32;
  options.chunk_bytes = chunk_bytes;  // 3 floats
  options.shard_metadata = {{"format", "pt"}};
  return options;
}

TEST(ShardedSafetensors, NamesHaveFiveDigitNumbers) {
  EXPECT_EQ(shard_file_name("model", 2, 3), "model-00002-of-00003.safetensors");
  EXPECT_EQ(shard_index_file_name("model"), "model.safetensors.index.json");
  EXPECT_EQ(shard_file_name("optimizer", 12, 123456), "optimizer-00012-of-123456.safetensors");
}

TEST(ShardedSafetensors, PlanKeepsOrderAndGivesAnOversizedTensorItsOwnShard) {
  const std::vector<SafetensorsShard> plan = plan_shards(test_tensors(), 32, "w");
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].file_name, "w-00001-of-00003.safetensors");
  EXPECT_EQ(plan[0].first_tensor, 0u);  // a, b: 32 bytes, exactly the limit
  EXPECT_EQ(plan[0].tensor_count, 2u);
  EXPECT_EQ(plan[0].data_bytes, 32u);
  EXPECT_EQ(plan[1].first_tensor, 2u);  // big alone: 40 bytes
  EXPECT_EQ(plan[1].tensor_count, 1u);
  EXPECT_EQ(plan[1].data_bytes, 40u);
  EXPECT_EQ(plan[2].first_tensor, 3u);  // c, d, e, f: 24 bytes
  EXPECT_EQ(plan[2].tensor_count, 4u);
  EXPECT_EQ(plan[2].file_name, "w-00003-of-00003.safetensors");

  EXPECT_EQ(plan_shards(test_tensors(), 1 << 20, "w").size(), 1u);
  EXPECT_EQ(plan_shards(test_tensors(), 1, "w").size(), 6u);  // the empty tensor shares
  EXPECT_TRUE(contains(error_message([] { plan_shards(test_tensors(), 0, "w"); }), "at least 1"));
}

TEST(ShardedSafetensors, RoundTripThroughSeveralShardsAskingForChunksOnly) {
  TempDir dir;
  const std::vector<SafetensorsTensorShape> tensors = test_tensors();
  RecordingSource recording;
  ShardedWriteOptions options = small_shards();
  options.index_metadata["note"] = "hello";
  const std::vector<SafetensorsShard> plan =
      write_sharded_safetensors(dir.path(), "w", tensors, recording.source(), options);
  ASSERT_EQ(plan.size(), 3u);

  // The source saw each element once, in file order, in pieces of at most the chunk.
  EXPECT_EQ(recording.largest_request, 3u);
  std::vector<std::pair<size_t, size_t>> expected_requests;
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t first = 0; first < elements_of(tensors[t]); first += 3) {
      expected_requests.emplace_back(t, first);
    }
  }
  EXPECT_EQ(recording.asked, expected_requests);

  // Three shards and the index, no temporaries.
  const auto files = snapshot(dir.path());
  EXPECT_EQ(files.size(), 4u);
  const nlohmann::json index =
      nlohmann::json::parse(read_text(dir.file("w.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 32 + 40 + 24);
  EXPECT_EQ(index["metadata"]["note"], "hello");
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  EXPECT_EQ(index["weight_map"]["a"], "w-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "w-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "w-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["f"], "w-00003-of-00003.safetensors");

  // Each shard is an ordinary safetensors file.
  SafetensorsReader second(dir.file("w-00002-of-00003.safetensors"));
  ASSERT_EQ(second.tensors().size(), 1u);
  EXPECT_EQ(second.metadata().at("format"), "pt");
  EXPECT_EQ(second.tensors()[0].shape, (std::vector<size_t>{2, 5}));

  const SafetensorsFileSet set =
      SafetensorsFileSet::open_index(dir.file("w.safetensors.index.json"));
  EXPECT_EQ(set.files().size(), 3u);
  EXPECT_EQ(set.index_metadata()["note"], "hello");
  ASSERT_EQ(set.tensors().size(), tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const SafetensorsFileSet::Located located = set.find(tensors[t].name);
    ASSERT_NE(located.tensor, nullptr) << tensors[t].name;
    EXPECT_EQ(located.file->path(), dir.file(plan[t < 2 ? 0 : t < 3 ? 1 : 2].file_name));
    EXPECT_EQ(located.tensor->shape, tensors[t].shape);
    std::vector<float> values(located.tensor->element_count);
    located.file->read_floats(*located.tensor, 0, values);
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], value_of(t, i));
  }
  EXPECT_EQ(set.find("absent").tensor, nullptr);
}

TEST(ShardedSafetensors, StreamedSingleFileEqualsTheWholeTensorWriter) {
  TempDir dir;
  const std::vector<SafetensorsTensorShape> tensors = test_tensors();
  RecordingSource recording;
  write_streamed_safetensors(dir.file("streamed.safetensors"), tensors, recording.source(),
                             {{"format", "pt"}}, 8);
  EXPECT_EQ(recording.largest_request, 2u);

  std::vector<std::vector<float>> values;
  std::vector<SafetensorsTensor> whole;
  for (size_t t = 0; t < tensors.size(); ++t) {
    values.emplace_back(elements_of(tensors[t]));
    for (size_t i = 0; i < values[t].size(); ++i) values[t][i] = value_of(t, i);
  }
  const float nothing = 0.0f;  // the empty tensor's data: a pointer, never read
  for (size_t t = 0; t < tensors.size(); ++t) {
    whole.push_back(
        {tensors[t].name, tensors[t].shape, values[t].empty() ? &nothing : values[t].data(), {}});
  }
  write_safetensors(dir.file("whole.safetensors"), whole, {{"format", "pt"}});
  EXPECT_EQ(read_text(dir.file("streamed.safetensors")), read_text(dir.file("whole.safetensors")));
}

TEST(ShardedSafetensors, RangedReadsOfOneTensor) {
  TempDir dir;
  RecordingSource recording;
  write_streamed_safetensors(dir.file("t.safetensors"), test_tensors(), recording.source());
  const SafetensorsReader reader(dir.file("t.safetensors"));
  const SafetensorsTensorInfo& big = *reader.find("big");
  std::vector<float> middle(4);
  reader.read_floats(big, 3, middle);
  EXPECT_EQ(middle,
            (std::vector<float>{value_of(2, 3), value_of(2, 4), value_of(2, 5), value_of(2, 6)}));
  const std::string message = error_message([&] { reader.read_floats(big, 8, middle); });
  EXPECT_TRUE(contains(message, "cannot read elements 8..12 of tensor 'big'"));
  EXPECT_TRUE(contains(message, "it has 10 elements"));
}

class ShardedIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    RecordingSource recording;
    write_sharded_safetensors(dir_.path(), "w", test_tensors(), recording.source(), small_shards());
  }

  // Opens the index, expects a layup::Error, and checks that opening changed no file.
  std::string open_error() {
    const auto before = snapshot(dir_.path());
    const std::string message = error_message([&] { SafetensorsFileSet::open_index(index_path_); });
    EXPECT_EQ(snapshot(dir_.path()), before);
    return message;
  }

  void edit_index(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json index = nlohmann::json::parse(read_text(index_path_));
    edit(index);
    write_text(index_path_, index.dump(2));
  }

  TempDir dir_;
  std::string index_path_ = dir_.file("w.safetensors.index.json");
};

TEST_F(ShardedIndex, MissingShardIsNamed) {
  std::filesystem::remove(dir_.file("w-00002-of-00003.safetensors"));
  const std::string message = open_error();
  EXPECT_TRUE(contains(message, index_path_ + " maps 1 tensors to w-00002-of-00003.safetensors"));
  EXPECT_TRUE(contains(message, dir_.file("w-00002-of-00003.safetensors") + " does not exist"));
  EXPECT_TRUE(contains(message, "the checkpoint is incomplete"));
}

TEST_F(ShardedIndex, IndexNamingAnAbsentFileIsNamed) {
  edit_index(
      [](nlohmann::json& index) { index["weight_map"]["c"] = "w-00009-of-00009.safetensors"; });
  const std::string message = open_error();
  EXPECT_TRUE(contains(message, "maps 1 tensors to w-00009-of-00009.safetensors"));
  EXPECT_TRUE(contains(message, dir_.file("w-00009-of-00009.safetensors") + " does not exist"));
}

TEST_F(ShardedIndex, TensorListedTwiceInTheIndexIsAnError) {
  // JSON parsers keep one of two equal keys; the index text must be checked as written.
  std::string text = read_text(index_path_);
  const std::string entry = "\"weight_map\": {";
  text.insert(text.find(entry) + entry.size(), "\"big\": \"w-00001-of-00003.safetensors\", ");
  write_text(index_path_, text);
  const std::string message = open_error();
  EXPECT_TRUE(contains(message, index_path_ + " lists tensor 'big' twice in its weight_map"));
}

TEST_F(ShardedIndex, TensorStoredInTwoShardsIsAnError) {
  // Shard 3 rewritten with a copy of "a" besides its own tensors.
  RecordingSource recording;
  std::vector<SafetensorsTensorShape> third = {
      {"c", {2}}, {"d", {1, 2}}, {"e", {0, 3}}, {"f", {2}}, {"a", {2, 2}}};
  write_streamed_safetensors(dir_.file("w-00003-of-00003.safetensors"), third, recording.source());
  const std::string message = open_error();
  EXPECT_TRUE(contains(message, "tensor 'a' is stored twice: in " +
                                    dir_.file("w-00001-of-00003.safetensors") + " and in " +
                                    dir_.file("w-00003-of-00003.safetensors")));
}

TEST_F(ShardedIndex, IndexAndShardsThatDisagreeAreNamed) {
  edit_index(
      [](nlohmann::json& index) { index["weight_map"]["c"] = "w-00001-of-00003.safetensors"; });
  EXPECT_TRUE(contains(open_error(),
                       "lists tensor 'c' in w-00001-of-00003.safetensors, but it is "
                       "in " +
                           dir_.file("w-00003-of-00003.safetensors")));

  edit_index([](nlohmann::json& index) {
    index["weight_map"]["c"] = "w-00003-of-00003.safetensors";
    index["weight_map"]["ghost"] = "w-00003-of-00003.safetensors";
  });
  EXPECT_TRUE(contains(open_error(), "lists tensor 'ghost' in w-00003-of-00003.safetensors, but " +
                                         dir_.file("w-00003-of-00003.safetensors") +
                                         " has no such tensor"));

  edit_index([](nlohmann::json& index) {
    index["weight_map"].erase("ghost");
    index["weight_map"].erase("d");
  });
  EXPECT_TRUE(contains(open_error(), dir_.file("w-00003-of-00003.safetensors") +
                                         " holds tensor 'd', which " + index_path_ +
                                         " does not list"));
}

TEST_F(ShardedIndex, MalformedIndexes) {
  const std::string original = read_text(index_path_);
  struct Case {
    std::string text;
    std::string expected;
  };
  const Case cases[] = {
      {"{\"weight_map\": ", "is not valid JSON"},
      {"[]", "has no \"weight_map\" object"},
      {"{\"weight_map\": {}}", "lists no tensors"},
      {"{\"metadata\": 3, \"weight_map\": {\"a\": \"x\"}}", "\"metadata\" is number"},
      {"{\"weight_map\": {\"a\": \"../w-00001-of-00003.safetensors\"}}",
       "tensor 'a' is mapped to \"../w-00001-of-00003.safetensors\", which is not the name of a "
       "file beside the index"},
      {"{\"weight_map\": {\"a\": 7}}", "tensor 'a' is mapped to 7"},
  };
  for (const Case& c : cases) {
    write_text(index_path_, c.text);
    const std::string message = open_error();
    EXPECT_TRUE(contains(message, index_path_));
    EXPECT_TRUE(contains(message, c.expected));
  }
  write_text(index_path_, original);
  EXPECT_NO_THROW(SafetensorsFileSet::open_index(index_path_));
}

TEST_F(ShardedIndex, FailingSourceLeavesNoNewFileAndTheOldOnesIntact) {
  const auto before = snapshot(dir_.path());
  size_t calls = 0;
  const TensorRangeSource failing = [&](size_t tensor, size_t, std::span<float> out) {
    // The first shard is complete on disk (as a temporary) before the second fails.
    if (tensor == 2 && ++calls == 2) throw Error("the device copy failed");
    std::fill(out.begin(), out.end(), -1.0f);
  };
  const std::string message = error_message([&] {
    write_sharded_safetensors(dir_.path(), "w", test_tensors(), failing, small_shards());
  });
  EXPECT_EQ(message, "the device copy failed");
  EXPECT_EQ(snapshot(dir_.path()), before);

  // A new directory is left empty.
  TempDir fresh;
  calls = 0;
  EXPECT_THROW(
      write_sharded_safetensors(fresh.path(), "w", test_tensors(), failing, small_shards()), Error);
  EXPECT_TRUE(snapshot(fresh.path()).empty());
}

// A full disk, for real: the kernel fails the write past RLIMIT_FSIZE with EFBIG after a short
// write, as it fails one with ENOSPC when the disk fills. The limit is lifted before any check.
TEST_F(ShardedIndex, FullDiskNamesTheFileTheBytesAndTheErrorAndLeavesNoFile) {
  const auto before = snapshot(dir_.path());
  std::vector<SafetensorsTensorShape> large = {{"x", {4096}}, {"y", {4096}}, {"z", {4096}}};
  ShardedWriteOptions options = small_shards(1 << 20);
  options.max_shard_bytes = 3 * 4096 * 4;  // one shard of 48 KiB
  RecordingSource recording;

  rlimit original{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &original), 0);
  rlimit small = original;
  small.rlim_cur = 20000;
  const auto previous_handler = ::signal(SIGXFSZ, SIG_IGN);  // fail the write, not the process
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_sharded_safetensors(dir_.path(), "w", large, recording.source(), options);
  } catch (const Error& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &original);
  ::signal(SIGXFSZ, previous_handler);

  const std::string shard = dir_.file("w-00001-of-00001.safetensors");
  EXPECT_TRUE(contains(message, "cannot write " + shard + ".tmp-"));
  EXPECT_TRUE(contains(message, std::strerror(EFBIG)));
  EXPECT_TRUE(contains(message, "after 20000 bytes"));
  EXPECT_TRUE(contains(message, "ulimit -f unlimited"));  // EFBIG: the limit, not the disk
  EXPECT_TRUE(contains(message, shard + " was left unchanged"));
  EXPECT_EQ(snapshot(dir_.path()), before);
}

TEST_F(ShardedIndex, RemoveStaleShardsRemovesOnlyShardsOfThatName) {
  write_text(dir_.file("w-00001-of-00002.safetensors"), "old");
  write_text(dir_.file("w-1-of-2.safetensors"), "not a shard name");
  write_text(dir_.file("other-00001-of-00002.safetensors"), "another base");
  remove_stale_shards(dir_.path(), "w",
                      {"w-00001-of-00003.safetensors", "w-00003-of-00003.safetensors"});
  std::vector<std::string> left;
  for (const auto& [name, contents] : snapshot(dir_.path())) left.push_back(name);
  EXPECT_EQ(left, (std::vector<std::string>{"other-00001-of-00002.safetensors",
                                            "w-00001-of-00003.safetensors",
                                            "w-00003-of-00003.safetensors", "w-1-of-2.safetensors",
                                            "w.safetensors.index.json"}));
}

}  // namespace
}  // namespace layup
