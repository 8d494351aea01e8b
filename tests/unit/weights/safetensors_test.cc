#include "common/weights/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "common/base/float16.h"
#include "common/weights/safetensors_writer.h"
#include "tests/unit/weights/test_util.h"

namespace duet::model {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::HeaderBytes;
using testing::TempDir;
using testing::WriteRaw;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Writes a small valid file: a [2,3] F32, a [4] BF16, a [2,2] F16 and an empty tensor.
void WriteSample(const std::string& path) {
  auto w = SafetensorsWriter::Create(path,
                                     {{"a", Dtype::kF32, {2, 3}},
                                      {"b", Dtype::kBF16, {4}},
                                      {"c.weight", Dtype::kF16, {2, 2}},
                                      {"empty", Dtype::kF32, {0, 5}}},
                                     {{"note", "hello"}});
  ASSERT_TRUE(w.ok()) << w.status();
  const float a[] = {1, 2, 3, 4, 5, 6.5f};
  const float b[] = {1.0f, -2.0f, 0.25f, 3.0f};
  const float c[] = {0.5f, -0.125f, 65504.0f, std::ldexp(1.0f, -24)};
  ASSERT_TRUE((*w)->AppendFloats(a, 4).ok());  // chunks may split tensors...
  ASSERT_TRUE((*w)->AppendFloats(a + 4, 2).ok());
  std::vector<float> bc(b, b + 4);
  bc.insert(bc.end(), c, c + 4);
  ASSERT_TRUE((*w)->AppendFloats(bc.data(), bc.size()).ok());  // ... or span them
  ASSERT_TRUE((*w)->Close().ok());
}

TEST(SafetensorsTest, WriteThenReadValues) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSample(path);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->num_tensors(), 4u);
  EXPECT_EQ((*f)->TensorNames(), std::vector<std::string>({"a", "b", "c.weight", "empty"}));
  EXPECT_EQ((*f)->metadata().at("note"), "hello");
  EXPECT_EQ((*f)->metadata().at("format"), "pt");

  absl::StatusOr<TensorView> a = (*f)->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, Dtype::kF32);
  EXPECT_EQ(a->shape, std::vector<int64_t>({2, 3}));
  EXPECT_EQ(a->nbytes, 24u);
  EXPECT_EQ(a->file, path);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 8, 0u);  // header padded to 8 bytes
  EXPECT_EQ(*ToFloatVector(*a), std::vector<float>({1, 2, 3, 4, 5, 6.5f}));

  absl::StatusOr<TensorView> b = (*f)->Get("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype, Dtype::kBF16);
  EXPECT_EQ(*ToFloatVector(*b), std::vector<float>({1.0f, -2.0f, 0.25f, 3.0f}));
  uint16_t raw0;
  std::memcpy(&raw0, b->data, 2);
  EXPECT_EQ(raw0, 0x3f80);

  absl::StatusOr<TensorView> c = (*f)->Get("c.weight");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*ToFloatVector(*c),
            std::vector<float>({0.5f, -0.125f, 65504.0f, std::ldexp(1.0f, -24)}));
  absl::StatusOr<TensorView> e = (*f)->Get("empty");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->NumElements(), 0);
  EXPECT_EQ(e->nbytes, 0u);

  absl::StatusOr<TensorView> missing = (*f)->Get("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr(path), HasSubstr("'nope'")));
}

TEST(SafetensorsTest, CheckpointShapeChecks) {
  TempDir dir;
  WriteSample(dir / "model.safetensors");
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->Has("a"));
  EXPECT_TRUE((*ckpt)->GetWithShape("a", {2, 3}).ok());
  auto bad = (*ckpt)->GetWithShape("a", {3, 2}, " = [rows, cols]");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad.status()),
              AllOf(HasSubstr(dir / "model.safetensors"), HasSubstr("tensor 'a'"),
                    HasSubstr("has shape [2, 3]"), HasSubstr("expected [3, 2] = [rows, cols]")));
  auto missing = (*ckpt)->GetWithShape("model.norm.weight", {64});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr(dir / "model.safetensors"),
                                           HasSubstr("'model.norm.weight'"), HasSubstr("[64]")));
}

