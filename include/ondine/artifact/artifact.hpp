// SPDX-License-Identifier: Apache-2.0
// ondine/artifact/artifact.hpp - the `.ondine` compiled-model file: written once by `ondine compile -o
// MODEL.ondine`, loaded without ONNX, protobuf or the pass pipeline (lower/artifact.hpp compiles it).
//
//   artifact::Info info;  info.source = "model.onnx"; ...
//   artifact::write(optimised_graph, info, "model.ondine");
//   artifact::Artifact a = artifact::read("model.ondine");   // a.graph, a.info; weights mapped, not copied
//   artifact::combine({"avx2.ondine", "native.ondine"}, "model.ondine");   // one file, two variants
//
// File layout (all integers little-endian):
//   [0, 64)            header: magic "ONDINEAF", u32 format version, u32 header size (64), then u64 pairs
//                      (offset, bytes) of the schema part and of the weight section, the XXH3-64 of the
//                      schema part, and 0 (each variant holds a hash of the weight bytes it reads)
//   [schema part]      a FlatBuffer of artifact/schema.fbs, 64-aligned: the signature and one or more
//                      variants, each a target (ISA, precision, threads) with its graph and packings
//   [weight section]   every constant tensor's bytes (weights, tensor attributes) and packed weight, each
//                      64-byte aligned and zero-padded to 64; equal bytes are stored once (variants share
//                      their weights)
// Reading maps the file (two processes running one artifact share its weight pages) and checks, before any
// byte is used: the magic, the format version (another one is refused, naming both), every offset and
// length against the file size, the schema part's checksum, the FlatBuffers verifier over the schema part (depth and
// table limits), every enum value, and every tensor's offset, length and dims against the weight section
// (the verifier does not know about it). Then a chooser (lower/artifact.hpp: the best variant this CPU
// runs) picks a variant, its graph is rebuilt and verified like an imported one, and the checksum of the
// weight bytes it reads is checked (so loading hashes one variant's packed weights, not every variant's),
// before read() returns or (WeightCheck::Background) while the caller compiles, until wait_checked().
// Every failure is an ondine::Error naming the file and what is wrong.
//
// What is stored: the graph after the pass pipeline (its layout decisions included) and the weights as
// oneDNN packed them (opaque descriptors here; lower/artifact.hpp makes and uses them), not oneDNN's
// primitives: oneDNN 2.6 cannot save a CPU primitive, so loading re-creates them.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <flatbuffers/flatbuffers.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ondine/artifact/detail/schema_generated.hpp"
#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"

