// `.ondine` artifacts: the graph round trip (structure, subgraphs, every attribute kind, shared weights
// stored once, weights used in place from the mapping), outputs of the compiled artifact bit-identical to
// the ONNX path on the same CPU, and bad files (truncated, bit flips, foreign, newer version, offsets out of
// range with valid checksums, int8 needing VNNI), each an error naming the file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ondine/artifact/artifact.hpp"
#include "ondine/lower/artifact.hpp"
#include "ondine/lower/lower.hpp"
#include "ondine/ondine.hpp"
#include "ondine/passes/pipeline.hpp"
#include "support.hpp"

#include "../examples/cli/header.hpp"  // the header ondine_add_model generates

// Each test file in its own namespace: the tests build as a unity build (tests/CMakeLists.txt).
namespace test_artifact {

using namespace ondine;
namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
  fs::create_directories(ONDINE_TEST_TMP_DIR);
  return (fs::path(ONDINE_TEST_TMP_DIR) / name).string();
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

// The message of the Error that reading `path` throws ("" when it reads).
std::string read_error(const std::string& path) {
  try {
    artifact::read(path);
  } catch (const Error& e) {
    CHECK(e.file() == path);
    return e.what();
  }
  return "";
}

// The PyTorch corpus model `name` (tests/data/torch) after the default pipeline, and its case-k inputs.
Graph optimised(const std::string& name) {
  Graph g = ondine::onnx::load_model((fs::path(ONDINE_TEST_DATA_DIR) / "torch" / name / "model.onnx").string());
  lower::prepare_for_passes(g);
  PassManager pm = make_pass_manager("default");
  lower::set_isa_pass_options(pm);
  pm.run(g);
  return g;
}
std::map<std::string, Tensor> case_inputs(const std::string& name, int k) {
  std::map<std::string, Tensor> in;
  const std::string prefix = "case" + std::to_string(k) + ".";
  for (auto& e : fs::directory_iterator(fs::path(ONDINE_TEST_DATA_DIR) / "torch" / name)) {
    std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) == 0 && f.find(".out.") == std::string::npos && e.path().extension() == ".npy")
      in[f.substr(prefix.size(), f.size() - prefix.size() - 4)] = load_npy(e.path().string());
  }
  REQUIRE(!in.empty());
  return in;
}

bool bit_identical(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.dims() == b.dims() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("artifact: the graph round trip keeps structure, subgraphs and attributes; weights stay mapped",
          "[artifact]") {
  // gated_encoder: an If whose branches capture outer values; scripted_loop: a Loop with a nested If.
  for (const char* name : {"gated_encoder", "scripted_loop", "bert_encoder", "lstm_tagger"}) {
    INFO(name);
    Graph g = optimised(name);
    const std::string path = tmp_path(std::string(name) + ".ondine");
    artifact::Info info = lower::artifact_info(g, name, "default", 2);
    lower::save_artifact(g, path, info);
    artifact::Artifact a = lower::load_artifact(path);
    CHECK(a.graph.to_text() == g.to_text());
    CHECK(a.info.isa == lower::effective_isa().name);
    CHECK(a.info.threads == 2);
    CHECK(a.info.precision == "fp32");
    CHECK(a.info.source == name);
    CHECK(a.info.onednn_version == lower::onednn_version());
    // Constants point into the mapped file: 64-byte aligned, not owned.
    for (const Value* v : a.graph.constants()) {
      CHECK(reinterpret_cast<std::uintptr_t>(v->constant().raw()) % 64 == 0);
      CHECK_FALSE(v->constant().is_sole_owner());
    }
  }
}

TEST_CASE("artifact: a tensor shared by several values is stored once", "[artifact]") {
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4});
  Tensor w = test::uniform_tensor({4}, 1);
  Value* a = g.add_constant("a", w);
  Value* b = g.add_constant("b", w);  // the same storage
  Value* s = g.add_node("Add", {x, a}, {"s"})->output(0);
  Value* y = g.add_node("Mul", {s, b}, {"y"})->output(0);
  g.add_output(y);
  infer_shapes(g);
  const std::string path = tmp_path("shared.ondine");
  artifact::write(g, {}, path);
  artifact::Artifact read = artifact::read(path);
  CHECK(read.info.weight_bytes == 64u);  // 16 bytes, stored once, padded to 64
  CHECK(read.graph.find_value("a")->constant().raw() == read.graph.find_value("b")->constant().raw());
}

