// libFuzzer target: the safetensors parser (header JSON, dtypes, shapes, offsets) and float
// conversion, on arbitrary bytes written to an in-memory file (memfd).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet::model;
  static const int fd = memfd_create("safetensors_fuzz", 0);
  if (fd < 0) std::abort();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::abort();
  }
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) return 0;
  for (const std::string& name : (*f)->TensorNames()) {
    auto t = (*f)->Get(name);
    if (!t.ok()) std::abort();  // listed names must be readable
    if (t->NumElements() > (1 << 20)) continue;
    std::vector<float> out(static_cast<size_t>(t->NumElements()));
    (void)ConvertToFloat(*t, out.data());
  }
  return 0;
}