namespace ondine::artifact {

inline constexpr char kMagic[8] = {'O', 'N', 'D', 'I', 'N', 'E', 'A', 'F'};
inline constexpr std::uint32_t kFormatVersion = 3;  // 2: variants; 3: weights hashed by pieces
inline constexpr std::size_t kHeaderBytes = 64;
inline constexpr std::size_t kAlignment = 64;

// What the artifact says about itself and one variant (the header's version, the schema's Model table and
// a Variant's Target).
struct Info {
  std::uint32_t format_version = kFormatVersion;
  std::string ondine_version, onednn_version, source;
  std::string isa, precision = "fp32", passes;  // the variant's target
  int threads = 0;
  bool requires_vnni = false;  // int8 layers with 8-bit weights: refused on CPUs without VNNI
  std::string unpacked;        // why the variant stores no packed weights ("" when it does)
  std::vector<std::string> keep_fp32;  // precision bf16: the nodes (names, globs) that stay float32
  std::string tuned;  // the tuner's kernel choices, applied at load ("conv_layout=any,conv_algorithm=direct")
  std::size_t packings = 0;                        // filled by read(): the variant's packed weights
  std::uint64_t file_bytes = 0, weight_bytes = 0;  // filled by read()
};

// A weight as oneDNN packed it when the model was compiled (schema.fbs, table Packing). The descriptor is
// opaque here (lower/artifact.hpp reads it); `source` is the constant it was packed from (in the graph being
// written, or in the mapped file when read), null for a source the lowering derived, known by its hashes.
struct Packing {
  const void* source = nullptr;
  std::size_t source_bytes = 0;
  std::uint64_t source_layout = 0;
  std::uint64_t hash = 0, check = 0;
  std::string md;
  const void* data = nullptr;
  std::size_t bytes = 0;
};

class PendingWeightCheck;

// An artifact as read: every variant's Info, and the graph and packings of the one chosen.
struct Artifact {
  Graph graph;
  Info info;                                           // the chosen variant's
  std::vector<Packing> packings;                       // data and sources point into the mapping
  std::map<std::string, std::int64_t> packing_dims;  // the symbolic dims' sizes the packings were made for
  std::shared_ptr<void> mapping;                       // the mapped file (weights and packings point into it)
  std::vector<Info> variants;                          // every variant, in file order
  std::size_t variant = 0;                             // the chosen one's index
  // WeightCheck::Background: the checksum of the chosen variant's weights, computed while the caller
  // compiles. wait_checked() helps finish it and throws the damaged-file error; call it before the first run.
  std::shared_ptr<PendingWeightCheck> weights_checked;
  void wait_checked();
};

// When read() checks the weights' checksum: before it returns, or on a thread of its own while the caller
// compiles the graph (loading an artifact is mostly that hash; compiling, oneDNN's JIT).
enum class WeightCheck { Now, Background };

// Picks the variant to read from all of them (an index into the list); may throw an Error saying why none
// fits. read() without one takes the first.
using VariantChooser = std::function<std::size_t(const std::vector<Info>&)>;

// One variant to write: its optimised graph, its target (`info`: isa, precision, threads, passes,
// requires_vnni, unpacked; the first variant's versions and source stand for the file), its packings.
struct VariantData {
  const Graph* graph = nullptr;
  Info info;
  std::vector<Packing> packings;
  std::map<std::string, std::int64_t> packing_dims;
};

namespace detail {

namespace fb = ::ondine::artifact::fb;

inline std::size_t align_up(std::size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

inline void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// One range of the hashed stream: `bytes` bytes at `data`, or zeros where `data` is null.
struct HashSegment {
  const unsigned char* data;
  std::size_t bytes;
};
inline constexpr std::size_t kHashPiece = std::size_t{1} << 20;

// Variant.data_hash (schema.fbs) of the stream the segments make: cut into pieces of kHashPiece bytes, each
// hashed with XXH3-64 on its own, then the XXH3-64 of the pieces' hashes as little-endian u64s. Why pieces:
// any number of threads hash them at once (take pieces until none is left), and loading an artifact is
// mostly this hash.
class PiecewiseHash {
 public:
  explicit PiecewiseHash(std::vector<HashSegment> segments) : segments_(std::move(segments)), starts_(segments_.size() + 1, 0) {
    for (std::size_t i = 0; i < segments_.size(); ++i) starts_[i + 1] = starts_[i] + segments_[i].bytes;
    pieces_ = (starts_.back() + kHashPiece - 1) / kHashPiece;
    hashes_.assign(pieces_ * 8, 0);
  }
  // Hashes pieces not yet taken until none is left; any number of threads may call it at once.
  void work() {
    for (std::size_t i; (i = next_.fetch_add(1)) < pieces_;) put_u64(hashes_.data() + i * 8, piece(i));
  }
  std::size_t pieces() const { return pieces_; }
  void abandon() { next_.store(pieces_); }  // threads stop after their current piece
  // The hash; every piece must be done (work() on the calling threads, then joined).
  std::uint64_t result() const { return XXH3_64bits(hashes_.data(), hashes_.size()); }

 private:
  std::uint64_t piece(std::size_t i) const {
    static const unsigned char zeros[256] = {};
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    const std::size_t total = starts_.back();
    std::size_t at = i * kHashPiece;
    const std::size_t end = std::min(total, at + kHashPiece);
    auto s = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin()) - 1;
    for (; at < end; ++s) {
      const std::size_t from = at - starts_[s], take = std::min(segments_[s].bytes - from, end - at);
      if (segments_[s].data) {
        XXH3_64bits_update(&state, segments_[s].data + from, take);
      } else {
        for (std::size_t k = 0; k < take; k += sizeof zeros) XXH3_64bits_update(&state, zeros, std::min(sizeof zeros, take - k));
      }
      at += take;
    }
    return XXH3_64bits_digest(&state);
  }

  std::vector<HashSegment> segments_;
  std::vector<std::size_t> starts_;
  std::size_t pieces_ = 0;
  std::vector<unsigned char> hashes_;
  std::atomic<std::size_t> next_{0};
};

// The hash on the OpenMP team.
inline std::uint64_t piecewise_hash(std::vector<HashSegment> segments) {
  PiecewiseHash h(std::move(segments));
#pragma omp parallel if (h.pieces() > 1)
  h.work();
  return h.result();
}
inline std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// --- writing ---------------------------------------------------------------------------------------

class Writer {
 public:
  flatbuffers::FlatBufferBuilder fbb{1 << 16};
  std::vector<std::pair<const void*, std::size_t>> chunks;  // weight section pieces, each at an aligned offset
  std::vector<std::size_t> chunk_offsets;
  std::size_t weight_bytes = 0;

  // The offset of `bytes` bytes at `data` in the weight section: where the same bytes already are (a
  // tensor shared by several values, or equal weights of two variants), else appended.
  std::size_t place(const void* data, std::size_t bytes) {
    std::size_t offset = place_once(data, bytes);
    if (bytes) used_.emplace(offset, bytes);
    return offset;
  }

  // The hash of the weight bytes placed since the last call (data_hash of schema.fbs: each range padded
  // to 64 bytes, in offset order, each once), read from where they come from.
  std::uint64_t take_data_hash() {
    std::vector<HashSegment> segments;
    std::size_t done = 0;  // the end of what was hashed (ranges may overlap: equal bytes stored once)
    for (const auto& [offset, bytes] : used_) {
      const std::size_t end = align_up(offset + bytes);
      if (end <= done) continue;
      const std::size_t from = std::max(offset, done);
      const auto chunk = chunk_at_.at(offset);
      segments.push_back({static_cast<const unsigned char*>(chunk) + (from - offset), offset + bytes - from});
      segments.push_back({nullptr, end - (offset + bytes)});
      done = end;
    }
    used_.clear();
    return piecewise_hash(segments);
  }

  flatbuffers::Offset<fb::TensorData> tensor(const Tensor& t, const std::string& what) {
    if (t.dtype() == DType::String || t.dtype() == DType::Undefined)
      throw Error(what + " is a " + std::string(dtype_name(t.dtype())) + " tensor, which artifacts do not store");
    const std::size_t bytes = t.nbytes();
    const std::size_t offset = place(t.raw(), bytes);
    constants_[std::make_pair(t.raw(), bytes)] = offset;
    auto dims = fbb.CreateVector(t.dims());
    return fb::CreateTensorData(fbb, static_cast<fb::DType>(t.dtype()), dims, offset, bytes);
  }

  flatbuffers::Offset<fb::Shape> shape(const Shape& s) {
    std::vector<flatbuffers::Offset<fb::Dim>> dims;
    if (s.rank_known())
      for (std::size_t i = 0; i < s.rank(); ++i) {
        const Dim& d = s[i];
        dims.push_back(fb::CreateDim(fbb, d.is_static() ? d.value : -1, d.symbol.empty() ? 0 : fbb.CreateString(d.symbol)));
      }
    return fb::CreateShape(fbb, s.rank_known(), fbb.CreateVector(dims));
  }

