// Tests of the safetensors reader and writer: round trips, half-precision conversion, and a
// layup::Error naming the file and the tensor for every kind of damaged header.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::snapshot;
using test_files::TempDir;
using test_files::write_text;

// A safetensors file from a header text and raw data bytes, without any checking.
std::string raw_file(const std::string& header, const std::string& data = "") {
  const uint64_t length = header.size();
  std::string file(reinterpret_cast<const char*>(&length), 8);
  return file + header + data;
}

template <class T>
std::string raw_bytes(std::initializer_list<T> values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), std::data(values), bytes.size());
  return bytes;
}

// Opens `contents` as a safetensors file and returns the error message; the directory must be
// unchanged by the attempt.
std::string open_error(const std::string& contents) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_text(path, contents);
  const auto before = snapshot(dir.path());
  const std::string message = error_message([&] { SafetensorsReader reader(path); });
  EXPECT_TRUE(contains(message, path));
  EXPECT_EQ(snapshot(dir.path()), before);
  return message;
}

TEST(Safetensors, F32RoundTripWithMetadataAndFill) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  const std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e-30f};
  const SafetensorsTensor tensors[] = {
      {"alpha", {2, 3}, a.data(), {}},
      {"beta",
       {4},
       nullptr,
       [](std::span<float> out) {
         for (size_t i = 0; i < out.size(); ++i) out[i] = 10.0f + i;
       }},
      {"empty", {0, 5}, a.data(), {}},
  };
  write_safetensors(path, tensors, {{"format", "pt"}, {"note", "hello"}});

  const std::string bytes = read_text(path);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u);  // padded so the data is 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + header_length + (6 + 4) * sizeof(float));  // no gaps, no tail
  EXPECT_EQ(snapshot(dir.path()).size(), 1u);

  SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 3u);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_EQ(reader.metadata().at("note"), "hello");
  const SafetensorsTensorInfo* alpha = reader.find("alpha");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->dtype, "F32");
  EXPECT_EQ(alpha->shape, (std::vector<size_t>{2, 3}));
  const std::vector<float> alpha_back = reader.read_floats("alpha");
  EXPECT_EQ(std::memcmp(alpha_back.data(), a.data(), sizeof(float) * 6), 0);  // -0.0 included
  EXPECT_EQ(reader.read_floats("beta"), (std::vector<float>{10, 11, 12, 13}));
  EXPECT_TRUE(reader.read_floats("empty").empty());
  EXPECT_EQ(reader.find("gamma"), nullptr);
}

TEST(Safetensors, WriterRejectsDuplicateNames) {
  TempDir dir;
  const float x = 1;
  const SafetensorsTensor tensors[] = {{"x", {1}, &x, {}}, {"x", {1}, &x, {}}};
  EXPECT_TRUE(contains(error_message([&] { write_safetensors(dir.file("d"), tensors); }),
                       "'x' appears twice"));
  EXPECT_TRUE(snapshot(dir.path()).empty());
}

TEST(Safetensors, ReadsF16AndBF16AsFloat) {
  TempDir dir;
  const std::string path = dir.file("half.safetensors");
  // F16: 1, -2, 0.5, smallest subnormal 2^-24, largest finite 65504, +inf.
  const std::string f16 = raw_bytes<uint16_t>({0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x7C00});
  // BF16: 1, -3, 0, 2^-133 (a float subnormal).
  const std::string bf16 = raw_bytes<uint16_t>({0x3F80, 0xC040, 0x0000, 0x0001});
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
                             R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[12,20]},)"
                             R"("i":{"dtype":"I64","shape":[1],"data_offsets":[20,28]}})";
  write_text(path, raw_file(header, f16 + bf16 + raw_bytes<int64_t>({7}) + "trailing bytes"));

  SafetensorsReader reader(path);
  const std::vector<float> h = reader.read_floats("h");
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 0.5f, std::ldexp(1.0f, -24), 65504.0f, INFINITY}));
  EXPECT_EQ(reader.read_floats("b"),
            (std::vector<float>{1.0f, -3.0f, 0.0f, std::ldexp(1.0f, -133)}));
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
  EXPECT_EQ(std::signbit(half_to_float(0x8000)), true);
  // An integer tensor may sit in the file, but cannot be read as floats.
  const std::string message = error_message([&] { reader.read_floats("i"); });
  EXPECT_TRUE(contains(message, "'i'"));
  EXPECT_TRUE(contains(message, "I64"));
  EXPECT_TRUE(contains(message, "F32, F16 and BF16"));
  EXPECT_TRUE(contains(error_message([&] { reader.read_floats("nope"); }), "no tensor 'nope'"));
}

