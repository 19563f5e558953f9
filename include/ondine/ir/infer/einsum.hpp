// SPDX-License-Identifier: Apache-2.0
// ondine/ir/infer/einsum.hpp - the Einsum equation (opset 12) read once, for shape inference, the
// reference kernel (reference/einsum.hpp) and the compiled engine's matmul lowering.
//
// An equation is "term,term,...->output" or, implicitly, without "->". A term is letters (a-z, A-Z) and at
// most one "...", which stands for the operand's dims not named by letters; the ellipses of all
// operands broadcast against each other, right-aligned, as in numpy. Spaces are ignored. A letter
// repeated within a term takes that operand's diagonal. Without "->" the output is the broadcast
// ellipsis dims followed by the letters that appear exactly once in the whole equation, in ASCII order
// (numpy's rule, which the ONNX reference uses). Labels missing from the output are summed over.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ondine/ir/infer/common.hpp"
#include "ondine/ir/infer/math.hpp"

namespace ondine::infer {
namespace detail_einsum {

// A letter's label is its character code; the k-th broadcast ellipsis dim (from the left) is
// kEllipsisLabel + k, so labels sort letters before ellipsis dims and never collide.
inline constexpr int kEllipsisLabel = 256;

struct Term {
  std::string letters;      // the term's letters, without the ellipsis
  bool ellipsis = false;
  std::size_t ellipsis_at = 0;  // how many letters come before the "..."
};

struct Equation {
  std::vector<Term> inputs;
  Term output;
  bool explicit_output = false;
};

// The equation with every operand's rank known: the label of each operand axis and of each output axis.
struct Labels {
  std::vector<std::vector<int>> operands;
  std::vector<int> output;
  std::size_t ellipsis_rank = 0;  // the broadcast ellipsis' rank
};

inline Term parse_term(const Node& n, const std::string& s, const std::string& equation) {
  Term t;
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, "...") == 0) {
      if (t.ellipsis) throw n.error("equation '" + equation + "' has two ellipses in the term '" + s + "'");
      t.ellipsis = true;
      t.ellipsis_at = t.letters.size();
      i += 3;
    } else if ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')) {
      t.letters += s[i++];
    } else {
      throw n.error("equation '" + equation + "' has '" + std::string(1, s[i]) +
                    "' where a letter, '...', ',' or '->' belongs");
    }
  }
  return t;
}

inline Equation parse(const Node& n) {
  const std::string equation = n.attr_string("equation");
  std::string s;
  for (char c : equation)
    if (c != ' ' && c != '\t') s += c;
  Equation eq;
  const auto arrow = s.find("->");
  const std::string lhs = s.substr(0, arrow);
  for (std::size_t start = 0;;) {
    const auto comma = lhs.find(',', start);
    eq.inputs.push_back(parse_term(n, lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
                                   equation));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    eq.explicit_output = true;
    eq.output = parse_term(n, s.substr(arrow + 2), equation);
    std::string seen;
    for (char c : eq.output.letters) {
      if (seen.find(c) != std::string::npos)
        throw n.error("equation '" + equation + "' names output label '" + std::string(1, c) + "' twice");
      seen += c;
      bool in_input = std::any_of(eq.inputs.begin(), eq.inputs.end(),
                                  [&](const Term& t) { return t.letters.find(c) != std::string::npos; });
      if (!in_input)
        throw n.error("equation '" + equation + "' has output label '" + std::string(1, c) + "' in no input term");
    }
  }
  if (eq.inputs.size() != n.num_inputs())
    throw n.error("equation '" + equation + "' has " + std::to_string(eq.inputs.size()) + " input terms for " +
                  std::to_string(n.num_inputs()) + " inputs");
  return eq;
}

