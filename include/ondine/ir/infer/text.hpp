// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/text.hpp - type and shape inference for the text ops (reference/text.hpp has the
// kernels): TfIdfVectorizer, float32 counts, [C] -> [E] or [N, C] -> [N, E] with E = max(ngram_indexes) + 1;
// StringNormalizer, strings of [C] or [1, C] -> [C'] or [1, C'] with C' known only without stopwords.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"

namespace ondine::infer {
namespace detail_text {

// The output's last dim: one past the largest output index the pool's n-grams map to.
inline std::int64_t tfidf_output_size(const Node& n) {
  const auto idx = n.attr_ints("ngram_indexes");
  if (idx.empty()) throw n.error("ngram_indexes is empty");
  const std::int64_t top = *std::max_element(idx.begin(), idx.end());
  if (*std::min_element(idx.begin(), idx.end()) < 0) throw n.error("ngram_indexes has a negative index");
  return top + 1;
}

inline void infer_tfidf_vectorizer(Node& n) {
  const Value& x = required_input(n, 0);
  if (x.dtype() != DType::Undefined && x.dtype() != DType::Int32 && x.dtype() != DType::Int64)
    throw n.error("input of " + std::string(dtype_name(x.dtype())) + ": Ondine takes int32 or int64 tokens (not strings)");
  const std::int64_t e = tfidf_output_size(n);
  const Shape& s = x.shape();
  if (!s.rank_known()) return set_output(n, 0, DType::Float32, Shape::unknown());
  if (s.rank() == 1) return set_output(n, 0, DType::Float32, Shape{e});
  if (s.rank() == 2) return set_output(n, 0, DType::Float32, Shape{s[0], e});
  throw n.error("input must be [C] or [N, C], got " + s.str());
}

inline void infer_string_normalizer(Node& n) {
  const Value& x = required_input(n, 0);
  if (x.dtype() != DType::Undefined && x.dtype() != DType::String)
    throw n.error("input of " + std::string(dtype_name(x.dtype())) + ": StringNormalizer takes strings");
  const Shape& s = x.shape();
  if (!s.rank_known()) return set_output(n, 0, DType::String, Shape::unknown());
  if (s.rank() != 1 && !(s.rank() == 2 && (!s[0].is_static() || s[0].value == 1)))
    throw n.error("input must be [C] or [1, C], got " + s.str());
  // Stopwords remove a number of strings known only from the data (and all removed leaves one "").
  const bool keeps_all = n.attr_strings("stopwords", {}).empty();
  Dim c = keeps_all ? s[s.rank() - 1] : Dim();
  set_output(n, 0, DType::String, s.rank() == 1 ? Shape{c} : Shape{1, c});
}

}  // namespace detail_text

inline void register_text_infer(InferTable& t) {
  t["TfIdfVectorizer"] = detail_text::infer_tfidf_vectorizer;
  t["StringNormalizer"] = detail_text::infer_string_normalizer;
}

}  // namespace ondine::infer