TEST_CASE("artifact: compiled, its outputs equal the ONNX path's bit for bit on the same CPU", "[artifact][lower]") {
  for (const char* name : {"gated_encoder", "gpt_decoder", "lstm_tagger"}) {
    INFO(name);
    lower::CompileOptions options;
    options.threads = 2;
    options.shape_plan = lower::ShapePlan::PerShape;  // the plans the packings were made for
    Graph imported = ondine::onnx::load_model((fs::path(ONDINE_TEST_DATA_DIR) / "torch" / name / "model.onnx").string());
    lower::ShapeCache onnx_path(std::move(imported), options);
    const std::string path = tmp_path(std::string(name) + ".compiled.ondine");
    Graph g = optimised(name);
    lower::save_artifact(g, path, lower::artifact_info(g, name, "default", 2));
    artifact::Artifact a = lower::load_artifact(path);
    CHECK(!a.packings.empty());
    lower::CompileOptions loaded = lower::artifact_options(options, a);
    std::shared_ptr<lower::PackedWeights> packed = loaded.packed_weights;
    lower::ShapeCache from_artifact(std::move(a.graph), loaded);
    for (int k = 0; k < 2; ++k) {
      INFO("case " << k);
      auto in = case_inputs(name, k);
      auto want = onnx_path.run(in);
      auto got = from_artifact.run(in);
      for (auto& [out, t] : want) {
        INFO(out);
        CHECK(bit_identical(got.at(out), t));
      }
      // The first shape is the one the packings were made for (its symbolic dims bound to 1 differ from
      // case 0's): whatever oneDNN chose again, every request a stored packing answered was equal.
      INFO("preloaded " << packed->preloaded() << ", used " << packed->preloaded_hits() << ", packed here "
                        << packed->packed_here());
      CHECK(packed->preloaded_hits() + packed->packed_here() > 0);
    }
  }
}

TEST_CASE("artifact: the weights oneDNN packed are stored and used at load, none packed again on this CPU",
          "[artifact][lower]") {
  // A static shape (dims given at write time, the same at load): every packing is found, nothing repacked.
  Graph g = optimised("lstm_tagger");
  const std::string path = tmp_path("packed.ondine");
  lower::save_artifact(g, path, lower::artifact_info(g, "lstm_tagger", "default", 2), {{"batch", 2}, {"seq", 7}});
  artifact::Artifact a = lower::load_artifact(path);
  CHECK(a.packing_dims == std::map<std::string, std::int64_t>{{"batch", 2}, {"seq", 7}});
  REQUIRE(!a.packings.empty());
  lower::CompileOptions options;
  options.threads = 2;
  Graph bound = a.graph.clone();
  bind_dims(bound, a.packing_dims);
  Graph reference_graph = bound.clone();
  lower::CompileOptions loaded = lower::artifact_options(options, a);
  auto model = lower::compile(std::move(bound), loaded);
  CHECK(loaded.packed_weights->packed_here() == 0);
  CHECK(loaded.packed_weights->preloaded_hits() >= a.packings.size());
  std::map<std::string, Tensor> in{{"input_ids", Tensor::from_vector<std::int64_t>({2, 7}, {1, 5, 9, 3, 2, 8, 4, 7, 6, 0, 11, 12, 13, 2})}};
  CHECK(test::rel_error(model.run(in).at("tags"), ReferenceExecutor(reference_graph).run(in).at("tags")) < 1e-5);
  // At one thread the bidirectional layers are one primitive each (two side by side at two threads): other
  // requests, each answered by a stored packing of an equal descriptor or packed again.
  lower::CompileOptions one = lower::artifact_options(lower::CompileOptions{}, a);
  one.threads = 1;
  Graph again = a.graph.clone();
  bind_dims(again, a.packing_dims);
  auto model1 = lower::compile(std::move(again), one);
  CHECK(one.packed_weights->preloaded_hits() + one.packed_weights->packed_here() > 0);
  CHECK(test::rel_error(model1.run(in).at("tags"), ReferenceExecutor(reference_graph).run(in).at("tags")) < 1e-5);
}

