// SPDX-License-Identifier: Apache-2.0
// ondine/onnx/schemas.hpp - the operators of ONNX's default domain as the installed ONNX library defines
// them: each op with the opset versions that changed it. `ondine ops` lists them beside what Ondine
// implements, so the coverage table names the ops Ondine lacks as well as the ones it has.
//
// Not part of ondine.hpp: it reads ONNX's schema registry, which lives in libonnx (CMake target `onnx`),
// not in libonnx_proto that the importer needs; a program that includes this header links `onnx` too.
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "onnx/defs/schema.h"
#include "ondine/onnx/import.hpp"

namespace ondine::onnx {

struct OpSchemaVersions {
  std::vector<int> since;   // the opsets in [kMinOpset, kMaxOpset] at which the op was introduced or changed
  bool deprecated = false;  // its newest version is deprecated (Upsample, Scatter)
};

// The newest default-domain opset the installed ONNX library knows (Debian 12's libonnx 1.12: 17).
inline int onnx_library_max_opset() {
  const auto& map = ::onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto it = map.find("");
  return it == map.end() ? 0 : it->second.second;
}

// The default domain's ops ("" and "ai.onnx") that exist at some opset Ondine reads, by name.
inline std::map<std::string, OpSchemaVersions> default_domain_schemas() {
  std::map<std::string, OpSchemaVersions> ops;
  std::map<std::string, int> newest;
  for (const ::onnx::OpSchema& s : ::onnx::OpSchemaRegistry::get_all_schemas_with_history()) {
    if (!s.domain().empty() && s.domain() != "ai.onnx") continue;
    const int v = s.SinceVersion();
    if (v < kMinOpset || v > kMaxOpset) continue;
    OpSchemaVersions& o = ops[s.Name()];
    o.since.push_back(v);
    if (v >= newest[s.Name()]) {
      newest[s.Name()] = v;
      o.deprecated = s.Deprecated();
    }
  }
  for (auto& [name, o] : ops) std::sort(o.since.begin(), o.since.end());
  return ops;
}

}  // namespace ondine::onnx
