// Manifest parsing and dtype names.
#include <gtest/gtest.h>

#include <string>

#include <torch/version.h>

#include "aotc/runtime.h"

namespace {

// A valid manifest with one tweak applied by string replacement.
std::string manifest(const std::string& from = "", const std::string& to = "") {
  std::string m = R"({
    "format": "aotc/1", "aotc_version": "0.1.0", "name": "mlp", "created": "2026-11-29T10:00:00Z",
    "torch_version": "2.13.0+cpu", "device": "cpu", "cpu_isa": "avx2", "cuda_arch": null,
    "inputs":  [{"name": "x", "dtype": "float32", "shape": [-1, 512], "ranges": [[1, 1024], [512, 512]]}],
    "outputs": [{"name": "output0", "dtype": "float32", "shape": [-1, 512], "ranges": [[0, -1], [512, 512]]}],
    "batch": {"min": 1, "max": 1024},
    "compile": {}, "rewrites": {}, "fallback_ops": [],
    "tolerance": {"atol": 1e-4, "rtol": 2e-4},
    "files_sha256": {"data/aotinductor/model/abc.wrapper.so": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
    "samples": [{"inputs": ["extra/aotc/sample0_input0.npy"], "outputs": ["extra/aotc/sample0_output0.npy"]}]
  })";
  if (!from.empty()) {
    auto at = m.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    m.replace(at, from.size(), to);
  }
  return m;
}

std::string refusal(const std::string& json) {
  try {
    aotc::parse_manifest(json);
  } catch (const aotc::Error& e) {
    EXPECT_EQ(e.kind(), aotc::Error::Kind::PackageRefused);
    return e.what();
  }
  ADD_FAILURE() << "accepted: " << json;
  return "";
}

TEST(Manifest, ParsesEveryField) {
  auto m = aotc::parse_manifest(manifest());
  EXPECT_EQ(m.format, "aotc/1");
  EXPECT_EQ(m.name, "mlp");
  EXPECT_EQ(m.torch_version, "2.13.0+cpu");
  EXPECT_EQ(m.device, "cpu");
  EXPECT_EQ(m.cpu_isa, "avx2");
  EXPECT_TRUE(m.cuda_arch.empty());
  ASSERT_EQ(m.inputs.size(), 1u);
  EXPECT_EQ(m.inputs[0].name, "x");
  EXPECT_EQ(m.inputs[0].dtype, aotc::DType::Float32);
  EXPECT_EQ(m.inputs[0].shape, (std::vector<int64_t>{-1, 512}));
  EXPECT_EQ(m.inputs[0].ranges[0], (std::pair<int64_t, int64_t>(1, 1024)));
  EXPECT_EQ(m.outputs[0].ranges[0], (std::pair<int64_t, int64_t>(0, -1)));
  ASSERT_TRUE(m.batch.has_value());
  EXPECT_EQ(m.batch->second, 1024);
  EXPECT_DOUBLE_EQ(m.atol, 1e-4);
  EXPECT_DOUBLE_EQ(m.rtol, 2e-4);
  ASSERT_EQ(m.files_sha256.size(), 1u);
  EXPECT_EQ(m.files_sha256[0].first, "data/aotinductor/model/abc.wrapper.so");
  ASSERT_EQ(m.samples.size(), 1u);
  EXPECT_EQ(m.samples[0].outputs[0], "extra/aotc/sample0_output0.npy");
  EXPECT_EQ(m.raw_json, manifest());
}

TEST(Manifest, NullBatchAndCudaArch) {
  auto m = aotc::parse_manifest(manifest(R"("batch": {"min": 1, "max": 1024})", R"("batch": null)"));
  EXPECT_FALSE(m.batch.has_value());
  m = aotc::parse_manifest(manifest(R"("cuda_arch": null)", R"("cuda_arch": ["sm_90", "sm_80"])"));
  EXPECT_EQ(m.cuda_arch, (std::vector<std::string>{"sm_90", "sm_80"}));
}