TEST_CASE("artifact: bad files are errors naming the file", "[artifact][bad-input]") {
  Graph g = optimised("gated_encoder");
  const std::string good = tmp_path("good.ondine");
  lower::save_artifact(g, good, lower::artifact_info(g, "gated_encoder", "default", 1));
  const std::vector<unsigned char> bytes = read_bytes(good);
  REQUIRE(read_error(good).empty());
  const std::string bad = tmp_path("bad.ondine");

  // Truncated anywhere: header, schema part, weight section.
  for (std::size_t size : {std::size_t{0}, std::size_t{10}, std::size_t{63}, std::size_t{64}, std::size_t{200},
                           bytes.size() / 2, bytes.size() - 1}) {
    INFO("truncated to " << size);
    write_bytes(bad, std::vector<unsigned char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(size)));
    CHECK_THAT(read_error(bad), Catch::Contains("artifact"));
  }
  // One flipped bit, every 97 bytes over the whole file (but the zero padding between the schema part and
  // the weight section, which nothing reads): never read as a valid model.
  const std::size_t gap_begin = 64 + artifact::detail::get_u64(bytes.data() + 24);
  const std::size_t gap_end = artifact::detail::get_u64(bytes.data() + 32);
  for (std::size_t at = 8; at < bytes.size(); at += 97) {
    if (at >= gap_begin && at < gap_end) continue;
    INFO("bit flipped at " << at);
    std::vector<unsigned char> flipped = bytes;
    flipped[at] ^= 0x10;
    write_bytes(bad, flipped);
    CHECK_FALSE(read_error(bad).empty());
  }
  // A weight byte flipped, its checksum computed in the background (while a loader compiles): read returns,
  // wait_checked() reports the damage.
  {
    std::vector<unsigned char> flipped = bytes;
    flipped[(gap_end + bytes.size()) / 2] ^= 0x10;
    write_bytes(bad, flipped);
    CHECK_THAT(read_error(bad), Catch::Contains("does not match"));
    artifact::Artifact a = artifact::read(bad, {}, artifact::WeightCheck::Background);
    REQUIRE(a.weights_checked);
    CHECK_THROWS_WITH(a.wait_checked(), Catch::Contains("does not match") && Catch::Contains("bad.ondine"));
    artifact::Artifact fine = artifact::read(good, {}, artifact::WeightCheck::Background);
    CHECK_NOTHROW(fine.wait_checked());
  }
  // A foreign file (the ONNX model itself), and a newer format version.
  CHECK_THAT(read_error((fs::path(ONDINE_TEST_DATA_DIR) / "torch" / "gated_encoder" / "model.onnx").string()),
             Catch::Contains("not an Ondine artifact"));
  std::vector<unsigned char> newer = bytes;
  newer[8] = static_cast<unsigned char>(artifact::kFormatVersion + 1);
  write_bytes(bad, newer);
  CHECK_THAT(read_error(bad), Catch::Contains("format version " + std::to_string(artifact::kFormatVersion + 1)) &&
                                  Catch::Contains("reads version " + std::to_string(artifact::kFormatVersion)) &&
                                  Catch::Contains("update Ondine"));
  newer[8] = 2;  // format 2 (its weights hashed in one sequence): recompiled
  write_bytes(bad, newer);
  CHECK_THAT(read_error(bad), Catch::Contains("format version 2") && Catch::Contains("recompile"));
  newer[8] = 1;  // format 1 (one variant, no list): recompiled, not guessed at
  write_bytes(bad, newer);
  CHECK_THAT(read_error(bad), Catch::Contains("format version 1") && Catch::Contains("recompile"));
  std::vector<unsigned char> reserved = bytes;  // the header's last field is reserved: zero
  reserved[60] = 1;
  write_bytes(bad, reserved);
  CHECK_THAT(read_error(bad), Catch::Contains("reserved field is not zero"));
  CHECK_THAT(read_error(tmp_path("missing.ondine")), Catch::Contains("cannot open"));
}

TEST_CASE("artifact: a tensor range outside the weight section is refused, checksums notwithstanding",
          "[artifact][bad-input]") {
  // A well-formed file (valid FlatBuffer, matching checksums) whose one constant claims bytes past the end
  // of the weight section: only the loader's own bounds check can catch it.
  namespace fb = artifact::fb;
  for (std::uint64_t offset : {std::uint64_t{64}, std::uint64_t{1} << 62}) {
    INFO("offset " << offset);
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<std::int64_t> dims{4};
    auto data = fb::CreateTensorData(fbb, fb::DType::Float32, fbb.CreateVector(dims), offset, 16);
    auto shape = fb::CreateShape(fbb, true, fbb.CreateVector(std::vector<flatbuffers::Offset<fb::Dim>>{fb::CreateDim(fbb, 4)}));
    auto value = fb::CreateValue(fbb, fbb.CreateString("w"), fb::ValueKind::Tensor, fb::DType::Float32, shape,
                                 fb::Layout::Unset, data);
    auto graph = fb::CreateGraph(fbb, fbb.CreateString("g"), fbb.CreateVector(std::vector<decltype(value)>{value}), 0, 0,
                                 fbb.CreateVectorOfStrings(std::vector<std::string>{"w"}));
    auto variant = fb::CreateVariant(fbb, fb::CreateTarget(fbb), graph);
    fb::FinishModelBuffer(fbb, fb::CreateModel(fbb, 0, 0, 0, 0, fbb.CreateVector(std::vector<decltype(variant)>{variant})));
    std::vector<unsigned char> weights(64, 0);
    std::vector<unsigned char> file(64, 0);
    std::memcpy(file.data(), artifact::kMagic, 8);
    artifact::detail::put_u32(file.data() + 8, artifact::kFormatVersion);
    artifact::detail::put_u32(file.data() + 12, 64);
    const std::size_t weights_at = artifact::detail::align_up(64 + fbb.GetSize());
    artifact::detail::put_u64(file.data() + 16, 64);
    artifact::detail::put_u64(file.data() + 24, fbb.GetSize());
    artifact::detail::put_u64(file.data() + 32, weights_at);
    artifact::detail::put_u64(file.data() + 40, weights.size());
    artifact::detail::put_u64(file.data() + 48, XXH3_64bits(fbb.GetBufferPointer(), fbb.GetSize()));
    artifact::detail::put_u64(file.data() + 56, 0);  // reserved (each variant hashes the weights it reads)
    file.insert(file.end(), fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    file.resize(weights_at, 0);
    file.insert(file.end(), weights.begin(), weights.end());
    const std::string path = tmp_path("outside.ondine");
    write_bytes(path, file);
    CHECK_THAT(read_error(path), Catch::Contains("constant 'w'") && Catch::Contains("outside the weight section"));
  }
}

TEST_CASE("artifact: schema parts mutated under valid checksums are read or refused, never a crash",
          "[artifact][bad-input]") {
  // What a crafted file can do past the checksums: random byte changes in the FlatBuffer, its checksum
  // recomputed. Run under ASan/UBSan this found 8-byte vector elements at unaligned addresses (now copied).
  Graph g = optimised("gated_encoder");
  const std::string good = tmp_path("mutate.ondine");
  lower::save_artifact(g, good, lower::artifact_info(g, "gated_encoder", "default", 1));
  const std::vector<unsigned char> bytes = read_bytes(good);
  const std::size_t at = artifact::detail::get_u64(bytes.data() + 16), len = artifact::detail::get_u64(bytes.data() + 24);
  std::mt19937 rng(7);
  std::size_t refused = 0;
  for (int k = 0; k < 300; ++k) {
    std::vector<unsigned char> b = bytes;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 8); i < n; ++i) b[at + rng() % len] = static_cast<unsigned char>(rng());
    artifact::detail::put_u64(b.data() + 48, XXH3_64bits(b.data() + at, len));
    auto* p = static_cast<unsigned char*>(std::aligned_alloc(64, (b.size() + 63) / 64 * 64));
    std::memcpy(p, b.data(), b.size());
    try {
      artifact::read_memory(p, b.size(), "mutated");
    } catch (const Error& e) {
      CHECK(e.file() == "mutated");
      ++refused;
    }
    std::free(p);
  }
  CHECK(refused > 0);
}

