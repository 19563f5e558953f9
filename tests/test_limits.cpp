// Limits checked before allocating (ir/limits.hpp), external data kept inside the model's folder, and
// error messages that quote names from a file escaped: each a clear ondine::Error naming the file, and
// the node and op where there is one. The malformed models are built as protobuf messages in code.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "ondine/onnx/import.hpp"
#include "onnx_builders.hpp"
#include "ondine/reference/executor.hpp"

namespace test_limits {

using namespace ondine;
namespace fs = std::filesystem;
namespace ox = ondine::onnx;
using Catch::Contains;
using TP = ::onnx::TensorProto;

using test::add_node;
using test::add_value_info;
using test::error_of;
using test::write_file;

namespace {

// The words of a size error: shape inference's own checks say "too large", the Limits check "over the limit".
bool too_large(const std::string& msg) {
  return msg.find("too large") != std::string::npos || msg.find("over the limit") != std::string::npos;
}

std::string tmp_dir(const std::string& sub = "") {
  fs::path dir = fs::path(ONDINE_TEST_TMP_DIR) / "limits" / sub;
  fs::create_directories(dir);
  return dir.string();
}

void add_int64_initializer(::onnx::GraphProto* g, const std::string& name, const std::vector<std::int64_t>& values,
                           bool scalar = false) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(TP::INT64);
  if (!scalar) t->add_dims(static_cast<std::int64_t>(values.size()));
  for (auto v : values) t->add_int64_data(v);
}

// A model with an empty graph at opset 13; the tests add what they need.
::onnx::ModelProto empty_model() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  m.mutable_graph()->set_name("g");
  return m;
}

// x[2,3] -> Relu (node "relu1") -> y
::onnx::ModelProto relu_model() {
  ::onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  add_value_info(g->add_input(), "x", TP::FLOAT, {2, 3});
  add_node(g, "Relu", {"x"}, {"y"}, "relu1");
  add_value_info(g->add_output(), "y", TP::FLOAT, {2, 3});
  return m;
}

std::string save(const ::onnx::ModelProto& m, const std::string& name, const std::string& dir = tmp_dir()) {
  std::string path = (fs::path(dir) / name).string();
  write_file(path, m.SerializeAsString());
  return path;
}

// shape (int64 initializer) -> ConstantOfShape (node "cos") -> y
::onnx::ModelProto constant_of_shape_model(const std::vector<std::int64_t>& shape) {
  ::onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  add_int64_initializer(g, "shape", shape);
  add_node(g, "ConstantOfShape", {"shape"}, {"y"}, "cos");
  add_value_info(g->add_output(), "y", TP::FLOAT, {});
  g->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  return m;
}

}  // namespace

TEST_CASE("tensors past the memory limit or overflowing int64 fail before allocating", "[limits]") {
  CHECK(limits().max_tensor_bytes == Limits::physical_memory_bytes());
  CHECK(Limits::physical_memory_bytes() > (std::uint64_t{1} << 20));
  const std::int64_t big = std::int64_t{1} << 40;
  CHECK_THAT(error_of([&] { Tensor(DType::Float32, {big, big}); }), Contains("overflows int64"));
  // A zero dim makes the tensor empty, but strides over the other dims would still overflow.
  CHECK_THAT(error_of([&] { Tensor(DType::Float32, {0, big, big}); }), Contains("overflows int64"));
  CHECK_NOTHROW(Tensor(DType::Float32, {0, big}));
  CHECK_THAT(error_of([&] { Tensor(DType::Float32, {big, 1024}); }), Contains("ondine::Limits"));
  Limits small;
  small.max_tensor_bytes = 1 << 20;
  ScopedLimits scoped(small);
  CHECK_NOTHROW(Tensor(DType::Float32, {256, 1024}));
  auto msg = error_of([&] { Tensor(DType::Float32, {257, 1024}); });
  CHECK_THAT(msg, Contains("[257,1024] needs 1052672 bytes, over the limit of 1048576 bytes per tensor"));
}

TEST_CASE("a model file over the size limit is refused before it is read", "[limits]") {
  std::string p = save(relu_model(), "relu.onnx");
  CHECK_NOTHROW(ox::load_model(p));
  Limits small;
  small.max_model_bytes = 16;
  ScopedLimits scoped(small);
  auto msg = error_of([&] { ox::load_model(p); });
  CHECK_THAT(msg, Contains(p));
  CHECK_THAT(msg, Contains("over the limit of 16 bytes (ondine::Limits::max_model_bytes)"));
  std::string bytes = relu_model().SerializeAsString();
  CHECK_THAT(error_of([&] { ox::load_model_from_memory(bytes.data(), bytes.size(), ".", "buf"); }),
             Contains("buf: file is"));
}