TEST(Manifest, RefusesWithTheFieldNamed) {
  EXPECT_NE(refusal("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(refusal("[1]").find("object"), std::string::npos);
  EXPECT_NE(refusal(manifest("aotc/1", "aotc/2")).find("'aotc/2'"), std::string::npos);
  EXPECT_NE(refusal(manifest(R"("device": "cpu")", R"("device": "tpu")")).find("'tpu'"), std::string::npos);
  EXPECT_NE(refusal(manifest(R"("name": "mlp",)", "")).find("'name' is missing"), std::string::npos);
  EXPECT_NE(refusal(manifest(R"("dtype": "float32", "shape": [-1, 512], "ranges": [[1, 1024)",
                             R"("dtype": "float33", "shape": [-1, 512], "ranges": [[1, 1024)"))
                .find("float33"),
            std::string::npos);
  EXPECT_NE(refusal(manifest("[[1, 1024], [512, 512]]", "[[1, 1024]]")).find("'ranges' has 1 entries for 2 dims"),
            std::string::npos);
  EXPECT_NE(refusal(manifest("[[1, 1024], [512, 512]]", "[[1, 1024], [256, 256]]")).find("static dim 1 is 512"),
            std::string::npos);
  EXPECT_NE(refusal(manifest("[[1, 1024], [512, 512]]", "[[9, 3], [512, 512]]")).find("is empty"), std::string::npos);
  EXPECT_NE(refusal(manifest("0123456789abcdef0123", "zz")).find("64 hex"), std::string::npos);
  EXPECT_NE(refusal(manifest(R"("samples": [{"inputs": ["extra/aotc/sample0_input0.npy"], "outputs": ["extra/aotc/sample0_output0.npy"]}])",
                             R"("samples": [])"))
                .find("at least one"),
            std::string::npos);
  EXPECT_NE(refusal(manifest(R"("inputs": ["extra/aotc/sample0_input0.npy"])", R"("inputs": [])")).find("has 0 inputs"),
            std::string::npos);
  EXPECT_NE(refusal(manifest(R"("atol": 1e-4)", R"("atol": "small")")).find("'atol' must be a number"),
            std::string::npos);
}

TEST(DType, NamesRoundTrip) {
  for (const char* name : {"bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"}) {
    aotc::DType d = aotc::dtype_from_name(name);
    EXPECT_STREQ(aotc::dtype_name(d), name);
    EXPECT_EQ(static_cast<size_t>(c10::elementSize(aotc::to_scalar_type(d))), aotc::dtype_size(d));
  }
  EXPECT_THROW(aotc::dtype_from_name("float"), aotc::Error);
}

TEST(Platform, TorchVersionMustMatchMajorMinor) {
  auto m = aotc::parse_manifest(manifest());
  m.cpu_isa = "";
  m.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".7+whatever";
  EXPECT_FALSE(aotc::why_cannot_run(m).has_value());
  m.torch_version = "1.13.1";
  auto why = aotc::why_cannot_run(m);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("1.13.1"), std::string::npos);
  m.torch_version = "nightly";
  EXPECT_TRUE(aotc::why_cannot_run(m).has_value());
}

TEST(Platform, RefusesUnknownCpuIsa) {
  auto m = aotc::parse_manifest(manifest());
  m.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".0";
  m.cpu_isa = "avx1024";
  auto why = aotc::why_cannot_run(m);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("avx1024"), std::string::npos);
}

#if defined(__x86_64__)
// Inductor names an ISA with extensions in several words ("avx512 avx512_vnni"): each word must be present.
TEST(Platform, ReadsEveryWordOfAnIsaName) {
  auto m = aotc::parse_manifest(manifest());
  m.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + ".0";
  __builtin_cpu_init();
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512vnni");
  m.cpu_isa = "avx512 avx512_vnni";
  EXPECT_EQ(aotc::why_cannot_run(m).has_value(), !vnni);
  m.cpu_isa = "avx2 avx1024";  // one unknown word refuses the whole name
  auto why = aotc::why_cannot_run(m);
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("avx2 avx1024"), std::string::npos);
  m.cpu_isa = " ";
  EXPECT_TRUE(aotc::why_cannot_run(m).has_value());
}
#endif

}  // namespace