TEST_CASE("artifact: an int8 artifact that needs VNNI is refused on a CPU without it, naming both ISAs",
          "[artifact][int8][bad-input]") {
  Graph g = optimised("lstm_tagger");
  artifact::Info info = lower::artifact_info(g, "lstm_tagger", "default", 1);
  info.precision = "int8";
  info.requires_vnni = true;
  info.isa = "avx512_core_vnni";
  const std::string path = tmp_path("needs_vnni.ondine");
  lower::save_artifact(g, path, info);
  if (lower::effective_isa().int8_vnni) {
    CHECK_NOTHROW(lower::load_artifact(path));
  } else {
    // Its variant's ISA is above this CPU's: refused as such, before the VNNI check.
    CHECK_THROWS_WITH(lower::load_artifact(path), Catch::Contains("no variant this CPU runs") &&
                                                      Catch::Contains("avx512_core_vnni") &&
                                                      Catch::Contains(lower::effective_isa().name));
    // A variant claiming a lower ISA but 8-bit weights (a crafted file) meets the VNNI check.
    info.isa = lower::effective_isa().name;
    lower::save_artifact(g, path, info);
    CHECK_THROWS_WITH(lower::load_artifact(path), Catch::Contains("need VNNI") && Catch::Contains(info.isa));
  }
  // Another oneDNN major.minor is refused too.
  info.requires_vnni = false;
  info.onednn_version = "3.1.0";
  lower::save_artifact(g, path, info);
  CHECK_THROWS_WITH(lower::load_artifact(path), Catch::Contains("oneDNN 3.1.0") && Catch::Contains(lower::onednn_version()));
}