  static_assert(static_cast<int>(fb::ValueKind::OptionalSequence) == static_cast<int>(ValueKind::OptionalSequence),
                "schema.fbs's ValueKind must list ir/graph.hpp's ValueKind in the same order");
  flatbuffers::Offset<fb::Value> value(const Value& v) {
    auto name = fbb.CreateString(v.name());
    auto sh = shape(v.shape());
    flatbuffers::Offset<fb::TensorData> data;
    if (v.is_constant()) data = tensor(v.constant(), "constant '" + v.name() + "'");
    return fb::CreateValue(fbb, name, static_cast<fb::ValueKind>(v.kind()), static_cast<fb::DType>(v.dtype()), sh,
                           static_cast<fb::Layout>(v.layout()), data);
  }

  flatbuffers::Offset<fb::Attribute> attribute(const std::string& name, const Attribute& a, const Node& n) {
    auto key = fbb.CreateString(name);
    if (auto* v = std::get_if<std::int64_t>(&a)) return fb::CreateAttribute(fbb, key, fb::AttrKind::Int, *v);
    if (auto* v = std::get_if<float>(&a)) return fb::CreateAttribute(fbb, key, fb::AttrKind::Float, 0, *v);
    if (auto* v = std::get_if<std::string>(&a))
      return fb::CreateAttribute(fbb, key, fb::AttrKind::String, 0, 0, fbb.CreateString(*v));
    if (auto* v = std::get_if<Tensor>(&a)) {
      auto t = tensor(*v, "attribute '" + name + "' of node '" + n.name() + "'");
      return fb::CreateAttribute(fbb, key, fb::AttrKind::Tensor, 0, 0, 0, t);
    }
    if (auto* v = std::get_if<std::vector<std::int64_t>>(&a))
      return fb::CreateAttribute(fbb, key, fb::AttrKind::Ints, 0, 0, 0, 0, fbb.CreateVector(*v));
    if (auto* v = std::get_if<std::vector<float>>(&a))
      return fb::CreateAttribute(fbb, key, fb::AttrKind::Floats, 0, 0, 0, 0, 0, fbb.CreateVector(*v));
    if (auto* v = std::get_if<std::vector<std::string>>(&a))
      return fb::CreateAttribute(fbb, key, fb::AttrKind::Strings, 0, 0, 0, 0, 0, 0, fbb.CreateVectorOfStrings(*v));
    const GraphAttr& g = std::get<GraphAttr>(a);
    if (!g) throw Error("attribute '" + name + "' holds no graph").at_node(n.name(), n.op_type());
    auto sub = graph(*g);
    return fb::CreateAttribute(fbb, key, fb::AttrKind::Graph, 0, 0, 0, 0, 0, 0, 0, sub);
  }

  flatbuffers::Offset<fb::Graph> graph(const Graph& g) {
    auto names = [&](const std::vector<Value*>& vs) {
      std::vector<flatbuffers::Offset<flatbuffers::String>> out;
      for (const Value* v : vs) out.push_back(fbb.CreateString(v ? v->name() : std::string()));
      return fbb.CreateVector(out);
    };
    // Every value, in the graph's own order (so the rebuilt graph lists them alike).
    std::vector<Node*> order = g.topo_order();
    const std::vector<Value*> all = g.values();
    std::vector<const Value*> listed(all.begin(), all.end());
    std::vector<flatbuffers::Offset<fb::Value>> values;
    for (const Value* v : listed) values.push_back(value(*v));
    std::vector<flatbuffers::Offset<fb::Node>> nodes;
    for (const Node* n : order) {
      std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
      for (const auto& [k, a] : n->attrs()) attrs.push_back(attribute(k, a, *n));
      std::vector<flatbuffers::Offset<flatbuffers::String>> captured;
      for (const std::string& c : n->captured_names()) captured.push_back(fbb.CreateString(c));
      auto node_name = fbb.CreateString(n->name());
      auto op = fbb.CreateString(n->op_type());
      auto domain = fbb.CreateString(n->domain());
      auto ins = names(n->inputs());
      auto cap = fbb.CreateVector(captured);
      auto outs = names(n->outputs());
      auto attr_vec = fbb.CreateVector(attrs);
      nodes.push_back(fb::CreateNode(fbb, node_name, op, domain, n->opset(), ins, cap, outs, attr_vec));
    }
    std::vector<flatbuffers::Offset<fb::Opset>> opsets;
    for (const auto& [domain, version] : g.opsets) opsets.push_back(fb::CreateOpset(fbb, fbb.CreateString(domain), version));
    auto gname = fbb.CreateString(g.name);
    auto vals = fbb.CreateVector(values);
    auto ins = names(g.inputs());
    auto caps = names(g.captures());
    auto outs = names(g.outputs());
    auto node_vec = fbb.CreateVector(nodes);
    auto opset_vec = fbb.CreateVector(opsets);
    return fb::CreateGraph(fbb, gname, vals, ins, caps, outs, node_vec, opset_vec);
  }

  // The stored form of `p`: its source found among the constants written so far (by address: a source the
  // lowering derived and freed may have left its address to anything but a live constant), its bytes placed
  // in the weight section.
  flatbuffers::Offset<fb::Packing> packing(const Packing& p) {
    std::uint64_t source_offset = ~std::uint64_t{0};
    if (auto it = constants_.find(std::make_pair(p.source, p.source_bytes)); p.source && it != constants_.end())
      source_offset = it->second;
    std::vector<std::uint8_t> md(p.md.begin(), p.md.end());
    auto md_vec = fbb.CreateVector(md);
    const std::size_t offset = place(p.data, p.bytes);
    std::vector<std::int64_t> dims{static_cast<std::int64_t>(p.bytes)};
    auto data = fb::CreateTensorData(fbb, fb::DType::UInt8, fbb.CreateVector(dims), offset, p.bytes);
    return fb::CreatePacking(fbb, source_offset, p.source_bytes, p.source_layout, p.hash, p.check, md_vec, data);
  }

