#include "common/weights/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/float16.h"
#include "common/base/status.h"
#include "nlohmann/json.hpp"

namespace duet::model {
namespace {

uint64_t SpecBytes(const TensorSpec& s) {
  uint64_t n = DtypeSize(s.dtype);
  for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

std::string SafetensorsWriter::EncodeHeader(const std::vector<TensorSpec>& specs,
                                            const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorSpec& s : specs) {
    const uint64_t n = SpecBytes(s);
    header[s.name] = {
        {"dtype", DtypeName(s.dtype)}, {"shape", s.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::string out(8, '\0');
  uint64_t len = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  return out + json;
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, std::vector<TensorSpec> specs,
    std::map<std::string, std::string> metadata) {
  std::map<std::string, int> seen;
  for (const TensorSpec& s : specs) {
    if (s.name.empty() || s.name == "__metadata__" || seen[s.name]++ > 0) {
      return absl::InvalidArgumentError(path + ": bad or duplicate tensor name '" + s.name + "'");
    }
    for (int64_t d : s.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(path + ": tensor '" + s.name + "' has shape " +
                                          ShapeToString(s.shape));
      }
    }
  }
  if (metadata.find("format") == metadata.end()) metadata["format"] = "pt";
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->tmp_path_ = path + ".tmp";
  w->file_.reset(std::fopen(w->tmp_path_.c_str(), "wb"));
  if (!w->file_) {
    return absl::InternalError(w->tmp_path_ + ": cannot create: " + std::strerror(errno));
  }
  std::setvbuf(w->file_.get(), nullptr, _IOFBF, 1 << 20);
  for (const TensorSpec& s : specs) {
    w->tensor_bytes_.push_back(SpecBytes(s));
    w->total_bytes_ += w->tensor_bytes_.back();
  }
  const std::string header = EncodeHeader(specs, metadata);
  w->specs_ = std::move(specs);
  DUET_RETURN_IF_ERROR(w->Write(header.data(), header.size()));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!closed_) {
    file_.reset();
    std::remove(tmp_path_.c_str());
  }
}

absl::Status SafetensorsWriter::Write(const void* data, size_t nbytes) {
  if (nbytes > 0 && std::fwrite(data, 1, nbytes, file_.get()) != nbytes) {
    return absl::InternalError(tmp_path_ + ": write failed: " + std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AppendBytes(const void* data, size_t nbytes) {
  if (closed_) return absl::FailedPreconditionError(path_ + ": already closed");
  if (written_bytes_ + nbytes > total_bytes_) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": appending ", nbytes,
                                              " bytes overflows "
                                              "the data section of ",
                                              total_bytes_, " bytes"));
  }
  DUET_RETURN_IF_ERROR(Write(data, nbytes));
  written_bytes_ += nbytes;
  // Advance the current tensor cursor.
  uint64_t left = nbytes;
  while (left > 0 && current_ < specs_.size()) {
    const uint64_t room = tensor_bytes_[current_] - current_done_;
    const uint64_t take = std::min(room, left);
    current_done_ += take;
    left -= take;
    if (current_done_ == tensor_bytes_[current_]) {
      ++current_;
      current_done_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::AppendFloats(const float* values, size_t count) {
  std::vector<uint8_t> buf;
  while (count > 0) {
    while (current_ < specs_.size() && tensor_bytes_[current_] == 0) ++current_;
    if (current_ >= specs_.size()) {
      return absl::OutOfRangeError(path_ + ": more values than the tensors hold");
    }
    const TensorSpec& s = specs_[current_];
    const size_t esize = DtypeSize(s.dtype);
    if (current_done_ % esize != 0) {
      return absl::FailedPreconditionError(path_ + ": tensor '" + s.name +
                                           "' was partly written with raw bytes");
    }
    const uint64_t room = (tensor_bytes_[current_] - current_done_) / esize;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(room, count));
    buf.resize(take * esize);
    switch (s.dtype) {
      case Dtype::kF32:
        std::memcpy(buf.data(), values, take * 4);
        break;
      case Dtype::kF16:
      case Dtype::kBF16:
        for (size_t i = 0; i < take; ++i) {
          const uint16_t h =
              s.dtype == Dtype::kF16 ? FloatToHalf(values[i]) : FloatToBf16(values[i]);
          std::memcpy(buf.data() + 2 * i, &h, 2);
        }
        break;
      case Dtype::kF64:
        for (size_t i = 0; i < take; ++i) {
          const double d = values[i];
          std::memcpy(buf.data() + 8 * i, &d, 8);
        }
        break;
      default:
        return absl::InvalidArgumentError(path_ + ": tensor '" + s.name + "' has dtype " +
                                          DtypeName(s.dtype) +
                                          "; floats can only fill F32, "
                                          "F16, BF16 or F64");
    }
    DUET_RETURN_IF_ERROR(AppendBytes(buf.data(), buf.size()));
    values += take;
    count -= take;
  }
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Close() {
  if (closed_) return absl::FailedPreconditionError(path_ + ": already closed");
  if (written_bytes_ != total_bytes_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": closed after ", written_bytes_,
                                                      " of ", total_bytes_, " data bytes"));
  }
  std::FILE* f = file_.release();
  const bool flush_failed = std::fflush(f) != 0;
  const bool close_failed = std::fclose(f) != 0;
  if (flush_failed || close_failed) {
    std::remove(tmp_path_.c_str());
    closed_ = true;
    return absl::InternalError(tmp_path_ + ": flush/close failed: " + std::strerror(errno));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    std::remove(tmp_path_.c_str());
    closed_ = true;
    return absl::InternalError(path_ + ": rename from .tmp failed: " + std::strerror(errno));
  }
  closed_ = true;
  return absl::OkStatus();
}

}  // namespace duet::model