TEST(Safetensors, FileTooShort) {
  EXPECT_TRUE(contains(open_error("abc"), "too short to be a safetensors file (3 bytes"));
  EXPECT_TRUE(contains(open_error(""), "(0 bytes"));
}

TEST(Safetensors, AbsurdHeaderLength) {
  std::string file(8, '\0');
  const uint64_t length = uint64_t{1} << 40;
  std::memcpy(file.data(), &length, 8);
  const std::string message = open_error(file + "{}");
  EXPECT_TRUE(contains(message, "declares a JSON header of 1099511627776 bytes"));
  EXPECT_TRUE(contains(message, "not plausible"));
}

TEST(Safetensors, HeaderBeyondEndOfFile) {
  std::string file = raw_file(std::string(100, ' '));
  file.resize(60);  // the header claims 100 bytes, 52 are there
  const std::string message = open_error(file);
  EXPECT_TRUE(contains(message, "header of 100 bytes, but only 52 bytes follow"));
  EXPECT_TRUE(contains(message, "truncated"));
}

TEST(Safetensors, HeaderIsNotJson) {
  EXPECT_TRUE(contains(open_error(raw_file(R"({"a": {"dtype": "F32",)")), "not valid JSON"));
  EXPECT_TRUE(contains(open_error(raw_file("[1, 2]")), "instead of an object"));
}

TEST(Safetensors, MissingFields) {
  const std::string data(8, '\0');
  EXPECT_TRUE(contains(open_error(raw_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data)),
                       "tensor 'w' has no \"dtype\" field"));
  EXPECT_TRUE(contains(open_error(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data)),
                       "tensor 'w' has no \"shape\" field"));
  EXPECT_TRUE(contains(open_error(raw_file(R"({"w":{"dtype":"F32","shape":[2]}})", data)),
                       "tensor 'w' has no \"data_offsets\" field"));
  EXPECT_TRUE(contains(open_error(raw_file(R"({"w":[1,2]})", data)), "tensor 'w' is described"));
}

TEST(Safetensors, UnknownDtype) {
  const std::string message = open_error(
      raw_file(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_TRUE(contains(message, "tensor 'w' has unknown dtype \"F33\""));
}

TEST(Safetensors, BadShapes) {
  const std::string data(8, '\0');
  EXPECT_TRUE(contains(
      open_error(raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data)),
      "not a non-negative integer"));
  EXPECT_TRUE(contains(
      open_error(raw_file(R"({"w":{"dtype":"F32","shape":7,"data_offsets":[0,8]}})", data)),
      "shape that is not a list"));
}

TEST(Safetensors, ShapeDoesNotMatchOffsets) {
  const std::string message = open_error(raw_file(
      R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(24, '\0')));
  EXPECT_TRUE(contains(message, "tensor 'w' has shape [2,3] and dtype F32, which take 24 bytes"));
  EXPECT_TRUE(contains(message, "span 20 bytes"));
}

TEST(Safetensors, OffsetsOutOfRange) {
  const std::string beyond = open_error(raw_file(
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(12, '\0')));
  EXPECT_TRUE(contains(beyond,
                       "tensor 'w' has data_offsets [0,16] beyond the end of the data "
                       "section (12 bytes)"));
  const std::string reversed = open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(12, '\0')));
  EXPECT_TRUE(contains(reversed, "begin is after its end"));
  const std::string not_pair = open_error(
      raw_file(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", std::string(12, '\0')));
  EXPECT_TRUE(contains(not_pair, "instead of two non-negative integers"));
}

TEST(Safetensors, OverlappingTensors) {
  const std::string message =
      open_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          std::string(12, '\0')));
  EXPECT_TRUE(contains(message, "tensors 'a' (bytes 0..8) and 'b' (bytes 4..12) overlap"));
}

TEST(Safetensors, BadMetadata) {
  EXPECT_TRUE(contains(open_error(raw_file(R"({"__metadata__":{"format":3}})")),
                       "metadata entry 'format' is 3 instead of a string"));
  EXPECT_TRUE(
      contains(open_error(raw_file(R"({"__metadata__":[1]})")), "\"__metadata__\" is array"));
}

TEST(Safetensors, MissingFile) {
  TempDir dir;
  const std::string message =
      error_message([&] { SafetensorsReader reader(dir.file("missing.safetensors")); });
  EXPECT_TRUE(contains(message, "missing.safetensors"));
  EXPECT_TRUE(contains(message, "No such file"));
}

}  // namespace
}  // namespace layup