  flatbuffers::Offset<fb::Signature> signature(const Graph& g) {
    auto specs = [&](const std::vector<Value*>& vs) {
      std::vector<flatbuffers::Offset<fb::Tensorspec>> out;
      for (const Value* v : vs) {
        auto name = fbb.CreateString(v->name());
        auto sh = shape(v->shape());
        out.push_back(fb::CreateTensorspec(fbb, name, static_cast<fb::DType>(v->dtype()), sh));
      }
      return fbb.CreateVector(out);
    };
    auto ins = specs(g.inputs());
    auto outs = specs(g.outputs());
    return fb::CreateSignature(fbb, ins, outs);
  }

 private:
  std::size_t place_once(const void* data, std::size_t bytes) {
    auto key = std::make_pair(data, bytes);
    if (!bytes) return append(data, 0);
    if (auto it = by_address_.find(key); it != by_address_.end()) return it->second;
    const auto content = std::make_pair(static_cast<std::uint64_t>(XXH3_64bits(data, bytes)), bytes);
    auto range = by_content_.equal_range(content);
    for (auto it = range.first; it != range.second; ++it)
      if (std::memcmp(chunks[it->second].first, data, bytes) == 0) return by_address_[key] = chunk_offsets[it->second];
    by_content_.emplace(content, chunks.size());
    return by_address_[key] = append(data, bytes);
  }
  std::size_t append(const void* data, std::size_t bytes) {
    const std::size_t offset = align_up(weight_bytes);
    chunks.emplace_back(data, bytes);
    chunk_offsets.push_back(offset);
    if (bytes) chunk_at_[offset] = data;
    weight_bytes = offset + bytes;
    return offset;
  }
  std::set<std::pair<std::size_t, std::size_t>> used_;  // (offset, bytes) placed for the current variant
  std::map<std::size_t, const void*> chunk_at_;          // offset -> the bytes stored there
  std::map<std::pair<const void*, std::size_t>, std::size_t> by_address_;  // any bytes placed
  std::map<std::pair<const void*, std::size_t>, std::size_t> constants_;   // the graphs' constants
  std::multimap<std::pair<std::uint64_t, std::size_t>, std::size_t> by_content_;  // (XXH3, bytes) -> chunk
};

// --- reading ---------------------------------------------------------------------------------------

// The file, mapped read-only; unmapped when the last tensor using it goes.
struct Mapping {
  const unsigned char* data = nullptr;
  std::size_t bytes = 0;
  ~Mapping() {
    if (data && bytes) munmap(const_cast<unsigned char*>(data), bytes);
  }
};

inline std::shared_ptr<Mapping> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open: " + std::string(std::strerror(errno))).in_file(path);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("not a regular file").in_file(path);
  }
  auto m = std::make_shared<Mapping>();
  m->bytes = static_cast<std::size_t>(st.st_size);
  if (m->bytes > 0) {
    void* p = ::mmap(nullptr, m->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error("cannot map the file: " + std::string(std::strerror(errno))).in_file(path);
    }
    m->data = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
  return m;
}

// The elements of a [long] vector, copied byte-wise: FlatBuffers 2.0.8's verifier checks a vector's length
// field for 4-byte alignment only, so a crafted file can put 8-byte elements at any address (found by
// fuzzing the schema part under UBSan).
inline std::vector<std::int64_t> longs(const flatbuffers::Vector<std::int64_t>* v) {
  std::vector<std::int64_t> out(v ? v->size() : 0);
  if (!out.empty()) std::memcpy(out.data(), v->Data(), out.size() * sizeof(std::int64_t));
  return out;
}

class Reader {
 public:
  Reader(std::shared_ptr<void> map, const unsigned char* weights, std::size_t weight_bytes)
      : map_(std::move(map)), weights_(weights), weight_bytes_(weight_bytes) {}

  static DType dtype(fb::DType d, const std::string& what) {
    if (static_cast<unsigned>(d) > static_cast<unsigned>(fb::DType::MAX)) throw Error(what + ": unknown dtype " + std::to_string(static_cast<unsigned>(d)));
    return static_cast<DType>(d);
  }

  Tensor tensor(const fb::TensorData* t, const std::string& what) const {
    if (!t) throw Error(what + ": no tensor data");
    DType dt = dtype(t->dtype(), what);
    if (dt == DType::String || dt == DType::Undefined) throw Error(what + ": a tensor of " + std::string(dtype_name(dt)));
    std::vector<std::int64_t> dims;
    std::uint64_t numel = 1;
    constexpr std::uint64_t kMax = std::uint64_t{1} << 48;
    if (t->dims())
      for (std::int64_t d : longs(t->dims())) {
        if (d < 0 || (d > 0 && numel > kMax / static_cast<std::uint64_t>(d)))
          throw Error(what + ": bad dims");
        numel *= static_cast<std::uint64_t>(d);
        dims.push_back(d);
      }
    const std::uint64_t bytes = numel * dtype_size(dt);
    if (bytes != t->bytes())
      throw Error(what + ": " + std::to_string(t->bytes()) + " bytes stored for " + std::string(dtype_name(dt)) +
                  dims_str(dims) + ", which takes " + std::to_string(bytes));
    if (t->offset() % kAlignment != 0 || t->offset() > weight_bytes_ || bytes > weight_bytes_ - t->offset())
      throw Error(what + ": its data [" + std::to_string(t->offset()) + ", +" + std::to_string(bytes) +
                  ") is outside the weight section of " + std::to_string(weight_bytes_) + " bytes");
    void* p = const_cast<unsigned char*>(weights_ + t->offset());
    if (bytes) used_.emplace(t->offset(), bytes);
    return Tensor(dt, std::move(dims), bytes ? p : nullptr, map_);
  }

