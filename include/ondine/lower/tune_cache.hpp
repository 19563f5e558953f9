// SPDX-License-Identifier: Apache-2.0
// ondine/lower/tune_cache.hpp - the per-machine cache file of what was measured on this CPU: the tuner's
// decisions per model (lower/tune.hpp) and the CPU's peak rates (lower/int8_plan.hpp), so that a second
// process measures nothing. One line per entry, "key<TAB>value", under a header line; keys start "model="
// (a tuned model: fingerprint, CPU brand, ISA, threads) or "peak;" (the CPU brand and ISA). A file that does
// not parse is ignored with a warning naming it, and rewritten whole (atomically) by the next writer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "ondine/lower/options.hpp"
#include "ondine/lower/isa.hpp"

namespace ondine::lower {

// Where the tune cache lives: ONDINE_TUNE_CACHE, else $XDG_CACHE_HOME/ondine/tune.txt, else
// $HOME/.cache/ondine/tune.txt ("" when none of them is set).
inline std::string tune_cache_path() {
  if (const char* p = std::getenv("ONDINE_TUNE_CACHE")) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/ondine/tune.txt";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ondine/tune.txt";
  return "";
}

namespace detail::tune {

// The CPU's brand string (CPUID 0x80000002-4), e.g. "AMD EPYC 9R14 96-Core Processor"; the vendor elsewhere.
inline std::string cpu_brand() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[12] = {};
  unsigned max = __get_cpuid_max(0x80000000u, nullptr);
  if (max >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char s[49] = {};
    std::memcpy(s, regs, 48);
    std::string b(s);
    b.erase(0, b.find_first_not_of(' '));
    while (!b.empty() && b.back() == ' ') b.pop_back();
    if (!b.empty()) return b;
  }
#endif
  return cpu_vendor();
}

constexpr const char* kCacheHeader = "ondine-tune 1";

// A node's name inside a decision ("conv_algorithm@NAME=winograd"): the characters that separate decisions,
// knobs, values and lines percent-encoded, so any name round-trips.
inline std::string encode_name(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == ',' || c == '=' || c == '@' || c == '%' || c == '\t' || c == '\n' || c == '\r') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}
inline std::string decode_name(const std::string& encoded) {
  std::string out;
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] == '%' && i + 2 < encoded.size()) {
      out += static_cast<char>(std::strtol(encoded.substr(i + 1, 2).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += encoded[i];
    }
  }
  return out;
}

// Sets one per-node decision ("conv_algorithm@NAME" = "winograd" | "direct", "precision@NAME" = "fp32") on
// `o`; false for a knob or value this version does not know.
inline bool apply_node_decision(const std::string& knob, const std::string& value, CompileOptions& o) {
  const std::size_t at = knob.find('@');
  if (at == std::string::npos) return false;
  const std::string base = knob.substr(0, at), node = decode_name(knob.substr(at + 1));
  if (base == "conv_algorithm" && (value == "winograd" || value == "direct")) {
    o.conv_algorithm_per_node[node] = value == "winograd" ? ConvAlgorithm::Winograd : ConvAlgorithm::Direct;
    return true;
  }
  if (base == "precision" && value == "fp32") {
    o.fp32_nodes.insert(node);
    return true;
  }
  return false;
}

// The cache file's entries, key -> decisions; empty (and a warning) when it does not parse.
inline std::map<std::string, std::string> read_cache(const std::string& path, const std::function<void(const std::string&)>& warn) {
  std::map<std::string, std::string> entries;
  std::ifstream in(path);
  if (!in) return entries;
  std::string line;
  if (!std::getline(in, line) || line != kCacheHeader) {
    warn("tune cache '" + path + "' is not an Ondine tune cache (first line '" + line.substr(0, 40) +
         "', expected '" + kCacheHeader + "'): ignored, and rewritten when Ondine next stores a measurement");
    return entries;
  }
  std::size_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos || (line.compare(0, 6, "model=") != 0 && line.compare(0, 5, "peak;") != 0)) {
      warn("tune cache '" + path + "' line " + std::to_string(number) + " does not parse: the file is ignored, and "
           "rewritten when Ondine next stores a measurement");
      return {};
    }
    entries[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return entries;
}

inline void write_cache(const std::string& path, const std::map<std::string, std::string>& entries,
                        const std::function<void(const std::string&)>& warn) {
  const std::size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    for (std::size_t i = 1; i <= dir.size(); ++i)  // mkdir -p, one level at a time
      if (i == dir.size() || dir[i] == '/') (void)::mkdir(dir.substr(0, i).c_str(), 0755);
  }
  const std::string tmp = path + ".tmp" + std::to_string(static_cast<long long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kCacheHeader << "\n";
    for (const auto& [k, v] : entries) out << k << "\t" << v << "\n";
    if (!out) {
      warn("tune cache '" + path + "' could not be written: the decisions are not kept");
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    warn("tune cache '" + path + "' could not be replaced: the decisions are not kept");
    std::remove(tmp.c_str());
  }
}

}  // namespace detail::tune

}  // namespace ondine::lower