TEST_CASE("artifact: a bf16 variant stores its bf16 packings and the nodes kept fp32, and loads in bf16",
          "[artifact][lower][bf16]") {
  Graph g = optimised("gpt_decoder");
  const lower::IsaInfo here = lower::effective_isa();
  // Auto is bf16 exactly where the target has native bf16; bf16 on a target without it is refused.
  CHECK(lower::artifact_info(g, "gpt", "default", 2, lower::isa_info(lower::CpuIsa::Avx2), lower::Precision::Auto)
            .precision == "fp32");
  CHECK(lower::artifact_info(g, "gpt", "default", 2, lower::isa_info(lower::CpuIsa::Avx512CoreAmx),
                             lower::Precision::Auto)
            .precision == "bf16");
  CHECK_THROWS_WITH(
      lower::artifact_info(g, "gpt", "default", 2, lower::isa_info(lower::CpuIsa::Avx512CoreVnni), lower::Precision::Bf16),
      Catch::Contains("native bf16") && Catch::Contains("avx512_core_vnni"));
  // Must not fire: an fp32 artifact loads in fp32.
  const std::string fp32_path = tmp_path("gpt_fp32.ondine");
  lower::save_artifact(g, fp32_path, lower::artifact_info(g, "gpt", "default", 2));
  CHECK(lower::artifact_options({}, lower::load_artifact(fp32_path)).precision == lower::Precision::Fp32);
  if (!here.bf16_native) return;  // (the rest compiles bf16: native bf16 only)

  artifact::Info info = lower::artifact_info(g, "gpt", "default", 2, here, lower::Precision::Bf16);
  CHECK(info.precision == "bf16");
  std::string kept;  // one matrix product kept fp32
  for (const Node* n : g.nodes())
    if (kept.empty() && (n->op_type() == "MatMul" || n->op_type() == "FusedMatMul" || n->op_type() == "Gemm")) kept = n->name();
  REQUIRE(!kept.empty());
  info.keep_fp32 = {kept};
  const std::string path = tmp_path("gpt_bf16.ondine");
  const std::map<std::string, std::int64_t> dims{{"batch", 2}, {"seq", 5}};
  CHECK(lower::save_artifact(g, path, info, dims).empty());
  artifact::Artifact a = lower::load_artifact(path);
  CHECK(a.info.precision == "bf16");
  CHECK(a.info.keep_fp32 == std::vector<std::string>{kept});
  lower::CompileOptions options;
  options.threads = 2;
  lower::CompileOptions loaded = lower::artifact_options(options, a);
  CHECK(loaded.precision == lower::Precision::Bf16);
  CHECK(loaded.keep_fp32 == std::vector<std::string>{kept});
  Graph bound = a.graph.clone();
  bind_dims(bound, a.packing_dims);
  Graph reference_graph = bound.clone();
  CompiledModel model = lower::compile(std::move(bound), loaded);
  CHECK(!model.bf16_nodes().empty());
  CHECK(std::find(model.bf16_nodes().begin(), model.bf16_nodes().end(), kept) == model.bf16_nodes().end());
  // The bf16 packings were stored: nothing packed again at the packing dims.
  CHECK(loaded.packed_weights->packed_here() == 0);
  CHECK(loaded.packed_weights->preloaded_hits() > 0);
  std::map<std::string, Tensor> in{{"input_ids", Tensor::from_vector<std::int64_t>({2, 5}, {1, 5, 9, 3, 2, 8, 4, 7, 6, 0})}};
  CHECK(test::rel_error(model.run(in).at("logits"), ReferenceExecutor(reference_graph).run(in).at("logits")) < 3e-2);
}

TEST_CASE("artifact: the tuner's kernel choices are stored, applied at load unless the caller sets them, and "
          "an unknown one is refused naming the file",
          "[artifact][tune]") {
  Graph g = optimised("gated_encoder");
  const std::string path = tmp_path("tuned.ondine");
  artifact::Info info = lower::artifact_info(g, "gated_encoder", "default", 2);
  info.tuned = "conv_layout=any,conv_algorithm=direct,matmul_kernel=gemm";
  lower::save_artifact(g, path, info);
  artifact::Artifact a = lower::load_artifact(path);
  CHECK(a.info.tuned == info.tuned);
  lower::CompileOptions loaded = lower::artifact_options({}, a);
  CHECK(loaded.conv_layout == lower::ConvLayout::Any);
  CHECK(loaded.conv_algorithm == lower::ConvAlgorithm::Direct);
  CHECK(loaded.matmul_kernel == lower::MatMulKernel::Gemm);
  lower::CompileOptions mine;
  mine.conv_algorithm = lower::ConvAlgorithm::Winograd;  // the caller's wins
  CHECK(lower::artifact_options(mine, a).conv_algorithm == lower::ConvAlgorithm::Winograd);
  // Without choices (every artifact written before them): the built-in rules.
  info.tuned.clear();
  lower::save_artifact(g, path, info);
  CHECK(lower::artifact_options({}, lower::load_artifact(path)).conv_layout == lower::ConvLayout::Auto);

  info.tuned = "conv_algorithm=fft";
  lower::save_artifact(g, path, info);
  try {
    lower::load_artifact(path);
    FAIL("an unknown tuned choice loaded");
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK(what.find("conv_algorithm=fft") != std::string::npos);
    CHECK(what.find(path) != std::string::npos);
  }
}