// Labels each axis of operands of the given ranks; throws naming the node when a term does not fit its
// operand's rank.
inline Labels label(const Node& n, const Equation& eq, const std::vector<std::size_t>& ranks) {
  Labels l;
  for (std::size_t i = 0; i < eq.inputs.size(); ++i) {
    const Term& t = eq.inputs[i];
    const std::size_t named = t.letters.size();
    if (t.ellipsis ? ranks[i] < named : ranks[i] != named)
      throw n.error("input #" + std::to_string(i) + " has rank " + std::to_string(ranks[i]) + " but its term in '" +
                    n.attr_string("equation") + "' names " + std::to_string(named) + " dims" +
                    (t.ellipsis ? " and an ellipsis" : ""));
    if (t.ellipsis) l.ellipsis_rank = std::max(l.ellipsis_rank, ranks[i] - named);
  }
  for (std::size_t i = 0; i < eq.inputs.size(); ++i) {
    const Term& t = eq.inputs[i];
    const std::size_t e = t.ellipsis ? ranks[i] - t.letters.size() : 0;
    std::vector<int> axes;
    for (std::size_t k = 0; k < t.letters.size(); ++k) {
      if (t.ellipsis && k == t.ellipsis_at)
        for (std::size_t j = 0; j < e; ++j) axes.push_back(kEllipsisLabel + static_cast<int>(l.ellipsis_rank - e + j));
      axes.push_back(static_cast<unsigned char>(t.letters[k]));
    }
    if (t.ellipsis && t.ellipsis_at == t.letters.size())
      for (std::size_t j = 0; j < e; ++j) axes.push_back(kEllipsisLabel + static_cast<int>(l.ellipsis_rank - e + j));
    l.operands.push_back(std::move(axes));
  }
  auto ellipsis_labels = [&] {
    std::vector<int> v;
    for (std::size_t j = 0; j < l.ellipsis_rank; ++j) v.push_back(kEllipsisLabel + static_cast<int>(j));
    return v;
  };
  if (eq.explicit_output) {
    const Term& t = eq.output;
    for (std::size_t k = 0; k <= t.letters.size(); ++k) {
      if (t.ellipsis && k == t.ellipsis_at)
        for (int e : ellipsis_labels()) l.output.push_back(e);
      if (k < t.letters.size()) l.output.push_back(static_cast<unsigned char>(t.letters[k]));
    }
  } else {
    std::map<int, int> count;  // ordered by character code: numpy's implicit output order
    for (const Term& t : eq.inputs)
      for (char c : t.letters) ++count[static_cast<unsigned char>(c)];
    l.output = ellipsis_labels();
    for (auto& [c, k] : count)
      if (k == 1) l.output.push_back(c);
  }
  return l;
}

// The size of each label from the operands' dims, as inference sees them: a letter's static sizes must
// agree; an ellipsis dim of size 1 broadcasts.
inline std::map<int, Dim> label_dims(const Node& n, const Labels& l, const std::vector<const Shape*>& shapes) {
  std::map<int, Dim> dims;
  for (std::size_t i = 0; i < l.operands.size(); ++i)
    for (std::size_t a = 0; a < l.operands[i].size(); ++a) {
      const int lab = l.operands[i][a];
      const Dim& d = (*shapes[i])[a];
      auto [it, fresh] = dims.emplace(lab, d);
      if (fresh) continue;
      Dim& have = it->second;
      const bool broadcasts = lab >= kEllipsisLabel;
      if (broadcasts && d.is_static() && d.value == 1) continue;
      if (broadcasts && have.is_static() && have.value == 1) { have = d; continue; }
      if (have.is_static() && d.is_static() && have.value != d.value)
        throw n.error("label " + (lab < kEllipsisLabel ? "'" + std::string(1, static_cast<char>(lab)) + "'"
                                                        : "'...' dim " + std::to_string(lab - kEllipsisLabel)) +
                      " has sizes " + std::to_string(have.value) + " and " + std::to_string(d.value) +
                      " in equation '" + n.attr_string("equation") + "'");
      if (!have.is_static() && d.is_static()) have = d;
    }
  return dims;
}

inline void infer_einsum(Node& n) {
  const Equation eq = parse(n);
  DType t = DType::Undefined;
  bool ranks_known = true;
  std::vector<std::size_t> ranks;
  std::vector<const Shape*> shapes;
  for (std::size_t i = 0; i < n.num_inputs(); ++i) {
    const Value& v = required_input(n, i);
    detail_math::check_input_type(n, i, v.dtype(), detail_math::kNumericTypes);
    if (t == DType::Undefined) t = v.dtype();
    detail_math::check_same_type(n, 0, t, i, v.dtype());
    ranks_known = ranks_known && v.shape().rank_known();
    ranks.push_back(v.shape().rank());
    shapes.push_back(&v.shape());
  }
  if (!ranks_known) {
    // The output's rank follows from the letters alone when no operand has an ellipsis.
    const bool any_ellipsis = std::any_of(eq.inputs.begin(), eq.inputs.end(), [](const Term& x) { return x.ellipsis; });
    if (any_ellipsis) return set_output(n, 0, t, Shape::unknown());
    for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = eq.inputs[i].letters.size();
    const Labels l = label(n, eq, ranks);
    return set_output(n, 0, t, Shape(std::vector<Dim>(l.output.size(), Dim())));
  }
  const Labels l = label(n, eq, ranks);
  const std::map<int, Dim> dims = label_dims(n, l, shapes);
  std::vector<Dim> out;
  for (int lab : l.output) out.push_back(dims.at(lab));
  set_output(n, 0, t, Shape(out));
}

}  // namespace detail_einsum

inline void register_einsum_infer(InferTable& t) { t["Einsum"] = detail_einsum::infer_einsum; }

}  // namespace ondine::infer
