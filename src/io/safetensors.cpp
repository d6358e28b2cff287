// The safetensors reader (validate the header, then read tensors on demand) and writer.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; layup reads and writes it without byte swaps");

namespace {

// The reference implementation refuses headers above 100 MB; a GPT-2 header is a few kB.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// Bytes per element of every dtype the format defines. Tensors of any of them may sit in a file
// (e.g. integer buffers next to the weights); only the float ones can be read into a model.
size_t dtype_size(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
  };
  auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

// Reads a non-negative JSON integer, or returns false.
bool read_size(const nlohmann::json& value, size_t& out) {
  if (value.is_number_unsigned()) {
    out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    out = static_cast<size_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

SafetensorsTensorInfo parse_tensor_entry(const std::string& path, const std::string& name,
                                         const nlohmann::json& entry, size_t data_size) {
  const std::string where = path + ": tensor '" + name + "'";
  LAYUP_CHECK(entry.is_object(), where, " is described by ", entry.type_name(),
              " instead of an object with dtype, shape and data_offsets; the file is damaged");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    LAYUP_CHECK(entry.contains(field), where, " has no \"", field,
                "\" field in the header; the file is damaged or was not written as safetensors");
  }

  SafetensorsTensorInfo info;
  info.name = name;
  const nlohmann::json& dtype = entry["dtype"];
  LAYUP_CHECK(dtype.is_string(), where, " has a dtype that is not a string: ", dtype.dump());
  info.dtype = dtype.get<std::string>();
  const size_t element_bytes = dtype_size(info.dtype);
  LAYUP_CHECK(element_bytes != 0, where, " has unknown dtype \"", info.dtype,
              "\"; safetensors defines BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, "
              "U32, F32, F64, I64, U64");

  const nlohmann::json& shape = entry["shape"];
  LAYUP_CHECK(shape.is_array(), where, " has a shape that is not a list: ", shape.dump());
  info.element_count = 1;
  for (const nlohmann::json& dim_value : shape) {
    size_t dim = 0;
    LAYUP_CHECK(read_size(dim_value, dim), where, " has shape ", shape.dump(),
                " with an entry that is not a non-negative integer");
    info.shape.push_back(dim);
    LAYUP_CHECK(dim == 0 || info.element_count <= std::numeric_limits<size_t>::max() / dim, where,
                " has shape ", shape.dump(), " whose element count overflows");
    info.element_count *= dim;
  }
  LAYUP_CHECK(info.element_count <= std::numeric_limits<size_t>::max() / element_bytes, where,
              " has shape ", shape.dump(), " whose byte size overflows");

  const nlohmann::json& offsets = entry["data_offsets"];
  LAYUP_CHECK(offsets.is_array() && offsets.size() == 2 && read_size(offsets[0], info.data_begin) &&
                  read_size(offsets[1], info.data_end),
              where, " has data_offsets ", offsets.dump(),
              " instead of two non-negative integers [begin, end]");
  LAYUP_CHECK(info.data_begin <= info.data_end, where, " has data_offsets ", offsets.dump(),
              " whose begin is after its end");
  LAYUP_CHECK(info.data_end <= data_size, where, " has data_offsets ", offsets.dump(),
              " beyond the end of the data section (", data_size,
              " bytes); the file is truncated or damaged");
  const size_t expected_bytes = info.element_count * element_bytes;
  LAYUP_CHECK(info.data_end - info.data_begin == expected_bytes, where, " has shape ", shape.dump(),
              " and dtype ", info.dtype, ", which take ", expected_bytes,
              " bytes, but its data_offsets ", offsets.dump(), " span ",
              info.data_end - info.data_begin, " bytes; the file is damaged");
  return info;
}

}  // namespace

float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  // Rebias the exponent from 15 (half) to 127 (float).
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

float bfloat16_to_float(uint16_t bits) {
  // bfloat16 is the upper half of a float.
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  // A NaN's payload may sit in the low half only: keep it a (quiet) NaN.
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x0040);
  // Adding 0x7fff plus the kept half's lowest bit rounds to nearest, ties to the even half; a
  // carry into the exponent is the correct rounding up (to infinity past the largest value).
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

size_t dtype_bytes(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kBF16:
      return sizeof(uint16_t);
    case SafetensorsDtype::kU8:
      return sizeof(uint8_t);
    case SafetensorsDtype::kF32:
      break;
  }
  return sizeof(float);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  try {
    struct stat file_info;
    LAYUP_CHECK(::fstat(fd_, &file_info) == 0 && S_ISREG(file_info.st_mode), "cannot read ", path,
                ": it is not a regular file");
    const uint64_t file_size = static_cast<uint64_t>(file_info.st_size);
    LAYUP_CHECK(file_size >= 8, path, " is too short to be a safetensors file (", file_size,
                " bytes; the header length alone takes 8); the file is truncated or is not a "
                "safetensors file");

    uint64_t header_bytes = 0;
    read_bytes(0, std::as_writable_bytes(std::span(&header_bytes, 1)), "");
    LAYUP_CHECK(header_bytes >= 2 && header_bytes <= kMaxHeaderBytes, path,
                " declares a JSON header of ", header_bytes,
                " bytes, which is not plausible (a safetensors header has 2 to ", kMaxHeaderBytes,
                " bytes); the file is damaged or is not a safetensors file");
    LAYUP_CHECK(header_bytes <= file_size - 8, path, " declares a JSON header of ", header_bytes,
                " bytes, but only ", file_size - 8,
                " bytes follow the length field; the file is truncated");
    const size_t data_size = file_size - 8 - header_bytes;

    std::string header_text(header_bytes, '\0');
    read_bytes(8, std::as_writable_bytes(std::span(header_text)), "");
    data_start_ = 8 + header_bytes;  // from here on read_bytes reads relative to the data
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(header_text);
    } catch (const nlohmann::json::exception& error) {
      fail(path, " has a header that is not valid JSON (", error.what(),
           "); the file is damaged or is not a safetensors file");
    }
    LAYUP_CHECK(header.is_object(), path, " has a JSON header that is ", header.type_name(),
                " instead of an object mapping tensor names to their descriptions");

    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        LAYUP_CHECK(entry.is_object(), path, ": \"__metadata__\" is ", entry.type_name(),
                    " instead of an object of strings");
        for (const auto& [key, value] : entry.items()) {
          LAYUP_CHECK(value.is_string(), path, ": metadata entry '", key, "' is ", value.dump(),
                      " instead of a string");
          metadata_[key] = value.get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_tensor_entry(path, name, entry, data_size));
    }

    std::sort(tensors_.begin(), tensors_.end(), [](const auto& a, const auto& b) {
      return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.data_end < b.data_end;
    });
    const SafetensorsTensorInfo* previous = nullptr;
    for (const SafetensorsTensorInfo& tensor : tensors_) {
      if (tensor.data_begin == tensor.data_end) continue;  // empty tensors overlap nothing
      if (previous) {
        LAYUP_CHECK(tensor.data_begin >= previous->data_end, path, ": tensors '", previous->name,
                    "' (bytes ", previous->data_begin, "..", previous->data_end, ") and '",
                    tensor.name, "' (bytes ", tensor.data_begin, "..", tensor.data_end,
                    ") overlap; the file is damaged");
      }
      previous = &tensor;
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

const SafetensorsTensorInfo* SafetensorsReader::find(std::string_view name) const {
  for (const SafetensorsTensorInfo& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

void SafetensorsReader::read_bytes(size_t data_offset, std::span<std::byte> out,
                                   const std::string& tensor) const {
  size_t done = 0;
  while (done < out.size()) {
    const size_t chunk = std::min(out.size() - done, size_t{1} << 30);
    ssize_t got = ::pread(fd_, out.data() + done, chunk,
                          static_cast<off_t>(data_start_ + data_offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      fail("cannot read ", tensor.empty() ? std::string("the header") : "tensor '" + tensor + "'",
           " of ", path_, ": ",
           got == 0 ? "the file ended early (was it changed while being read?)"
                    : std::strerror(errno));
    }
    done += static_cast<size_t>(got);
  }
}

void SafetensorsReader::read_floats(const std::string& name, std::span<float> out) const {
  const SafetensorsTensorInfo* tensor = find(name);
  LAYUP_CHECK(tensor, path_, " has no tensor '", name, "'");
  LAYUP_CHECK(out.size() == tensor->element_count, "cannot read tensor '", name, "' of ", path_,
              ": it has ", tensor->element_count, " elements but the destination holds ",
              out.size());
  read_floats(*tensor, 0, out);
}

void SafetensorsReader::read_floats(const SafetensorsTensorInfo& tensor, size_t first,
                                    std::span<float> out) const {
  const std::string& name = tensor.name;
  LAYUP_CHECK(first <= tensor.element_count && out.size() <= tensor.element_count - first,
              "cannot read elements ", first, "..", first + out.size(), " of tensor '", name,
              "' of ", path_, ": it has ", tensor.element_count, " elements");
  if (tensor.dtype == "F32") {
    read_bytes(tensor.data_begin + first * sizeof(float), std::as_writable_bytes(out), name);
    return;
  }
  if (tensor.dtype == "U8") {  // each byte as the float of its value
    std::vector<uint8_t> staging(std::min<size_t>(out.size(), size_t{1} << 20));
    for (size_t start = 0; start < out.size(); start += staging.size()) {
      const size_t count = std::min(staging.size(), out.size() - start);
      std::span<uint8_t> chunk(staging.data(), count);
      read_bytes(tensor.data_begin + first + start, std::as_writable_bytes(chunk), name);
      for (size_t i = 0; i < count; ++i) out[start + i] = chunk[i];
    }
    return;
  }
  LAYUP_CHECK(tensor.dtype == "F16" || tensor.dtype == "BF16", "cannot read tensor '", name,
              "' of ", path_, ": its dtype is ", tensor.dtype,
              "; layup reads F32, F16 and BF16 tensors (and U8 ones as bytes)");
  const bool is_half = tensor.dtype == "F16";
  // Convert in chunks so a large half-precision tensor needs no full-size staging copy.
  std::vector<uint16_t> staging(std::min<size_t>(out.size(), size_t{1} << 20));
  for (size_t start = 0; start < out.size(); start += staging.size()) {
    const size_t count = std::min(staging.size(), out.size() - start);
    std::span<uint16_t> chunk(staging.data(), count);
    read_bytes(tensor.data_begin + (first + start) * 2, std::as_writable_bytes(chunk), name);
    for (size_t i = 0; i < count; ++i) {
      out[start + i] = is_half ? half_to_float(chunk[i]) : bfloat16_to_float(chunk[i]);
    }
  }
}

std::vector<float> SafetensorsReader::read_floats(const std::string& name) const {
  const SafetensorsTensorInfo* tensor = find(name);
  LAYUP_CHECK(tensor, path_, " has no tensor '", name, "'");
  std::vector<float> values(tensor->element_count);
  read_floats(name, values);
  return values;
}

std::string safetensors_header(const std::string& path,
                               std::span<const SafetensorsTensorShape> tensors,
                               const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps the metadata first and the tensors in file order, which makes the header
  // readable with `head -c`; readers do not depend on the order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  size_t offset = 0;
  for (const SafetensorsTensorShape& tensor : tensors) {
    LAYUP_CHECK(!tensor.name.empty() && tensor.name != "__metadata__", "cannot write ", path,
                ": invalid tensor name '", tensor.name, "'");
    LAYUP_CHECK(names.insert(tensor.name).second, "cannot write ", path, ": tensor '", tensor.name,
                "' appears twice");
    size_t count = 1;
    for (size_t dim : tensor.shape) count *= dim;
    const size_t bytes = count * dtype_bytes(tensor.dtype);
    const char* dtype = tensor.dtype == SafetensorsDtype::kBF16 ? "BF16"
                        : tensor.dtype == SafetensorsDtype::kU8 ? "U8"
                                                                : "F32";
    header[tensor.name] = {
        {"dtype", dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = header_text.size();
  std::string bytes(sizeof(header_bytes), '\0');
  std::memcpy(bytes.data(), &header_bytes, sizeof(header_bytes));
  return bytes + header_text;
}

void write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsTensorShape> shapes;
  for (const SafetensorsTensor& tensor : tensors) {
    LAYUP_CHECK(tensor.data || tensor.fill, "cannot write ", path, ": tensor '", tensor.name,
                "' has neither data nor a fill function");
    shapes.push_back({tensor.name, tensor.shape});
  }
  const std::string header = safetensors_header(path, shapes, metadata);

  write_file_atomically(path, [&](const AppendBytes& append) {
    append(std::as_bytes(std::span(header)));
    std::vector<float> scratch;
    for (const SafetensorsTensor& tensor : tensors) {
      size_t count = 1;
      for (size_t dim : tensor.shape) count *= dim;
      if (tensor.fill) {
        scratch.assign(count, 0.0f);
        tensor.fill(scratch);
        append(std::as_bytes(std::span<const float>(scratch)));
      } else {
        append(std::as_bytes(std::span(tensor.data, count)));
      }
    }
  });
}

}  // namespace layup