namespace {

// The manifest above with a dynamic sequence dim on its input and output, and sequence buckets.
std::string with_seq(const std::string& seq) {
  std::string m = manifest(R"("shape": [-1, 512], "ranges": [[1, 1024], [512, 512]]}],
    "outputs")", R"("shape": [-1, -1], "ranges": [[1, 1024], [8, 128]]}],
    "outputs")");
  const std::string out = R"("outputs": [{"name": "output0", "dtype": "float32", "shape": [-1, 512], "ranges": [[0, -1], [512, 512]]}])";
  m.replace(m.find(out), out.size(), R"("outputs": [{"name": "output0", "dtype": "float32", "shape": [-1, -1, 4], "ranges": [[0, -1], [8, 128], [4, 4]]}, {"name": "pooled", "dtype": "float32", "shape": [-1, 4], "ranges": [[0, -1], [4, 4]]}])");
  const std::string sample = R"("outputs": ["extra/aotc/sample0_output0.npy"])";
  m.replace(m.find(sample), sample.size(), R"("outputs": ["extra/aotc/sample0_output0.npy", "extra/aotc/sample0_output1.npy"])");
  return m.replace(m.find(R"("batch":)"), 0, R"("seq_buckets": )" + seq + ", ");
}

const char* kSeq = R"({"dim": "seq", "sizes": [32, 128], "inputs": {"x": 1}, "outputs": {"output0": 1},
  "pad_values": {"x": 2.5}, "graphs": {"32": "seq32_static", "128": "model"}, "weights": ["seq32_static"]})";

}  // namespace

TEST(Manifest, ParsesSequenceBuckets) {
  auto m = aotc::parse_manifest(with_seq(kSeq));
  ASSERT_TRUE(m.seq.has_value());
  EXPECT_EQ(m.seq->sizes, (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(m.seq->input_axes, std::vector<int>{1});
  EXPECT_EQ(m.seq->output_axes, (std::vector<int>{1, -1}));  // pooled has no sequence dim
  EXPECT_EQ(m.seq->pad_values, std::vector<double>{2.5});
  EXPECT_EQ(m.seq->graphs.at(32), "seq32_static");
  EXPECT_EQ(m.seq->bucket(1), 32);
  EXPECT_EQ(m.seq->bucket(33), 128);
  EXPECT_EQ(m.seq->bucket(129), -1);
  EXPECT_TRUE(m.borrowed_weights.count("seq32_static"));
  auto b = aotc::bucket_manifest(m, 32);  // what that bucket's graphs see
  EXPECT_EQ(b.inputs[0].shape, (std::vector<int64_t>{-1, 32}));
  EXPECT_EQ(b.outputs[0].ranges[1], (std::pair<int64_t, int64_t>{32, 32}));
  EXPECT_FALSE(b.seq.has_value());
}

TEST(Manifest, RefusesMalformedSequenceBuckets) {
  auto bad = [](const std::string& from, const std::string& to) {
    std::string s = kSeq;
    s.replace(s.find(from), from.size(), to);
    return refusal(with_seq(s));
  };
  EXPECT_NE(bad(R"("sizes": [32, 128])", R"("sizes": [128, 32])").find("'sizes' must ascend"), std::string::npos);
  EXPECT_NE(bad(R"("inputs": {"x": 1})", R"("inputs": {"y": 1})").find("names 'y'"), std::string::npos);
  EXPECT_NE(bad(R"("inputs": {"x": 1})", R"("inputs": {"x": 5})").find("not one of its dynamic dims"), std::string::npos);
  EXPECT_NE(bad(R"("128": "model")", R"("128": "big")").find("only it, is 'model'"), std::string::npos);
  EXPECT_NE(bad(R"("32": "seq32_static")", R"("33": "seq32_static")").find("'32' is missing"), std::string::npos);
  EXPECT_NE(bad(R"("32": "seq32_static")", R"("32": "Seq32")").find("lower-case"), std::string::npos);
  EXPECT_NE(bad(R"("32": "seq32_static")", R"("32": "model_x")").find("begins"), std::string::npos);
}

namespace {

// A packed graph (ids, segment_ids, position_ids [rows, 8] int64 -> tokens [rows, 8, 4]) with `pack` as its
// seq_pack.
std::string with_pack(const std::string& pack) {
  const std::string graph = R"("inputs": [
      {"name": "ids", "dtype": "int64", "shape": [-1, 8], "ranges": [[1, 16], [8, 8]]},
      {"name": "segment_ids", "dtype": "int64", "shape": [-1, 8], "ranges": [[1, 16], [8, 8]]},
      {"name": "position_ids", "dtype": "int64", "shape": [-1, 8], "ranges": [[1, 16], [8, 8]]}],
    "outputs": [{"name": "tokens", "dtype": "float32", "shape": [-1, 8, 4], "ranges": [[1, 16], [8, 8], [4, 4]]},
                {"name": "pooled", "dtype": "float32", "shape": [-1, 8, 4], "ranges": [[1, 16], [8, 8], [4, 4]]}],
    "batch": {"min": 1, "max": 16},)";
  std::string m = manifest();
  const size_t from = m.find(R"("inputs":)"), to = m.find(R"("compile":)");
  m.replace(from, to - from, graph + R"( "seq_pack": )" + pack + ", ");
  m.replace(m.find(R"("inputs": ["extra)"), std::string(R"("inputs": ["extra/aotc/sample0_input0.npy"])").size(),
            R"("inputs": ["a.npy", "b.npy", "c.npy"])");
  m.replace(m.find(R"("outputs": ["extra)"), std::string(R"("outputs": ["extra/aotc/sample0_output0.npy"])").size(),
            R"("outputs": ["d.npy", "e.npy"])");
  return m;
}

const char* kPack = R"({"size": 8, "dim": "seq", "inputs": {"ids": 1}, "pad_values": {"ids": -1},
  "segment_input": "segment_ids", "position_input": "position_ids",
  "outputs": {"tokens": "tokens", "pooled": "first"},
  "request_inputs": [{"name": "ids", "dtype": "int64", "shape": [-1, -1], "ranges": [[1, 16], [2, 8]]}],
  "request_outputs": [{"name": "tokens", "dtype": "float32", "shape": [-1, -1, 4], "ranges": [[1, 16], [2, 8], [4, 4]]},
                      {"name": "pooled", "dtype": "float32", "shape": [-1, 4], "ranges": [[1, 16], [4, 4]]}]})";

}  // namespace