TEST_CASE("artifact: the packings of a compile already done (the tuner's kept plan, the bf16 bound's) are "
          "stored as they are and load with nothing packed again",
          "[artifact][tune]") {
  Graph g = optimised("face_embedding");
  Graph bound = g.clone();
  const std::map<std::string, std::int64_t> dims = lower::packing_dims(g, {});
  bind_dims(bound, dims);
  lower::CompileOptions options;
  options.threads = 2;
  options.passes = "none";
  lower::TuneOptions t;
  t.cache_path = "none";
  t.budget_seconds = 5;
  t.runs = 1;
  t.keep_packings = true;
  const lower::TuneResult r = lower::tune(bound, options, t);
  REQUIRE(r.packed);
  REQUIRE(r.packed->size() > 0);
  artifact::Info info = lower::artifact_info(g, "face_embedding", "default", 2, lower::effective_isa(),
                                             r.options.precision);
  for (const lower::TuneDecision& d : r.decisions)
    if (d.knob != "precision") info.tuned += (info.tuned.empty() ? "" : ",") + d.knob + "=" + d.value;
  const std::string path = tmp_path("tuned_packed.ondine");
  CHECK(lower::save_artifact(g, path, info, {}, true, r.packed).empty());
  artifact::Artifact a = lower::load_artifact(path);
  CHECK(a.packings.size() == r.packed->size());
  CHECK(a.packing_dims == dims);
  lower::CompileOptions loaded = lower::artifact_options(options, a);
  Graph at = a.graph.clone();
  bind_dims(at, a.packing_dims);
  Graph reference_graph = at.clone();
  CompiledModel model = lower::compile(std::move(at), loaded);
  CHECK(loaded.packed_weights->packed_here() == 0);
  CHECK(loaded.packed_weights->preloaded_hits() > 0);
  const std::map<std::string, Tensor> in = case_inputs("face_embedding", 0);
  const double bound_error = r.options.precision == lower::Precision::Bf16 ? 3e-2 : 1e-4;
  for (const auto& [name, want] : ReferenceExecutor(reference_graph).run(in))
    CHECK(test::rel_error(model.run(in).at(name), want) < bound_error);

  // The bf16 bound's kept compile: only where bf16 is native.
  if (!lower::effective_isa().bf16_native) return;
  lower::Bf16BoundOptions bo;
  bo.max_error = 1e-2;
  bo.keep_packings = true;
  lower::CompileOptions bf16 = options;
  bf16.precision = lower::Precision::Bf16;
  const lower::Bf16BoundResult b = lower::compile_bf16_within(bound, bf16, {in}, bo);
  REQUIRE(b.packed);
  artifact::Info binfo = lower::artifact_info(g, "face_embedding", "default", 2, lower::effective_isa(),
                                              lower::Precision::Bf16);
  binfo.keep_fp32 = b.kept;
  const std::string bpath = tmp_path("bf16_packed.ondine");
  CHECK(lower::save_artifact(g, bpath, binfo, {}, true, b.packed).empty());
  artifact::Artifact ba = lower::load_artifact(bpath);
  lower::CompileOptions bloaded = lower::artifact_options(options, ba);
  Graph bat = ba.graph.clone();
  bind_dims(bat, ba.packing_dims);
  CompiledModel bmodel = lower::compile(std::move(bat), bloaded);
  CHECK(bloaded.packed_weights->packed_here() == 0);
  CHECK(!bmodel.bf16_nodes().empty());
}

TEST_CASE("artifact: a packing's source is looked up among the constants only", "[artifact]") {
  // A source the lowering derived and freed leaves a dangling address, which another packing's bytes may
  // reuse (seen with oneDNN capped at AVX2): it must not be taken for that packing's bytes, but stay a
  // source known by its hashes.
  Graph g;
  Value* x = g.add_input("x", DType::Float32, Shape{4});
  g.add_output(g.add_node("Relu", {x}, {"y"})->output(0));
  infer_shapes(g);
  std::vector<unsigned char> packed(256, 7);
  artifact::Packing first, second;
  first.data = packed.data();
  first.bytes = packed.size();
  first.md = std::string(8, 'a');
  second.source = packed.data();  // dangling in real life: the same address as `first`'s bytes
  second.source_bytes = packed.size();
  second.hash = 5;
  second.data = packed.data();
  second.bytes = packed.size();
  second.md = std::string(8, 'b');
  const std::string path = tmp_path("dangling_source.ondine");
  artifact::write(g, {}, path, {first, second});
  const artifact::Artifact a = artifact::read(path);
  REQUIRE(a.packings.size() == 2);
  CHECK(a.packings[1].source == nullptr);
  CHECK(a.packings[1].hash == 5);
  CHECK(a.packings[0].data == a.packings[1].data);  // equal bytes stored once
  CHECK(a.info.weight_bytes == 256);
}