struct Malformed {
  const char* name;
  std::string bytes;
  std::vector<std::string> must_mention;
};

TEST(SafetensorsTest, MalformedFilesGiveClearErrors) {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]})";
  const std::string data12(12, '\0');
  const std::vector<Malformed> cases = {
      {"empty file", "", {"0 bytes", "8-byte header length"}},
      {"short file", "abcd", {"4 bytes", "8-byte header length"}},
      {"header length past EOF", HeaderBytes("{}", 1000), {"header length 1000", "past the end"}},
      {"huge header length", HeaderBytes("{}", ~uint64_t{0}), {"past the end"}},
      {"bad JSON", HeaderBytes("{\"w\": {\"dtype\": ") + data12, {"bad JSON"}},
      {"header not object", HeaderBytes("[1,2]"), {"header", "object"}},
      {"unknown dtype",
       HeaderBytes(R"({"w":{"dtype":"F9","shape":[3],"data_offsets":[0,12]}})") + data12,
       {"tensor 'w'", "unknown dtype 'F9'", "BF16"}},
      {"missing dtype",
       HeaderBytes(R"({"w":{"shape":[3],"data_offsets":[0,12]}})") + data12,
       {"tensor 'w'", "dtype"}},
      {"negative shape",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[-3],"data_offsets":[0,12]}})") + data12,
       {"tensor 'w'", "shape", "non-negative"}},
      {"shape not ints",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":["3"],"data_offsets":[0,12]}})") + data12,
       {"tensor 'w'", "shape"}},
      {"overflowing shape",
       HeaderBytes(
           R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,12]}})") +
           data12,
       {"tensor 'w'", "overflows"}},
      {"missing offsets",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[3]}})") + data12,
       {"tensor 'w'", "data_offsets"}},
      {"offsets past data (truncated)",
       HeaderBytes("{" + ok_entry + "}") + std::string(8, '\0'),
       {"tensor 'w'", "[0,12]", "past the end of the data section", "8 bytes", "truncated"}},
      {"offsets inconsistent with shape",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})") + data12,
       {"tensor 'w'", "span 8 bytes", "expected 12", "[3]", "F32"}},
      {"begin after end",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})") + data12,
       {"tensor 'w'", "begin is after end"}},
      {"negative offset",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[-4,8]}})") + data12,
       {"tensor 'w'", "data_offsets"}},
      {"overlap",
       HeaderBytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                   R"("v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") +
           data12,
       {"overlaps"}},
      {"metadata not strings",
       HeaderBytes(R"({"__metadata__":{"n":3},)" + ok_entry + "}") + data12,
       {"__metadata__", "'n'", "string"}},
      {"entry not object", HeaderBytes(R"({"w":[1,2]})"), {"tensor 'w'", "object"}},
  };
  TempDir dir;
  for (const Malformed& m : cases) {
    SCOPED_TRACE(m.name);
    const std::string path = dir / "bad.safetensors";
    WriteRaw(path, m.bytes);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    EXPECT_THAT(Msg(f.status()), HasSubstr(path));
    for (const std::string& s : m.must_mention) EXPECT_THAT(Msg(f.status()), HasSubstr(s));
    // The checkpoint layer passes the same error through.
    auto ckpt = SafetensorsCheckpoint::OpenFile(path);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_THAT(Msg(ckpt.status()), HasSubstr(path));
  }
}

TEST(SafetensorsTest, TruncatedRealFileIsRefused) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSample(path);
  const std::string full = testing::ReadRaw(path);
  for (size_t cut : {full.size() - 1, full.size() - 9, size_t{20}, size_t{7}}) {
    SCOPED_TRACE(cut);
    WriteRaw(dir / "cut.safetensors", full.substr(0, cut));
    auto f = SafetensorsFile::Open(dir / "cut.safetensors");
    ASSERT_FALSE(f.ok());
    EXPECT_THAT(Msg(f.status()), HasSubstr("cut.safetensors"));
  }
}

