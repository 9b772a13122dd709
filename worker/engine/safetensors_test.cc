#include "worker/engine/safetensors.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::engine {
namespace {

using ::testing::HasSubstr;

ModelConfig Small(bool tied) {
  ModelConfig c;
  c.vocab_size = 10;
  c.padded_vocab_size = PaddedVocabSize(10);
  c.hidden = 4;
  c.heads = 2;
  c.layers = 2;
  c.ffn = 8;
  c.context = 6;
  c.tie_embeddings = tied;
  return c;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/safetensors_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }
  std::string dir_;
};

SafeTensor F32(std::vector<int64_t> shape, const std::vector<float>& values) {
  SafeTensor t;
  t.dtype = "F32";
  t.shape = std::move(shape);
  t.bytes.resize(values.size() * 4);
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

TEST_F(SafetensorsTest, Gpt2RoundTripTransposesConv1DAndDropsVocabPadding) {
  for (bool tied : {false, true}) {
    const ParamLayout layout(Small(tied));
    std::vector<float> params = layout.InitialValues(5);
    const std::string path = Path(tied ? "tied.safetensors" : "untied.safetensors");
    ASSERT_TRUE(WriteGpt2Safetensors(path, layout, params).ok());
    auto contents = ReadSafetensors(path);
    ASSERT_TRUE(contents.ok()) << contents.status();
    EXPECT_EQ(contents->tensors.count("lm_head.weight"), tied ? 0u : 1u);
    const SafeTensor& qkv = contents->tensors.at("transformer.h.1.attn.c_attn.weight");
    EXPECT_EQ(qkv.shape, (std::vector<int64_t>{4, 12}));  // Conv1D: [in, out]
    EXPECT_EQ(contents->tensors.at("transformer.wte.weight").shape,
              (std::vector<int64_t>{10, 4}));  // V rows, not Vp
    // Element (out o=5, in i=2) of ours is element (i=2, o=5) of the file's.
    auto values = ToFloat32(qkv, "qkv");
    ASSERT_TRUE(values.ok());
    EXPECT_EQ((*values)[2 * 12 + 5], params[layout.Offset(TensorKind::kQkvWeight, 1) + 5 * 4 + 2]);
    auto back = LoadGpt2Safetensors(path, layout);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, params);  // padding rows are 0 in InitialValues too
  }
}

TEST_F(SafetensorsTest, HuggingFaceStyleFileWithoutPrefixBf16AndMaskBuffers) {
  const ParamLayout layout(Small(true));
  const std::vector<float> params = layout.InitialValues(9);
  ASSERT_TRUE(WriteGpt2Safetensors(Path("a.safetensors"), layout, params).ok());
  auto contents = ReadSafetensors(Path("a.safetensors"));
  ASSERT_TRUE(contents.ok());
  SafetensorsContents hf;
  for (auto& [name, t] : contents->tensors) {
    SafeTensor bf = t;  // BF16 of the F32 values (truncated)
    bf.dtype = "BF16";
    bf.bytes.resize(t.bytes.size() / 2);
    for (size_t i = 0; i < bf.bytes.size() / 2; ++i)
      std::memcpy(&bf.bytes[2 * i], &t.bytes[4 * i + 2], 2);
    hf.tensors[name.substr(strlen("transformer."))] = bf;
  }
  hf.tensors["h.0.attn.bias"] = F32({1, 1, 6, 6}, std::vector<float>(36, 1.0f));
  hf.tensors["lm_head.weight"] = hf.tensors["wte.weight"];
  ASSERT_TRUE(WriteSafetensors(Path("hf.safetensors"), hf).ok());
  auto loaded = LoadGpt2Safetensors(Path("hf.safetensors"), layout);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_NEAR((*loaded)[i], params[i], std::abs(params[i]) * (1.0 / 128)) << i;
  }
}

TEST_F(SafetensorsTest, ErrorsNameTheTensor) {
  const ParamLayout untied(Small(false));
  const std::vector<float> params = untied.InitialValues(1);
  ASSERT_TRUE(WriteGpt2Safetensors(Path("untied.safetensors"), untied, params).ok());
  // An untied file into a tied model: lm_head differs from wte.
  EXPECT_THAT(
      LoadGpt2Safetensors(Path("untied.safetensors"), ParamLayout(Small(true))).status().message(),
      HasSubstr("lm_head.weight differs from wte.weight"));
  // Fewer layers in the model than in the file: extra tensors.
  ModelConfig one = Small(false);
  one.layers = 1;
  EXPECT_THAT(LoadGpt2Safetensors(Path("untied.safetensors"), ParamLayout(one)).status().message(),
              HasSubstr("unexpected tensors h.1.attn.c_attn.bias"));
  // More layers: missing.
  ModelConfig three = Small(false);
  three.layers = 3;
  EXPECT_THAT(
      LoadGpt2Safetensors(Path("untied.safetensors"), ParamLayout(three)).status().message(),
      HasSubstr("missing tensors h.2.ln_1.weight"));
  // Another width.
  ModelConfig wide = Small(false);
  wide.ffn = 16;
  EXPECT_THAT(
      LoadGpt2Safetensors(Path("untied.safetensors"), ParamLayout(wide)).status().message(),
      HasSubstr("tensor h.0.mlp.c_fc.weight: shape [4, 8] does not fit the model ([4, 16])"));
  // Not a safetensors file; truncated data.
  std::ofstream(Path("junk"), std::ios::binary) << "hello world, this is not a header";
  EXPECT_THAT(ReadSafetensors(Path("junk")).status().message(),
              HasSubstr("not a safetensors file"));
  std::system(absl::StrCat("cp '", Path("untied.safetensors"), "' '", Path("short"),
                           "' && truncate -s -100 '", Path("short"), "'")
                  .c_str());
  EXPECT_THAT(ReadSafetensors(Path("short")).status().message(), HasSubstr("data_offsets outside"));
  EXPECT_EQ(ReadSafetensors(Path("nope")).status().code(), absl::StatusCode::kNotFound);
  // Unsupported dtype.
  SafetensorsContents f16;
  SafeTensor t = F32({2}, {1, 2});
  t.dtype = "F16";
  t.bytes.resize(4);
  f16.tensors["x"] = t;
  ASSERT_TRUE(WriteSafetensors(Path("f16"), f16).ok());
  auto read = ReadSafetensors(Path("f16"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(ToFloat32(read->tensors.at("x"), "x").status().message(),
              HasSubstr("dtype F16 is not supported"));
}

}  // namespace
}  // namespace boulder::engine