  Shape shape(const fb::Shape* s) const {
    if (!s) return Shape::unknown();
    if (!s->rank_known()) return Shape::unknown();
    std::vector<Dim> dims;
    if (s->dims())
      for (const fb::Dim* d : *s->dims()) {
        if (d->value() >= 0) dims.emplace_back(d->value());
        else if (d->symbol() && d->symbol()->size()) dims.push_back(Dim::named(d->symbol()->str()));
        else dims.emplace_back();
      }
    return Shape(std::move(dims));
  }

  static std::string str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

  Attribute attribute(const fb::Attribute* a, const std::string& where) const {
    const std::string what = "attribute '" + str(a->name()) + "' of " + where;
    switch (a->kind()) {
      case fb::AttrKind::Int: return a->i();
      case fb::AttrKind::Float: return a->f();
      case fb::AttrKind::String: return str(a->s());
      case fb::AttrKind::Tensor: return tensor(a->tensor(), what);
      case fb::AttrKind::Ints: return longs(a->ints());
      case fb::AttrKind::Floats: return a->floats() ? std::vector<float>(a->floats()->begin(), a->floats()->end()) : std::vector<float>{};
      case fb::AttrKind::Strings: {
        std::vector<std::string> out;
        if (a->strings())
          for (const flatbuffers::String* s : *a->strings()) out.push_back(s->str());
        return out;
      }
      case fb::AttrKind::Graph: {
        if (!a->graph()) throw Error(what + ": no graph");
        auto g = std::make_shared<Graph>();
        graph(*a->graph(), *g);
        return g;
      }
    }
    throw Error(what + ": unknown kind " + std::to_string(static_cast<unsigned>(a->kind())));
  }

  void graph(const fb::Graph& in, Graph& g) const {
    g.name = str(in.name());
    g.opsets.clear();
    if (in.opsets())
      for (const fb::Opset* o : *in.opsets()) g.opsets[str(o->domain())] = o->version();
    std::unordered_map<std::string, const fb::Value*> table;
    if (in.values())
      for (const fb::Value* v : *in.values()) {
        if (static_cast<unsigned>(v->kind()) > static_cast<unsigned>(fb::ValueKind::MAX))
          throw Error("value '" + v->name()->str() + "' is of a kind this Ondine does not know");
        if (!table.emplace(v->name()->str(), v).second) throw Error("value '" + v->name()->str() + "' is listed twice");
      }
    auto spec = [&](const std::string& name) -> const fb::Value* {
      auto it = table.find(name);
      if (it == table.end()) throw Error("value '" + name + "' is not in the value table");
      return it->second;
    };
    auto type = [&](Value* v, const fb::Value* s) {
      v->set_dtype(dtype(s->dtype(), "value '" + v->name() + "'"));
      v->set_shape(shape(s->shape()));
      v->set_kind(static_cast<ValueKind>(s->kind()));  // checked against fb::ValueKind::MAX above
      if (static_cast<unsigned>(s->layout()) > static_cast<unsigned>(fb::Layout::MAX))
        throw Error("value '" + v->name() + "': unknown layout");
      v->set_layout(static_cast<Layout>(s->layout()));
    };
    if (in.inputs())
      for (const flatbuffers::String* s : *in.inputs()) {
        const fb::Value* v = spec(s->str());
        type(g.add_input(s->str(), DType::Undefined, Shape::unknown()), v);
      }
    if (in.captures())
      for (const flatbuffers::String* s : *in.captures()) {
        const fb::Value* v = spec(s->str());
        type(g.add_capture(s->str(), DType::Undefined, Shape::unknown()), v);
      }
    if (in.values())
      for (const fb::Value* v : *in.values())
        if (v->constant()) type(g.add_constant(v->name()->str(), tensor(v->constant(), "constant '" + v->name()->str() + "'")), v);
    auto lookup = [&](const flatbuffers::String* s) -> Value* {
      if (!s || s->size() == 0) return nullptr;
      spec(s->str());  // every name must be in the table
      return g.get_or_create_value(s->str());
    };
    if (in.nodes())
      for (const fb::Node* n : *in.nodes()) {
        const std::string where = "node '" + str(n->name()) + "' (" + str(n->op_type()) + ")";
        std::vector<Value*> inputs;
        const std::size_t count = n->inputs() ? n->inputs()->size() : 0;
        const std::size_t implicit = n->captured() ? n->captured()->size() : 0;
        if (implicit > count) throw Error(where + ": more captured names than inputs");
        for (std::size_t i = 0; i < count - implicit; ++i) inputs.push_back(lookup(n->inputs()->Get(static_cast<flatbuffers::uoffset_t>(i))));
        std::vector<std::string> outputs;
        if (n->outputs())
          for (const flatbuffers::String* s : *n->outputs()) {
            if (s->size() == 0) throw Error(where + ": an output without a name");
            spec(s->str());
            outputs.push_back(s->str());
          }
        std::map<std::string, Attribute> attrs;
        if (n->attributes())
          for (const fb::Attribute* a : *n->attributes()) attrs[str(a->name())] = attribute(a, where);
        Node* node = g.add_node(n->op_type()->str(), inputs, outputs, std::move(attrs), str(n->name()), str(n->domain()));
        node->set_opset(n->opset());
        for (std::size_t i = count - implicit; i < count; ++i) {
          Value* v = lookup(n->inputs()->Get(static_cast<flatbuffers::uoffset_t>(i)));
          if (!v) throw Error(where + ": an implicit input without a name");
          node->add_implicit_input(v, n->captured()->Get(static_cast<flatbuffers::uoffset_t>(i - (count - implicit)))->str());
        }
        for (Value* v : node->outputs()) type(v, spec(v->name()));
      }
    if (in.outputs())
      for (const flatbuffers::String* s : *in.outputs()) {
        Value* v = g.find_value(s->str());
        if (!v) throw Error("graph output '" + s->str() + "' is not defined");
        g.add_output(v);
      }
    if (auto problem = g.check()) throw Error("the stored graph is inconsistent: " + *problem);
  }

