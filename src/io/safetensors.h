// Reading and writing safetensors, the file format Hugging Face stores weights in.
//
// A safetensors file is
//   [8 bytes: header length N, little-endian uint64]
//   [N bytes: JSON header]  {"__metadata__": {"key": "value", ...},
//                            "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//                            ...}
//   [data]                  tensor bytes, row-major little-endian, at [begin, end) from the start
//                           of the data section
// The writers store F32 or BF16 (rounded to nearest even from float), stream tensors from the
// caller's memory or a callback, pad the header with spaces to a multiple of 8 bytes (as the
// reference implementation does) and leaves no gaps, so transformers and the `safetensors` package
// read its files. The reader validates the whole header before any data is read, then reads F32,
// F16 and BF16 tensors into float, one tensor at a time, so loading a model needs no second copy of
// the file in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

// One tensor as the header describes it.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;  // as spelled in the file: "F32", "F16", "BF16", "I64", ...
  std::vector<size_t> shape;
  size_t element_count = 0;
  size_t data_begin = 0;  // byte offsets from the start of the data section
  size_t data_end = 0;
};

class SafetensorsReader {
 public:
  // Opens `path` and validates its header: length, JSON, every tensor's dtype, shape and offsets
  // (inside the data, matching the shape, not overlapping). Bytes after the last tensor are
  // allowed. Throws layup::Error naming the file and, where one is at fault, the tensor.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Tensors in the order of their data in the file.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const SafetensorsTensorInfo* find(std::string_view name) const;
  // The "__metadata__" entries (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads tensor `name` (F32, F16 or BF16) into `out`, converting to float. `out` must hold
  // exactly the tensor's element count. Throws for a missing tensor or another dtype.
  void read_floats(const std::string& name, std::span<float> out) const;
  std::vector<float> read_floats(const std::string& name) const;
  // Reads elements [first, first + out.size()) of `tensor` (one of tensors()), converting as
  // above, so a large tensor can be read a piece at a time.
  void read_floats(const SafetensorsTensorInfo& tensor, size_t first, std::span<float> out) const;

 private:
  void read_bytes(size_t data_offset, std::span<std::byte> out, const std::string& tensor) const;

  std::string path_;
  int fd_ = -1;
  size_t data_start_ = 0;  // file offset of the data section: 8 + header length
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One F32 tensor to write. Its bytes come from `data` (element count = product of `shape`,
// row-major) or, when `fill` is set, from `fill`, which is called with a scratch buffer of that
// many floats while the file is being written (e.g. to store a transposed copy without
// transposing the whole model up front).
struct SafetensorsTensor {
  std::string name;
  std::vector<size_t> shape;
  const float* data = nullptr;
  std::function<void(std::span<float> out)> fill;
};

// The dtypes the writers store: the values are always handed over as floats.
// What layup writes: F32, BF16, and U8 (bytes, such as compact optimizer state, handed to the
// writers as floats of the values 0..255).
enum class SafetensorsDtype { kF32, kBF16, kU8 };
size_t dtype_bytes(SafetensorsDtype dtype);

// The first bytes of a file of tensors with these names, shapes and dtypes, stored in this order
// without gaps: the 8-byte header length and the JSON header, padded to a multiple of 8 bytes.
// Names must be unique, non-empty and not "__metadata__"; `path` names the file in errors.
struct SafetensorsTensorShape {
  std::string name;
  std::vector<size_t> shape;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
};
std::string safetensors_header(const std::string& path,
                               std::span<const SafetensorsTensorShape> tensors,
                               const std::map<std::string, std::string>& metadata);

// Writes the tensors, in the given order, and the metadata to `path` atomically (see
// atomic_file.h). Names must be unique, non-empty and not "__metadata__".
void write_safetensors(const std::string& path, std::span<const SafetensorsTensor> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// IEEE half and bfloat16 to float, exactly (every value of both formats is a float).
float half_to_float(uint16_t bits);
float bfloat16_to_float(uint16_t bits);
// The bfloat16 nearest to `value`, ties to even (as torch's .to(torch.bfloat16) rounds); NaN stays
// a NaN, infinities and overflow past bfloat16's largest value become infinities.
uint16_t float_to_bfloat16(float value);

}  // namespace layup