TEST_CASE("initializers past the memory limit or short of data name the tensor and the file", "[limits]") {
  ::onnx::ModelProto m = relu_model();
  auto* w = m.mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(TP::FLOAT);
  w->add_dims(1 << 20);
  SECTION("bigger than the memory limit") {
    Limits small;
    small.max_tensor_bytes = 1 << 20;
    ScopedLimits scoped(small);
    std::string p = save(m, "big_init.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("tensor 'w'"));
    CHECK_THAT(msg, Contains("over the limit of 1048576 bytes"));
  }
  SECTION("raw_data shorter than its dims say") {
    w->set_raw_data(std::string(100, '\0'));
    std::string p = save(m, "short_raw.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("tensor 'w': raw_data has 100 bytes"));
    CHECK_THAT(msg, Contains("needs 4194304"));
  }
  SECTION("a Constant node's raw_data names the node") {
    m.mutable_graph()->clear_initializer();
    auto* c = add_node(m.mutable_graph(), "Constant", {}, {"k"}, "konst");
    auto* a = c->add_attribute();
    a->set_name("value");
    a->set_type(::onnx::AttributeProto::TENSOR);
    a->mutable_t()->set_data_type(TP::FLOAT);
    a->mutable_t()->add_dims(1000);
    a->mutable_t()->set_raw_data(std::string(12, '\0'));
    std::string p = save(m, "short_const.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("node 'konst' (Constant)"));
    CHECK_THAT(msg, Contains("raw_data has 12 bytes"));
  }
}

TEST_CASE("ops producing huge outputs fail at shape inference naming the node", "[limits]") {
  SECTION("a 2^60-element ConstantOfShape") {
    std::string p = save(constant_of_shape_model({std::int64_t{1} << 30, std::int64_t{1} << 30}), "cos_huge.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("node 'cos' (ConstantOfShape)"));
    CHECK(too_large(msg));
    // Without import-time inference, it fails the same way when inferred later.
    Graph g = ox::load_model(p, {false});
    CHECK_THAT(error_of([&] { infer_shapes(g); }), Contains("node 'cos' (ConstantOfShape)"));
  }
  SECTION("a ConstantOfShape past a lowered memory limit") {
    std::string p = save(constant_of_shape_model({1024, 1024}), "cos_4mb.onnx");
    CHECK_NOTHROW(ox::load_model(p));
    Limits small;
    small.max_tensor_bytes = 1 << 20;
    ScopedLimits scoped(small);
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("node 'cos' (ConstantOfShape): output 'y': shape [1024,1024] needs 4194304 bytes"));
    CHECK_THAT(msg, Contains("ondine::Limits"));
  }
  SECTION("a ConstantOfShape whose product overflows int64") {
    std::string p = save(constant_of_shape_model({std::int64_t{1} << 40, std::int64_t{1} << 40, 0}), "cos_ovf.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains("node 'cos' (ConstantOfShape)"));
    CHECK(too_large(msg));
  }
  SECTION("a ConstantOfShape whose shape is only known at run time") {
    ::onnx::ModelProto m = empty_model();
    auto* g = m.mutable_graph();
    add_value_info(g->add_input(), "shape", TP::INT64, {2});
    add_node(g, "ConstantOfShape", {"shape"}, {"y"}, "cos");
    add_value_info(g->add_output(), "y", TP::FLOAT, {});
    g->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
    Graph gr = ox::load_model(save(m, "cos_runtime.onnx"));
    ReferenceExecutor ex(gr);
    auto shape = Tensor::from_vector<std::int64_t>({2}, {std::int64_t{1} << 30, std::int64_t{1} << 30});
    auto msg = error_of([&] { ex.run({{"shape", shape}}); });
    CHECK(too_large(msg));
    CHECK_THAT(msg, Contains("node 'cos' (ConstantOfShape)"));
  }
  SECTION("Expand, Tile and Range") {
    ::onnx::ModelProto m = empty_model();
    auto* g = m.mutable_graph();
    add_value_info(g->add_input(), "x", TP::FLOAT, {1, 1});
    const std::int64_t big = std::int64_t{1} << 31;
    add_int64_initializer(g, "target", {big, big});
    add_node(g, "Expand", {"x", "target"}, {"e"}, "expand1");
    add_value_info(g->add_output(), "e", TP::FLOAT, {});
    CHECK_THAT(error_of([&] { ox::load_model(save(m, "expand.onnx")); }), Contains("node 'expand1' (Expand)"));
    g->clear_node();
    g->clear_output();
    add_int64_initializer(g, "reps", {big, big});
    add_node(g, "Tile", {"x", "reps"}, {"t"}, "tile1");
    add_value_info(g->add_output(), "t", TP::FLOAT, {});
    CHECK_THAT(error_of([&] { ox::load_model(save(m, "tile.onnx")); }), Contains("node 'tile1' (Tile)"));
    g->clear_node();
    g->clear_output();
    add_int64_initializer(g, "start", {0}, true);
    add_int64_initializer(g, "limit", {std::int64_t{1} << 62}, true);
    add_int64_initializer(g, "delta", {1}, true);
    add_node(g, "Range", {"start", "limit", "delta"}, {"r"}, "range1");
    add_value_info(g->add_output(), "r", TP::INT64, {});
    std::string p = save(m, "range.onnx");
    Graph gr = ox::load_model(p, {false});
    // Range's length is known at inference when its inputs are constants; if not, at run time.
    std::string msg;
    try {
      infer_shapes(gr);
      msg = error_of([&] { ReferenceExecutor(gr).run({{"x", Tensor(DType::Float32, {1, 1})}}); });
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Contains("node 'range1' (Range)"));
    CHECK((too_large(msg) || msg.find("would produce") != std::string::npos));
  }
}

TEST_CASE("a graph cycle and deep subgraph nesting are errors naming the node", "[limits]") {
  SECTION("a cycle") {
    ::onnx::ModelProto m = relu_model();
    add_node(m.mutable_graph(), "Add", {"y", "b"}, {"a"}, "cyc_a");
    add_node(m.mutable_graph(), "Neg", {"a"}, {"b"}, "cyc_b");
    std::string p = save(m, "cycle.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("cycle"));
  }
  SECTION("If inside If, 20 deep") {
    ::onnx::ModelProto m = empty_model();
    auto* g = m.mutable_graph();
    add_value_info(g->add_input(), "c", TP::BOOL, {});
    ::onnx::GraphProto* cur = g;
    for (int depth = 0; depth < 20; ++depth) {
      std::string out = "o" + std::to_string(depth);
      auto* n = add_node(cur, "If", {"c"}, {out}, "if" + std::to_string(depth));
      add_value_info(cur->add_output(), out, TP::FLOAT, {1});
      ::onnx::GraphProto* next = nullptr;
      for (const char* branch : {"then_branch", "else_branch"}) {
        auto* a = n->add_attribute();
        a->set_name(branch);
        a->set_type(::onnx::AttributeProto::GRAPH);
        if (!next) {
          next = a->mutable_g();
        } else {  // the else branch: a constant
          auto* c = add_node(a->mutable_g(), "Constant", {}, {"e" + std::to_string(depth)}, "");
          auto* v = c->add_attribute();
          v->set_name("value_floats");
          v->set_type(::onnx::AttributeProto::FLOATS);
          v->add_floats(1);
          add_value_info(a->mutable_g()->add_output(), "e" + std::to_string(depth), TP::FLOAT, {1});
        }
      }
      cur = next;
    }
    auto* c = add_node(cur, "Constant", {}, {"leaf"}, "leaf");
    auto* v = c->add_attribute();
    v->set_name("value_floats");
    v->set_type(::onnx::AttributeProto::FLOATS);
    v->add_floats(1);
    add_value_info(cur->add_output(), "leaf", TP::FLOAT, {1});
    std::string p = save(m, "deep_if.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("nest more than 16 deep (ondine::Limits::max_subgraph_depth)"));
    CHECK_THAT(msg, Contains("(If)"));
    Limits deep;
    deep.max_subgraph_depth = 32;
    ScopedLimits scoped(deep);
    CHECK_NOTHROW(ox::load_model(p));
  }
}

TEST_CASE("an attribute of the wrong type names the node the op and both kinds", "[limits]") {
  ::onnx::ModelProto m = empty_model();
  auto* g = m.mutable_graph();
  add_value_info(g->add_input(), "x", TP::FLOAT, {2, 3});
  auto* n = add_node(g, "Transpose", {"x"}, {"y"}, "tr");
  auto* a = n->add_attribute();
  a->set_name("perm");
  a->set_type(::onnx::AttributeProto::STRING);
  a->set_s("1,0");
  add_value_info(g->add_output(), "y", TP::FLOAT, {3, 2});
  std::string p = save(m, "wrong_kind.onnx");
  auto msg = error_of([&] { ox::load_model(p); });
  CHECK_THAT(msg, Contains(p));
  CHECK_THAT(msg, Contains("node 'tr' (Transpose)"));
  CHECK_THAT(msg, Contains("attribute 'perm' has the wrong kind: STRING, expected INTS"));
}

TEST_CASE("external data stays inside the model's folder", "[limits][external]") {
  const std::string dir = tmp_dir("ext_model");
  const std::string outside = tmp_dir("ext_outside");
  std::string payload(16, '\x01');
  write_file((fs::path(outside) / "secret.bin").string(), payload);
  write_file((fs::path(dir) / "inside.bin").string(), payload);
  auto model = [&](const std::string& location, std::uint64_t offset, std::uint64_t length) {
    ::onnx::ModelProto m = empty_model();
    auto* g = m.mutable_graph();
    add_value_info(g->add_input(), "x", TP::UINT8, {4});
    auto* t = g->add_initializer();
    t->set_name("w");
    t->set_data_type(TP::UINT8);
    t->add_dims(static_cast<std::int64_t>(length));
    t->set_data_location(TP::EXTERNAL);
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", location},
                        {"offset", std::to_string(offset)}, {"length", std::to_string(length)}}) {
      auto* e = t->add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    add_node(g, "Identity", {"w"}, {"y"}, "id");
    add_value_info(g->add_output(), "y", TP::UINT8, {static_cast<std::int64_t>(length)});
    return save(m, "ext.onnx", dir);
  };
  SECTION("a file inside, and a symlink to one inside, load") {
    CHECK(ox::load_model(model("inside.bin", 4, 12)).find_value("w")->constant().numel() == 12);
    fs::remove(fs::path(dir) / "link_in.bin");
    fs::create_symlink("inside.bin", fs::path(dir) / "link_in.bin");
    CHECK_NOTHROW(ox::load_model(model("link_in.bin", 0, 16)));
  }
  SECTION("a symlink resolving outside is refused") {
    fs::remove(fs::path(dir) / "link_out.bin");
    fs::create_symlink(fs::path(outside) / "secret.bin", fs::path(dir) / "link_out.bin");
    std::string p = model("link_out.bin", 0, 16);
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("tensor 'w'"));
    CHECK_THAT(msg, Contains("'link_out.bin' resolves (through a symbolic link) to a file outside"));
    // A symlinked folder leading out is refused the same way.
    fs::remove(fs::path(dir) / "sub");
    fs::create_directory_symlink(outside, fs::path(dir) / "sub");
    CHECK_THAT(error_of([&] { ox::load_model(model("sub/secret.bin", 0, 16)); }), Contains("outside"));
  }
  SECTION("offset plus length past the end is refused") {
    for (auto [offset, length] : {std::pair<std::uint64_t, std::uint64_t>{0, 17}, {8, 9}, {17, 0}, {std::uint64_t{1} << 62, 8}}) {
      std::string p = model("inside.bin", offset, length);
      auto msg = error_of([&] { ox::load_model(p); });
      CHECK_THAT(msg, Contains(p));
      CHECK_THAT(msg, Contains("tensor 'w'"));
      CHECK_THAT(msg, Contains("beyond the end"));
    }
  }
  SECTION("a missing file is named") {
    std::string p = model("nothere.bin", 0, 4);
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains(p));
    CHECK_THAT(msg, Contains("nothere.bin"));
    CHECK_THAT(msg, Contains("missing"));
  }
  SECTION("a location with a NUL byte is refused") {
    std::string p = model(std::string("inside.bin\0/../x", 16), 0, 4);
    CHECK_THAT(error_of([&] { ox::load_model(p); }), Contains("not a relative path inside"));
  }
}

TEST_CASE("names from a file are escaped in error messages", "[limits][errors]") {
  SECTION("escape_text") {
    CHECK(detail::escape_text("plain name") == "plain name");
    CHECK(detail::escape_text("h\xc3\xa9llo \xe2\x82\xac") == "h\xc3\xa9llo \xe2\x82\xac");  // UTF-8 kept
    CHECK(detail::escape_text(std::string("a\xff\x1b[31mb\n\0c", 11)) == "a\\xff\\x1b[31mb\\x0a\\x00c");
    CHECK(detail::escape_text("\xc3") == "\\xc3");               // truncated sequence
    CHECK(detail::escape_text("\xc0\xaf") == "\\xc0\\xaf");      // overlong '/'
    CHECK(detail::escape_text("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate
    std::string once = detail::escape_text("x\x01y\xfe");
    CHECK(detail::escape_text(once) == once);
  }
  SECTION("a node name with raw bytes") {
    ::onnx::ModelProto m = relu_model();
    add_node(m.mutable_graph(), "Add", {"y", "nothing\x07"}, {"z"}, "bad\xff\x1b[2Jname\n");
    std::string p = save(m, "raw_names.onnx");
    auto msg = error_of([&] { ox::load_model(p); });
    CHECK_THAT(msg, Contains("node 'bad\\xff\\x1b[2Jname\\x0a' (Add)"));
    CHECK_THAT(msg, Contains("'nothing\\x07'"));
    for (char c : msg) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));
  }
}

}  // namespace test_limits
