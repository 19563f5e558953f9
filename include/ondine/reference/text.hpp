// SPDX-License-Identifier: Apache-2.0
// ondine/reference/text.hpp - the text ops: TfIdfVectorizer on integer tokens (string pools are not
// supported), and StringNormalizer on string tensors (Tensor::strings).
//
// StringNormalizer removes the stopwords (compared exactly, or ASCII-case-insensitively unless
// is_case_sensitive), then changes case (LOWER / UPPER / NONE) in ASCII: the `locale` attribute is
// accepted and ignored, so non-ASCII letters keep their case. When every string is removed the output
// is one empty string, [1] or [1, 1], as ONNX specifies.
//
// Counting follows ONNX's reference implementation: for each skip distance d = 1 .. max_skip_count + 1
// and each start position, the n-grams of tokens start, start + d, start + 2d, ... of every length in
// [min_gram_length, max_gram_length] that the pool lists are counted; unigrams only for the first d,
// since skipping does not change them. The j-th n-gram of the pool (in pool order, shorter n-grams
// first, ngram_counts giving where each length starts) counts into output ngram_indexes[j]. Modes:
// TF the counts, IDF 1 (or the weight) where a count is positive, TFIDF count times weight.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/infer/text.hpp"
#include "ondine/reference/common.hpp"

namespace ondine::reference {
namespace detail::text {

inline std::vector<Tensor> tfidf_vectorizer(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty() || in[0].empty()) throw n.error("missing required input #0");
  const Tensor& x = in[0];
  if (x.dtype() != DType::Int32 && x.dtype() != DType::Int64)
    throw n.error("input of " + std::string(dtype_name(x.dtype())) + ": Ondine takes int32 or int64 tokens");
  if (n.has_attr("pool_strings")) throw n.error("pool_strings: string pools are not supported");
  const std::int64_t min_n = n.attr_int("min_gram_length"), max_n = n.attr_int("max_gram_length");
  const std::int64_t max_skip = n.attr_int("max_skip_count");
  if (min_n < 1 || max_n < min_n || max_skip < 0)
    throw n.error("gram lengths [" + std::to_string(min_n) + ", " + std::to_string(max_n) + "] or max_skip_count " +
                  std::to_string(max_skip) + " out of range");
  const std::string mode = n.attr_string("mode");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") throw n.error("unknown mode '" + mode + "'");
  const auto pool = n.attr_ints("pool_int64s");
  const auto counts = n.attr_ints("ngram_counts");
  const auto indexes = n.attr_ints("ngram_indexes");
  const auto weights = n.attr_floats("weights", {});
  const std::int64_t e = infer::detail_text::tfidf_output_size(n);
  if (!weights.empty() && static_cast<std::int64_t>(weights.size()) < e)
    throw n.error("weights has " + std::to_string(weights.size()) + " entries for " + std::to_string(e) + " outputs");

  // The pool's n-grams of each length -> their output index.
  std::map<std::vector<std::int64_t>, std::int64_t> grams;
  std::size_t j = 0;  // n-gram number in pool order
  for (std::size_t len = 1; len <= counts.size(); ++len) {
    const auto begin = static_cast<std::size_t>(counts[len - 1]);
    const auto end = len < counts.size() ? static_cast<std::size_t>(counts[len]) : pool.size();
    if (begin > end || end > pool.size() || (end - begin) % len != 0)
      throw n.error("ngram_counts " + dims_str(counts) + " does not divide the pool of " + std::to_string(pool.size()));
    for (std::size_t at = begin; at < end; at += len, ++j) {
      if (j >= indexes.size()) throw n.error("ngram_indexes is shorter than the pool's n-grams");
      grams[std::vector<std::int64_t>(pool.begin() + static_cast<std::ptrdiff_t>(at),
                                      pool.begin() + static_cast<std::ptrdiff_t>(at + len))] = indexes[j];
    }
  }

  if (x.rank() != 1 && x.rank() != 2) throw n.error("input must be [C] or [N, C], got " + dims_str(x.dims()));
  const std::int64_t rows = x.rank() == 2 ? x.dims()[0] : 1, c = x.dims().back();
  const std::vector<std::int64_t> tokens = x.to_int64s();
  std::vector<double> freq(static_cast<std::size_t>(rows * e), 0.0);
  std::vector<std::int64_t> gram;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t* row = tokens.data() + r * c;
    std::int64_t first_len = min_n;
    for (std::int64_t d = 1; d <= max_skip + 1 && first_len <= max_n; ++d) {
      for (std::int64_t start = 0; start < c; ++start) {
        gram.clear();
        for (std::int64_t len = 1, at = start; len <= max_n && at < c; ++len, at += d) {
          gram.push_back(row[at]);
          if (len < first_len) continue;
          if (auto it = grams.find(gram); it != grams.end()) freq[static_cast<std::size_t>(r * e + it->second)] += 1;
        }
      }
      if (first_len == 1) first_len = 2;  // unigrams once: the skip distance does not change them
    }
  }

  Tensor y(DType::Float32, x.rank() == 2 ? std::vector<std::int64_t>{rows, e} : std::vector<std::int64_t>{e});
  float* out = y.data<float>();
  for (std::size_t i = 0; i < freq.size(); ++i) {
    const double w = weights.empty() ? 1.0 : weights[i % static_cast<std::size_t>(e)];
    const double f = freq[i];
    out[i] = static_cast<float>(mode == "TF" ? f : mode == "IDF" ? (f > 0 ? w : 0.0) : f * w);
  }
  return {y};
}

inline std::string ascii_case(std::string s, bool upper) {
  for (char& ch : s)
    if (upper ? (ch >= 'a' && ch <= 'z') : (ch >= 'A' && ch <= 'Z')) ch = static_cast<char>(ch ^ 0x20);
  return s;
}

inline std::vector<Tensor> string_normalizer(const Node& n, const std::vector<Tensor>& in) {
  if (in.empty() || in[0].empty()) throw n.error("missing required input #0");
  const Tensor& x = in[0];
  if (x.dtype() != DType::String || !x.has_strings()) throw n.error("input must be a tensor of strings");
  if (x.rank() != 1 && !(x.rank() == 2 && x.dims()[0] == 1))
    throw n.error("input must be [C] or [1, C], got " + dims_str(x.dims()));
  const std::string action = n.attr_string("case_change_action", "NONE");
  if (action != "NONE" && action != "LOWER" && action != "UPPER")
    throw n.error("unknown case_change_action '" + action + "'");
  const bool case_sensitive = n.attr_int("is_case_sensitive", 0) != 0;
  std::vector<std::string> stopwords = n.attr_strings("stopwords", {});
  if (!case_sensitive)
    for (auto& w : stopwords) w = ascii_case(w, false);
  std::vector<std::string> kept;
  for (const std::string& s : x.strings()) {
    const std::string key = case_sensitive ? s : ascii_case(s, false);
    if (std::find(stopwords.begin(), stopwords.end(), key) != stopwords.end()) continue;
    kept.push_back(action == "NONE" ? s : ascii_case(s, action == "UPPER"));
  }
  if (kept.empty()) kept.emplace_back();  // all removed: one empty string
  const auto c = static_cast<std::int64_t>(kept.size());
  return {Tensor::from_strings(x.rank() == 1 ? std::vector<std::int64_t>{c} : std::vector<std::int64_t>{1, c},
                               std::move(kept))};
}

}  // namespace detail::text

inline void register_text_kernels(KernelTable& t) {
  t["TfIdfVectorizer"] = detail::text::tfidf_vectorizer;
  t["StringNormalizer"] = detail::text::string_normalizer;
}

}  // namespace ondine::reference