TEST_CASE("artifact: which ISA's code runs on which CPU", "[artifact][isa]") {
  using lower::CpuIsa;
  using lower::isa_runs_on;
  CHECK(isa_runs_on(CpuIsa::Avx2, CpuIsa::Avx2));
  CHECK(isa_runs_on(CpuIsa::Avx2, CpuIsa::Avx512CoreBf16));
  CHECK(isa_runs_on(CpuIsa::Avx512Core, CpuIsa::Avx512CoreAmx));
  CHECK(isa_runs_on(CpuIsa::Avx512CoreVnni, CpuIsa::Avx512CoreBf16));
  CHECK_FALSE(isa_runs_on(CpuIsa::Avx512CoreAmx, CpuIsa::Avx512CoreBf16));
  CHECK_FALSE(isa_runs_on(CpuIsa::Avx512Core, CpuIsa::Avx2));
  CHECK_FALSE(isa_runs_on(CpuIsa::Avx512CoreBf16, CpuIsa::Avx512CoreVnni));
  CHECK(isa_runs_on(CpuIsa::Avx2Vnni, CpuIsa::Avx512CoreVnni));   // VNNI either way
  CHECK_FALSE(isa_runs_on(CpuIsa::Avx2Vnni, CpuIsa::Avx512Core));  // no VNNI
  CHECK_FALSE(isa_runs_on(CpuIsa::Unknown, CpuIsa::Avx512Core));   // a name from a newer Ondine
  CHECK(lower::isa_from_name("avx512_core_amx") == CpuIsa::Avx512CoreAmx);
  CHECK(lower::isa_from_name("avx9") == CpuIsa::Unknown);
  CHECK(lower::max_cpu_isa_env(CpuIsa::Avx512CoreVnni) == "AVX512_CORE_VNNI");
}

TEST_CASE("artifact: variants share the weight section, and the best one this CPU runs is chosen", "[artifact]") {
  // Three variants of one graph: avx2, this CPU's and one above everything (AMX, or on an AMX host the
  // same ISA as this CPU's: the chooser takes the first of equals). The plain weights are stored once; the
  // loader takes this CPU's variant, a chooser can take any.
  Graph g = optimised("gpt_decoder");
  const lower::IsaInfo here = lower::effective_isa();
  artifact::Info native = lower::artifact_info(g, "gpt_decoder", "default", 1);
  artifact::Info portable = lower::artifact_info(g, "gpt_decoder", "default", 1, lower::isa_info(lower::CpuIsa::Avx2));
  artifact::Info above = lower::artifact_info(g, "gpt_decoder", "default", 1, lower::isa_info(lower::CpuIsa::Avx512CoreAmx));
  above.unpacked = "compiled on a CPU without avx512_core_amx";
  const std::string one = tmp_path("one_variant.ondine"), three = tmp_path("three_variants.ondine");
  artifact::write(g, native, one);
  artifact::write_variants({{&g, portable, {}, {}}, {&g, native, {}, {}}, {&g, above, {}, {}}}, three);
  const artifact::Artifact single = artifact::read(one);
  artifact::Artifact a = lower::load_artifact(three);
  CHECK(a.info.weight_bytes == single.info.weight_bytes);  // equal weights once
  REQUIRE(a.variants.size() == 3);
  CHECK(a.variants[0].isa == "avx2");
  CHECK(a.variants[2].unpacked == above.unpacked);
  CHECK(a.info.isa == here.name);
  CHECK(a.graph.to_text() == g.to_text());
  const artifact::Artifact first = artifact::read(three, [](const std::vector<artifact::Info>&) { return std::size_t{0}; });
  CHECK(first.info.isa == "avx2");

  // Variants must agree on the inputs and outputs.
  Graph other = optimised("gated_encoder");
  CHECK_THROWS_WITH(artifact::write_variants({{&g, native, {}, {}}, {&other, portable, {}, {}}}, three),
                    Catch::Contains("other inputs or outputs"));

  // combine(): every variant of each file, weights once.
  const std::string portable_only = tmp_path("portable_only.ondine"), combined = tmp_path("combined.ondine");
  artifact::write(g, portable, portable_only);
  artifact::combine({one, portable_only}, combined);
  const artifact::Artifact c = lower::load_artifact(combined);
  CHECK(c.variants.size() == 2);
  CHECK(c.info.weight_bytes == single.info.weight_bytes);
  CHECK(c.info.isa == here.name);

  // Each variant checks the weight bytes it reads: damage in one variant's packed weights refuses that
  // variant and leaves the other one loadable.
  const std::string packed = tmp_path("packed_native.ondine"), pair = tmp_path("pair.ondine");
  lower::save_artifact(g, packed, native);
  REQUIRE(!artifact::read(packed).packings.empty());
  artifact::combine({packed, portable_only}, pair);  // the native variant's packings are the section's end
  std::vector<unsigned char> bytes = read_bytes(pair);
  bytes[bytes.size() - 1] ^= 0x01;
  write_bytes(pair, bytes);
  auto pick = [](std::size_t i) { return [i](const std::vector<artifact::Info>&) { return i; }; };
  CHECK_NOTHROW(artifact::read(pair, pick(1)));
  CHECK_THROWS_WITH(artifact::read(pair, pick(0)),
                    Catch::Contains("checksum of the weights of its variant for " + native.isa));

  // No variant for this CPU: refused, naming what it has and what the CPU has.
  if (!here.amx) {
    const std::string amx_only = tmp_path("amx_only.ondine");
    artifact::write(g, above, amx_only);
    CHECK_THROWS_WITH(lower::load_artifact(amx_only), Catch::Contains("no variant this CPU runs") &&
                                                          Catch::Contains("avx512_core_amx") &&
                                                          Catch::Contains(here.name));
  }
}