TEST(SafetensorsTest, RandomCorruptionNeverCrashesAndViewsStayInBounds) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  WriteSample(path);
  const std::string full = testing::ReadRaw(path);
  std::mt19937 rng(1234);
  int opened = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string bytes = full;
    const int flips = 1 + rng() % 4;
    for (int k = 0; k < flips; ++k) {
      const size_t pos = rng() % std::min<size_t>(bytes.size(), 300);
      bytes[pos] = static_cast<char>(rng() % 2 ? rng() % 256 : "0123456789[]{},:\""[rng() % 17]);
    }
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    WriteRaw(dir / "fuzz.safetensors", bytes);
    auto f = SafetensorsFile::Open(dir / "fuzz.safetensors");
    if (!f.ok()) {
      EXPECT_THAT(Msg(f.status()), HasSubstr("fuzz.safetensors"));
      continue;
    }
    ++opened;
    auto mapped = MappedFile::Open(dir / "fuzz.safetensors");
    ASSERT_TRUE(mapped.ok());
    for (const std::string& name : (*f)->TensorNames()) {
      auto t = (*f)->Get(name);
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(t->nbytes, static_cast<size_t>(t->NumElements()) * DtypeSize(t->dtype));
      // Offsets are within the file: read every byte.
      size_t sum = 0;
      for (size_t i = 0; i < t->nbytes; ++i) sum += t->data[i];
      (void)sum;
    }
  }
  EXPECT_LT(opened, 400);  // the corruption does bite
}

TEST(SafetensorsTest, MissingFileAndDir) {
  auto f = SafetensorsFile::Open("/nonexistent/model.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(f.status()), HasSubstr("/nonexistent/model.safetensors"));
  TempDir dir;
  auto c = SafetensorsCheckpoint::OpenDir(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(c.status()), AllOf(HasSubstr(dir.path()), HasSubstr("model.safetensors"),
                                     HasSubstr("model.safetensors.index.json")));
}

void WriteShard(const std::string& path, const std::vector<std::pair<std::string, float>>& ts) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, v] : ts) specs.push_back({name, Dtype::kF32, {2}});
  auto w = SafetensorsWriter::Create(path, specs);
  ASSERT_TRUE(w.ok()) << w.status();
  for (const auto& [name, v] : ts) {
    const float vals[] = {v, -v};
    ASSERT_TRUE((*w)->AppendFloats(vals, 2).ok());
  }
  ASSERT_TRUE((*w)->Close().ok());
}

TEST(SafetensorsTest, ShardedIndex) {
  TempDir dir;
  WriteShard(dir / "model-00001-of-00002.safetensors", {{"x", 1.0f}, {"y", 2.0f}});
  WriteShard(dir / "model-00002-of-00002.safetensors", {{"z", 3.0f}});
  WriteRaw(dir / "model.safetensors.index.json",
           R"({"metadata": {"total_size": 24}, "weight_map": {
                "x": "model-00001-of-00002.safetensors", "y": "model-00001-of-00002.safetensors",
                "z": "model-00002-of-00002.safetensors"}})");
  auto ckpt = SafetensorsCheckpoint::OpenDir(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->source(), dir / "model.safetensors.index.json");
  EXPECT_EQ((*ckpt)->TensorNames(), std::vector<std::string>({"x", "y", "z"}));
  auto z = (*ckpt)->GetWithShape("z", {2});
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_EQ(z->file, dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(*ToFloatVector(*z), std::vector<float>({3.0f, -3.0f}));
  EXPECT_EQ(*ToFloatVector(*(*ckpt)->Get("y")), std::vector<float>({2.0f, -2.0f}));
  auto missing = (*ckpt)->Get("w");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), AllOf(HasSubstr("index.json"), HasSubstr("'w'")));
}