  // The weight bytes the tensors read so far, as Writer::take_data_hash hashes them; nullopt when a padded
  // range passes the end of the weight section.
  std::optional<std::vector<HashSegment>> data_segments() const {
    std::vector<HashSegment> segments;
    std::size_t done = 0;
    for (const auto& [offset, bytes] : used_) {
      const std::size_t end = align_up(offset + bytes);
      if (end > weight_bytes_) return std::nullopt;
      if (end <= done) continue;
      const std::size_t from = std::max<std::size_t>(offset, done);
      segments.push_back({weights_ + from, end - from});
      done = end;
    }
    return segments;
  }

 private:
  std::shared_ptr<void> map_;
  const unsigned char* weights_;
  std::size_t weight_bytes_;
  mutable std::set<std::pair<std::size_t, std::size_t>> used_;  // (offset, bytes) of every tensor read
};

}  // namespace detail

// True when the file at `path` starts with the artifact magic (any version).
inline bool is_artifact(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, sizeof magic) && std::memcmp(magic, kMagic, sizeof magic) == 0;
}

// Writes the variants (each graph with static or symbolic shapes; every constant's data and packed weight
// goes to the weight section, equal bytes once) to `path`, through a temporary file renamed at the end, so
// a reader never sees half a file. The variants must agree on the signature (input and output names and
// dtypes); the first one's versions and source stand for the file.
inline void write_variants(const std::vector<VariantData>& variants, const std::string& path) {
  namespace fb = detail::fb;
  if (variants.empty() || !variants.front().graph) throw Error("an artifact needs a variant").in_file(path);
  auto signature_of = [](const Graph& g) {
    std::string out;
    for (const auto* list : {&g.inputs(), &g.outputs()}) {
      for (const Value* v : *list) out += v->name() + ":" + std::string(dtype_name(v->dtype())) + ",";
      out += ";";
    }
    return out;
  };
  const Info& first = variants.front().info;
  detail::Writer w;
  std::vector<flatbuffers::Offset<fb::Variant>> stored;
  for (const VariantData& v : variants) {
    if (!v.graph) throw Error("variant for " + v.info.isa + " has no graph").in_file(path);
    if (signature_of(*v.graph) != signature_of(*variants.front().graph))
      throw Error("the variant for " + v.info.isa + " has other inputs or outputs than the one for " + first.isa +
                  " (variants of one artifact share a signature)")
          .in_file(path);
    flatbuffers::Offset<fb::Graph> graph;
    try {
      graph = w.graph(*v.graph);
    } catch (Error& e) {
      throw e.in_file(path);
    }
    std::vector<flatbuffers::Offset<fb::Packing>> packed;
    for (const Packing& p : v.packings) packed.push_back(w.packing(p));
    std::vector<flatbuffers::Offset<fb::Dim>> dims;
    for (const auto& [symbol, size] : v.packing_dims) dims.push_back(fb::CreateDim(w.fbb, size, w.fbb.CreateString(symbol)));
    auto packed_vec = w.fbb.CreateVector(packed);
    auto dims_vec = w.fbb.CreateVector(dims);
    const Info& info = v.info;
    auto target = fb::CreateTarget(w.fbb, w.fbb.CreateString(info.isa), info.threads, w.fbb.CreateString(info.precision),
                                   w.fbb.CreateString(info.passes), info.requires_vnni,
                                   info.unpacked.empty() ? 0 : w.fbb.CreateString(info.unpacked),
                                   info.keep_fp32.empty() ? 0 : w.fbb.CreateVectorOfStrings(info.keep_fp32),
                                   info.tuned.empty() ? 0 : w.fbb.CreateString(info.tuned));
    stored.push_back(fb::CreateVariant(w.fbb, target, graph, packed_vec, dims_vec, w.take_data_hash()));
  }
  auto signature = w.signature(*variants.front().graph);
  auto variant_vec = w.fbb.CreateVector(stored);
  auto model = fb::CreateModel(w.fbb, w.fbb.CreateString(first.ondine_version), w.fbb.CreateString(first.onednn_version),
                               w.fbb.CreateString(first.source), signature, variant_vec);
  fb::FinishModelBuffer(w.fbb, model);

  const std::size_t schema_offset = kHeaderBytes, schema_bytes = w.fbb.GetSize();
  const std::size_t weights_offset = detail::align_up(schema_offset + schema_bytes);
  // The weight section as it will be on disk (chunks at their offsets, zero padding between and after).
  std::vector<unsigned char> weights(detail::align_up(w.weight_bytes), 0);
  for (std::size_t i = 0; i < w.chunks.size(); ++i)
    if (w.chunks[i].second) std::memcpy(weights.data() + w.chunk_offsets[i], w.chunks[i].first, w.chunks[i].second);
  unsigned char header[kHeaderBytes] = {};
  std::memcpy(header, kMagic, sizeof kMagic);
  detail::put_u32(header + 8, kFormatVersion);
  detail::put_u32(header + 12, static_cast<std::uint32_t>(kHeaderBytes));
  detail::put_u64(header + 16, schema_offset);
  detail::put_u64(header + 24, schema_bytes);
  detail::put_u64(header + 32, weights_offset);
  detail::put_u64(header + 40, weights.size());
  detail::put_u64(header + 48, XXH3_64bits(w.fbb.GetBufferPointer(), schema_bytes));
  detail::put_u64(header + 56, 0);  // per variant: Variant.data_hash

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("cannot write: " + std::string(std::strerror(errno))).in_file(path);
    out.write(reinterpret_cast<const char*>(header), kHeaderBytes);
    out.write(reinterpret_cast<const char*>(w.fbb.GetBufferPointer()), static_cast<std::streamsize>(schema_bytes));
    std::vector<char> pad(weights_offset - schema_offset - schema_bytes, 0);
    out.write(pad.data(), static_cast<std::streamsize>(pad.size()));
    out.write(reinterpret_cast<const char*>(weights.data()), static_cast<std::streamsize>(weights.size()));
    if (!out.flush()) throw Error("cannot write: " + std::string(std::strerror(errno))).in_file(path);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write: " + std::string(std::strerror(errno))).in_file(path);
  }
}

