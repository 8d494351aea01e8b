// Streaming writer for .safetensors files: the header is computed up front from the tensor
// specs, then tensor data is appended in spec order (in chunks of any size), so multi-GB
// checkpoints are written without holding them in memory. The file appears atomically (written
// to "<path>.tmp", renamed by Close()).
//
//   DUET_ASSIGN_OR_RETURN(auto w, SafetensorsWriter::Create(path, {{"w", Dtype::kBF16, {2, 3}}}));
//   DUET_RETURN_IF_ERROR(w->AppendFloats(values.data(), 6));   // converted to BF16
//   DUET_RETURN_IF_ERROR(w->Close());
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/weights/safetensors.h"

namespace duet::model {

struct TensorSpec {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  // Metadata gets "format": "pt" unless given.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> specs,
      std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();  // without Close(): removes the temporary file
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends `count` values, converted to the dtype of the tensor(s) being filled (F32, F16,
  // BF16, F64); may span tensor boundaries.
  absl::Status AppendFloats(const float* values, size_t count);
  // Appends raw bytes of the data section.
  absl::Status AppendBytes(const void* data, size_t nbytes);
  // Checks that every tensor was filled, flushes, and renames into place.
  absl::Status Close();

  // The header bytes (8-byte length + JSON) the file starts with.
  static std::string EncodeHeader(const std::vector<TensorSpec>& specs,
                                  const std::map<std::string, std::string>& metadata);

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  SafetensorsWriter() = default;
  absl::Status Write(const void* data, size_t nbytes);

  std::string path_;
  std::string tmp_path_;
  std::vector<TensorSpec> specs_;
  std::vector<uint64_t> tensor_bytes_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  size_t current_ = 0;          // tensor being filled
  uint64_t current_done_ = 0;   // bytes of it written
  uint64_t total_bytes_ = 0;    // data section size
  uint64_t written_bytes_ = 0;  // data bytes written so far
  bool closed_ = false;
};

}  // namespace duet::model