TEST_CASE("artifact: the generated header sanitises ONNX names without collisions and compiles", "[artifact][aot]") {
  // Names as exporters write them: dots, colons, leading digits, C++ keywords, and names that become the same
  // identifier ("input.1" and "input_1"; "y.0" and "y:0"; "x" whose accessor type x_t is another input's name).
  Graph g;
  const Shape s{Dim::named("batch"), 3};
  Value* in1 = g.add_input("input.1", DType::Float32, s);
  Value* in1b = g.add_input("input_1", DType::Float32, s);
  Value* num = g.add_input("4160", DType::Float32, s);
  Value* kw = g.add_input("class", DType::Float32, s);
  Value* x = g.add_input("x", DType::Float32, s);
  Value* xt = g.add_input("x_t", DType::Int64, Shape{2});
  g.add_output(g.add_node("Add", {in1, in1b}, {"y.0"})->output(0));
  g.add_output(g.add_node("Mul", {num, kw}, {"y:0"})->output(0));
  g.add_output(g.add_node("Relu", {x}, {"Outputs"})->output(0));
  g.add_output(g.add_node("Identity", {xt}, {"result_"})->output(0));
  infer_shapes(g);
  const std::string path = tmp_path("odd_names.ondine");
  artifact::write(g, {}, path);
  artifact::Artifact a = artifact::read(path);
  const std::string header = cli::generate_header(a.graph, a.info, "odd model", path, false);
  INFO(header);
  CHECK_THAT(header, Catch::Contains("class odd_model {"));
  CHECK_THAT(header, Catch::Contains("using input_1_t = ondine::TypedTensor<float, 2>;"));
  CHECK_THAT(header, Catch::Contains("static input_1_t make_input_1(std::int64_t batch)"));
  CHECK_THAT(header, Catch::Contains("static input_1_2_t make_input_1_2(std::int64_t batch)"));
  CHECK_THAT(header, Catch::Contains("make_v_4160(std::int64_t batch)"));
  CHECK_THAT(header, Catch::Contains("make_class_(std::int64_t batch)"));
  CHECK_THAT(header, Catch::Contains("using x_t_2 = ondine::TypedTensor<float, 2>;"));  // x_t is an input's
  CHECK_THAT(header, Catch::Contains("static x_t_t make_x_t()"));
  CHECK_THAT(header, Catch::Contains("ondine::TypedTensor<float, 2> y_0;"));
  CHECK_THAT(header, Catch::Contains("ondine::TypedTensor<float, 2> y_0_2;"));
  CHECK_THAT(header, Catch::Contains("ondine::TypedTensor<float, 2> Outputs_;"));
  CHECK_THAT(header, Catch::Contains("ondine::TypedTensor<std::int64_t, 1> result__;"));
  // The header is light: the runtime is in its source, which defines what the header declares.
  CHECK_THAT(header, !Catch::Contains("ondine/runtime.hpp"));
  const std::string source = cli::generate_source(a.graph, "odd model", path, false);
  INFO(source);
  CHECK_THAT(source, Catch::Contains("#include <ondine/runtime.hpp>"));
  CHECK_THAT(source, Catch::Contains("odd_model::Outputs odd_model::run(const odd_model::input_1_t& input_1"));
  // The header, its source and a use of it compile (syntax and types; the aot example links and runs one).
  std::ofstream(tmp_path("odd_model.hpp")) << header;
  std::ofstream(tmp_path("odd_model.cpp")) << source;
  std::ofstream(tmp_path("odd_model_use.cpp"))
      << "#include \"odd_model.hpp\"\n"
         "int main() {\n"
         "  odd_model m;\n"
         "  odd_model::input_1_t a = odd_model::make_input_1(2);\n"
         "  a(1, 2) = 1.0f;\n"
         "  odd_model::Outputs o = m.run(a, odd_model::make_input_1_2(2), odd_model::make_v_4160(2),\n"
         "                               odd_model::make_class_(2), odd_model::make_x(2), odd_model::make_x_t());\n"
         "  float f = o.y_0(1, 2) + o.y_0_2.at(0, 0) + o.Outputs_(0, 0);\n"
         "  std::int64_t i = o.result__(1);\n"
         "  return static_cast<int>(f) + static_cast<int>(i);\n"
         "}\n";
  const std::string log = tmp_path("odd_model_use.log");
  const std::string command = "c++ -std=c++17 -fsyntax-only -I" + std::string(ONDINE_TEST_DATA_DIR) +
                              "/../../include " + tmp_path("odd_model_use.cpp") + " " + tmp_path("odd_model.cpp") +
                              " >" + log + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream in(log);
  INFO(std::string(std::istreambuf_iterator<char>(in), {}));
  CHECK(rc == 0);
}

}  // namespace test_artifact