TEST(Manifest, ParsesPackedSequences) {
  auto m = aotc::parse_manifest(with_pack(kPack));
  ASSERT_TRUE(m.pack.has_value());
  EXPECT_EQ(m.pack->size, 8);
  EXPECT_EQ(m.pack->input_of, std::vector<size_t>{0});
  EXPECT_EQ(m.pack->pad_values, std::vector<double>{-1});
  EXPECT_EQ(m.pack->segment_input, 1u);
  EXPECT_EQ(m.pack->position_input, 2u);
  EXPECT_EQ(m.pack->output_of, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(m.pack->first, (std::vector<bool>{false, true}));
  EXPECT_EQ(m.pack->request_inputs[0].ranges[1], (std::pair<int64_t, int64_t>{2, 8}));
}

TEST(Manifest, RefusesMalformedPackedSequences) {
  auto bad = [](const std::string& from, const std::string& to) {
    std::string s = kPack;
    s.replace(s.find(from), from.size(), to);
    return refusal(with_pack(s));
  };
  EXPECT_NE(bad(R"("size": 8)", R"("size": 0)").find("'size' must be >= 1"), std::string::npos);
  EXPECT_NE(bad(R"("size": 8)", R"("size": 16)").find("must be [batch, sequence]"), std::string::npos);
  EXPECT_NE(bad(R"([[1, 16], [2, 8]]}])", R"([[1, 16], [2, 9]]}])").find("more than a row's 8"), std::string::npos);
  EXPECT_NE(bad(R"("segment_input": "segment_ids")", R"("segment_input": "ids")").find("an int64 input of its own"),
            std::string::npos);
  EXPECT_NE(bad(R"("position_input": "position_ids")", R"("position_input": "nope")").find("'nope' is not one of the graph's"),
            std::string::npos);
  EXPECT_NE(bad(R"("pooled": "first")", R"("pooled": "mean")").find("expected 'tokens' or 'first'"), std::string::npos);
  EXPECT_NE(bad(R"("shape": [-1, 4], "ranges": [[1, 16], [4, 4]])",
                R"("shape": [-1, -1, 4], "ranges": [[1, 16], [2, 8], [4, 4]])").find("one dim less for 'first'"),
            std::string::npos);
  // the positions left to no one: a graph input neither packed nor filled by the packer
  EXPECT_NE(bad(R"("position_input": "position_ids")", R"("position_input": "segment_ids")").find("an int64 input of its own"),
            std::string::npos);
  std::string both = with_pack(kPack);
  both.replace(both.find(R"("seq_pack":)"), 0, R"("seq_buckets": {"dim": "seq", "sizes": [8], "inputs": {"ids": 1}, "outputs": {}, "pad_values": {}, "graphs": {"8": "model"}}, )");
  EXPECT_NE(refusal(both).find("seq_buckets or seq_pack, not both"), std::string::npos) << refusal(both);
}