// Writes one variant: `g` compiled for `info`; `packings` (optional): weights as oneDNN packed them for
// `packing_dims` (lower/artifact.hpp makes them).
inline void write(const Graph& g, const Info& info, const std::string& path, const std::vector<Packing>& packings = {},
                  const std::map<std::string, std::int64_t>& packing_dims = {}) {
  write_variants({VariantData{&g, info, packings, packing_dims}}, path);
}

// Maps and checks the artifact at `path` (see the header comment), lets `choose` pick a variant (none: the
// first) and rebuilds its graph, whose constants point into the mapping. Throws an Error naming the file.
// A variant's weight checksum in progress: one thread of its own hashes pieces from the start; wait() hashes
// the rest on the calling thread too (after a compile, both cores take pieces), then compares.
class PendingWeightCheck {
 public:
  PendingWeightCheck(std::vector<detail::HashSegment> segments, std::uint64_t expected, Error damaged,
                     std::shared_ptr<void> keep)
      : hash_(std::move(segments)), expected_(expected), damaged_(std::move(damaged)), keep_(std::move(keep)),
        thread_([this] { hash_.work(); }) {}
  PendingWeightCheck(const PendingWeightCheck&) = delete;
  PendingWeightCheck& operator=(const PendingWeightCheck&) = delete;
  ~PendingWeightCheck() {
    hash_.abandon();
    if (thread_.joinable()) thread_.join();
  }
  // Throws the damaged-file error when the checksum does not match.
  void wait() {
    hash_.work();
    if (thread_.joinable()) thread_.join();
    if (hash_.result() != expected_) throw damaged_;
  }

 private:
  detail::PiecewiseHash hash_;
  std::uint64_t expected_;
  Error damaged_;
  std::shared_ptr<void> keep_;  // the mapping the segments point into
  std::thread thread_;          // last: started once the rest is ready
};

inline void Artifact::wait_checked() {
  if (!weights_checked) return;
  std::shared_ptr<PendingWeightCheck> pending = std::move(weights_checked);
  pending->wait();
}

inline Artifact read_bytes(const unsigned char* p, std::size_t size, std::shared_ptr<void> map, const std::string& path,
                           const VariantChooser& choose, WeightCheck check = WeightCheck::Now);

inline Artifact read(const std::string& path, const VariantChooser& choose = {}, WeightCheck check = WeightCheck::Now) {
  std::shared_ptr<detail::Mapping> map = detail::map_file(path);
  return read_bytes(map->data, map->bytes, map, path, choose, check);
}

// An artifact linked into the program (`ondine_add_model(... EMBED)`: its bytes in .rodata, 64-byte aligned),
// checked as a file is; `name` stands for the file in errors. The bytes must outlive what is read from them.
inline Artifact read_memory(const void* data, std::size_t size, const std::string& name, const VariantChooser& choose = {},
                            WeightCheck check = WeightCheck::Now) {
  if (reinterpret_cast<std::uintptr_t>(data) % kAlignment != 0)
    throw Error("an embedded artifact must be 64-byte aligned").in_file(name);
  return read_bytes(static_cast<const unsigned char*>(data), size, nullptr, name, choose, check);
}

// Writes every variant of the artifacts at `paths`, in order, as one artifact at `out` (`ondine compile
// --target avx2,native` compiles each target in its own process, then combines them). Equal weights are
// stored once.
inline void combine(const std::vector<std::string>& paths, const std::string& out) {
  std::vector<Artifact> parts;
  for (const std::string& path : paths) {
    parts.push_back(read(path));  // its first variant, and how many there are
    const std::size_t count = parts.back().variants.size();
    for (std::size_t i = 1; i < count; ++i) parts.push_back(read(path, [i](const std::vector<Info>&) { return i; }));
  }
  std::vector<VariantData> variants;
  for (const Artifact& a : parts) variants.push_back(VariantData{&a.graph, a.info, a.packings, a.packing_dims});
  write_variants(variants, out);
}

