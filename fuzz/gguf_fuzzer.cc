// libFuzzer target: the GGUF parser, dequantisation, model config and tokenizer loading from
// arbitrary bytes. Any input must end in a Status, never a crash, leak or out-of-bounds read.
#include <cstddef>
#include <cstdint>

#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/spm_tokenizer.h"
#include "common/weights/gguf.h"
#include "common/weights/gguf_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace duet::model;
  auto f = GgufFile::FromBytes(data, size, "fuzz.gguf");
  if (!f.ok()) return 0;
  const GgufFile& g = **f;
  for (const GgufTensorInfo& t : g.tensors()) {
    if (t.NumElements() > (1 << 20)) continue;
    std::vector<float> out(static_cast<size_t>(t.NumElements()));
    (void)g.Dequantize(t, out.data());
  }
  auto config = ConfigFromGguf(g);
  if (config.ok()) (void)LoadGgufWeights(g, *config);
  auto tok = BpeTokenizer::FromGguf(g);
  if (tok.ok()) {
    auto ids = (*tok)->Encode("Hello <|im_start|> world 123", true);
    if (ids.ok()) (void)(*tok)->Decode(*ids);
  }
  auto spm = SpmTokenizer::FromGguf(g);
  if (spm.ok()) {
    auto ids = (*spm)->Encode("Hello <start_of_turn> w\xC3\xA9  \n\xFF 123", true);
    if (ids.ok()) (void)(*spm)->Decode(*ids);
  }
  return 0;
}