TEST(SafetensorsTest, BadIndexes) {
  TempDir dir;
  WriteShard(dir / "s1.safetensors", {{"x", 1.0f}});
  const std::string index = dir / "model.safetensors.index.json";
  struct Case {
    const char* name;
    std::string json;
    std::vector<std::string> must_mention;
  };
  const std::vector<Case> cases = {
      {"missing shard",
       R"({"weight_map": {"x": "s1.safetensors", "y": "s2.safetensors"}})",
       {"s2.safetensors", "'y'", "index.json"}},
      {"tensor not in shard",
       R"({"weight_map": {"x": "s1.safetensors", "q": "s1.safetensors"}})",
       {"'q'", "s1.safetensors", "does not contain"}},
      {"no weight_map", R"({"metadata": {}})", {"weight_map"}},
      {"bad json", R"({"weight_map": )", {"bad JSON"}},
      {"shard escapes dir", R"({"weight_map": {"x": "../s1.safetensors"}})", {"relative"}},
      {"shard not string", R"({"weight_map": {"x": 7}})", {"'x'", "shard file name"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WriteRaw(index, c.json);
    auto ckpt = SafetensorsCheckpoint::OpenIndex(index);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_THAT(Msg(ckpt.status()), HasSubstr(index));
    for (const std::string& s : c.must_mention) EXPECT_THAT(Msg(ckpt.status()), HasSubstr(s));
  }
  // A corrupt shard is reported with the shard's own message, prefixed by the index.
  WriteRaw(dir / "s1.safetensors", "xx");
  WriteRaw(index, R"({"weight_map": {"x": "s1.safetensors"}})");
  auto ckpt = SafetensorsCheckpoint::OpenIndex(index);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()),
              AllOf(HasSubstr(index), HasSubstr("s1.safetensors"), HasSubstr("8-byte header")));
}

TEST(SafetensorsWriterTest, MisuseIsAnError) {
  TempDir dir;
  auto w = SafetensorsWriter::Create(dir / "a.safetensors", {{"t", Dtype::kF32, {2}}});
  ASSERT_TRUE(w.ok());
  const float v[] = {1, 2, 3};
  EXPECT_EQ((*w)->AppendFloats(v, 3).code(), absl::StatusCode::kOutOfRange);
  // A failed Close leaves no file behind.
  auto w2 = SafetensorsWriter::Create(dir / "b.safetensors", {{"t", Dtype::kF32, {2}}});
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->AppendFloats(v, 1).ok());
  absl::Status s = (*w2)->Close();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("4 of 8"));
  w2->reset();
  EXPECT_FALSE(SafetensorsFile::Open(dir / "b.safetensors").ok());
  auto dup = SafetensorsWriter::Create(dir / "c.safetensors",
                                       {{"t", Dtype::kF32, {2}}, {"t", Dtype::kF32, {2}}});
  EXPECT_FALSE(dup.ok());
  auto ints = SafetensorsWriter::Create(dir / "d.safetensors", {{"t", Dtype::kI32, {2}}});
  ASSERT_TRUE(ints.ok());
  EXPECT_EQ((*ints)->AppendFloats(v, 2).code(), absl::StatusCode::kInvalidArgument);
  const int32_t iv[] = {7, 8};
  ASSERT_TRUE((*ints)->AppendBytes(iv, sizeof(iv)).ok());
  ASSERT_TRUE((*ints)->Close().ok());
  auto f = SafetensorsFile::Open(dir / "d.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = (*f)->Get("t");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, Dtype::kI32);
  EXPECT_FALSE(ToFloatVector(*t).ok());
  EXPECT_THAT(Msg(ToFloatVector(*t).status()), AllOf(HasSubstr("'t'"), HasSubstr("I32")));
}

TEST(DtypeTest, NamesAndSizes) {
  EXPECT_EQ(*ParseDtype("BF16"), Dtype::kBF16);
  EXPECT_EQ(DtypeSize(Dtype::kBF16), 2u);
  EXPECT_EQ(DtypeSize(Dtype::kF64), 8u);
  EXPECT_STREQ(DtypeName(Dtype::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(ParseDtype("f32").ok());
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({3, 4}), "[3, 4]");
}

}  // namespace
}  // namespace duet::model