// The checks and the rebuilding of read(), on `size` bytes at `p` kept alive by `map` (null: static data).
inline Artifact read_bytes(const unsigned char* p, std::size_t size, std::shared_ptr<void> map, const std::string& path,
                           const VariantChooser& choose, WeightCheck check) {
  namespace fb = detail::fb;
  auto fail = [&](const std::string& what) { return Error("not a valid Ondine artifact: " + what).in_file(path); };
  if (size < kHeaderBytes || std::memcmp(p, kMagic, sizeof kMagic) != 0)
    throw Error(size < kHeaderBytes ? "not an Ondine artifact: the file has only " + std::to_string(size) + " bytes"
                                    : "not an Ondine artifact (no \"ONDINEAF\" magic)")
        .in_file(path);
  const std::uint32_t version = detail::get_u32(p + 8);
  if (version != kFormatVersion)
    throw Error("artifact format version " + std::to_string(version) + "; this Ondine reads version " +
                std::to_string(kFormatVersion) + ": recompile the model with this Ondine" +
                (version > kFormatVersion ? ", or update Ondine" : ""))
        .in_file(path);
  if (detail::get_u32(p + 12) != kHeaderBytes) throw fail("header size " + std::to_string(detail::get_u32(p + 12)));
  if (detail::get_u64(p + 56) != 0) throw fail("the header's reserved field is not zero");
  const std::uint64_t schema_offset = detail::get_u64(p + 16), schema_bytes = detail::get_u64(p + 24);
  const std::uint64_t weights_offset = detail::get_u64(p + 32), weight_bytes = detail::get_u64(p + 40);
  auto inside = [&](std::uint64_t off, std::uint64_t len) { return off >= kHeaderBytes && off <= size && len <= size - off; };
  if (!inside(schema_offset, schema_bytes) || schema_bytes < 8)
    throw fail("the schema part [" + std::to_string(schema_offset) + ", +" + std::to_string(schema_bytes) +
               ") is outside the file of " + std::to_string(size) + " bytes (truncated?)");
  if (!inside(weights_offset, weight_bytes) || weights_offset % kAlignment != 0)
    throw fail("the weight section [" + std::to_string(weights_offset) + ", +" + std::to_string(weight_bytes) +
               ") is outside the file of " + std::to_string(size) + " bytes (truncated?)");
  if (XXH3_64bits(p + schema_offset, schema_bytes) != detail::get_u64(p + 48))
    throw fail("the schema part's checksum does not match (the file is damaged)");
  flatbuffers::Verifier verifier(p + schema_offset, schema_bytes, /*max_depth=*/128, /*max_tables=*/10000000);
  if (!fb::VerifyModelBuffer(verifier)) throw fail("the FlatBuffers verifier rejects the schema part");
  const fb::Model* model = fb::GetModel(p + schema_offset);

  Artifact a;
  if (model->variants()->size() == 0) throw fail("it has no variant");
  for (const fb::Variant* v : *model->variants()) {
    Info info;
    info.format_version = version;
    info.ondine_version = detail::Reader::str(model->ondine_version());
    info.onednn_version = detail::Reader::str(model->onednn_version());
    info.source = detail::Reader::str(model->source());
    const fb::Target* t = v->target();
    info.isa = detail::Reader::str(t->isa());
    info.threads = t->threads();
    info.precision = detail::Reader::str(t->precision());
    info.passes = detail::Reader::str(t->passes());
    info.requires_vnni = t->requires_vnni();
    info.unpacked = detail::Reader::str(t->unpacked());
    if (t->keep_fp32())
      for (const flatbuffers::String* k : *t->keep_fp32()) info.keep_fp32.push_back(detail::Reader::str(k));
    info.tuned = detail::Reader::str(t->tuned());
    info.packings = v->packings() ? v->packings()->size() : 0;
    info.file_bytes = size;
    info.weight_bytes = weight_bytes;
    a.variants.push_back(std::move(info));
  }
  try {
    a.variant = choose ? choose(a.variants) : 0;
  } catch (Error& e) {
    throw e.in_file(path);
  }
  if (a.variant >= a.variants.size()) throw Error("internal: variant " + std::to_string(a.variant) + " chosen of " +
                                                  std::to_string(a.variants.size())).in_file(path);
  a.info = a.variants[a.variant];
  a.mapping = map;
  const fb::Variant* variant = model->variants()->Get(static_cast<flatbuffers::uoffset_t>(a.variant));
  detail::Reader reader(map, p + weights_offset, static_cast<std::size_t>(weight_bytes));
  try {
    reader.graph(*variant->graph(), a.graph);
    if (variant->packings())
      for (const fb::Packing* q : *variant->packings()) {
        Packing out;
        const std::string what = "packed weight " + std::to_string(a.packings.size());
        Tensor data = reader.tensor(q->data(), what);
        if (data.dtype() != DType::UInt8 || data.rank() != 1) throw Error(what + ": its data is not bytes");
        out.data = data.raw();
        out.bytes = data.nbytes();
        if (q->source_offset() != ~std::uint64_t{0}) {
          if (q->source_offset() % kAlignment != 0 || q->source_offset() > weight_bytes ||
              q->source_bytes() > weight_bytes - q->source_offset())
            throw Error(what + ": its source is outside the weight section");
          out.source = p + weights_offset + q->source_offset();
        }
        out.source_bytes = q->source_bytes();
        out.source_layout = q->source_layout();
        out.hash = q->hash();
        out.check = q->check();
        if (q->md()) out.md.assign(reinterpret_cast<const char*>(q->md()->data()), q->md()->size());
        a.packings.push_back(std::move(out));
      }
    if (variant->packing_dims())
      for (const fb::Dim* d : *variant->packing_dims()) a.packing_dims[detail::Reader::str(d->symbol())] = d->value();
    std::optional<std::vector<detail::HashSegment>> segments = reader.data_segments();
    if (!segments)
      throw fail("a tensor's padded range passes the end of the weight section of " + std::to_string(weight_bytes) +
                 " bytes (truncated?)");
    const Error damaged = fail("the checksum of the weights of its variant for " + a.info.isa +
                               " does not match (the file is damaged)");
    const std::uint64_t expected = variant->data_hash();
    if (check == WeightCheck::Now) {
      if (detail::piecewise_hash(*segments) != expected) throw damaged;
    } else {  // `map` (null for bytes in memory, which outlive the program's use) keeps the segments' bytes
      a.weights_checked = std::make_shared<PendingWeightCheck>(std::move(*segments), expected, damaged, map);
    }
  } catch (Error& e) {
    throw e.in_file(path);
  }
  return a;
}

}  // namespace ondine::artifact
