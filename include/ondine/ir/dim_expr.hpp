// SPDX-License-Identifier: Apache-2.0
// ondine/ir/dim_expr.hpp - arithmetic on symbolic dims: "seq*3", "batch*seq", "(H - 1)/2 + 1".
//
// A symbolic Dim's symbol is an integer polynomial over atoms in one canonical text form, so two dims
// are proved equal exactly when their texts are equal. Atoms are the model's own dim names ("batch",
// "seq") and the floor divisions or remainders that do not simplify ("(H - 1)/2", "(W)%8"), kept whole.
// Canonical form: terms in a fixed order (constant last), each "[c*]atom*atom...", joined by " + " or
// " - ". A name that does not read back as exactly itself in that form is one atom, so any dim name a
// model brings stays a plain symbol.
//
//   dim_add(Dim::named("seq"), 1)          -> "seq + 1"
//   dim_mul(Dim::named("seq"), 3)          -> "3*seq"
//   dim_floor_div(dim_sub(H, 1), 2)        -> "(H - 1)/2"    (H symbolic)
//   dim_floor_div(dim_mul(B, S), S)        -> "B"
//   dim_eval(d, {{"H", 13}})               -> the number, when every atom has a value
//
// Anything involving an unknown dim (Dim()) is unknown. Static operands give static results (unknown on
// overflow, division by zero or a negative result where a size is meant).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ondine/ir/shape.hpp"

namespace ondine {

namespace detail::dim_expr {

using Monomial = std::vector<std::string>;    // atoms, sorted; empty for the constant term
using Poly = std::map<Monomial, std::int64_t>;  // no zero coefficients

inline bool add_overflows(std::int64_t a, std::int64_t b, std::int64_t& r) { return __builtin_add_overflow(a, b, &r); }
inline bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t& r) { return __builtin_mul_overflow(a, b, &r); }

inline std::string print(const Poly& p) {
  std::string out;
  auto term = [](const Monomial& m, std::int64_t c) {
    std::string s;
    std::uint64_t mag = c < 0 ? 0 - static_cast<std::uint64_t>(c) : static_cast<std::uint64_t>(c);
    if (m.empty() || mag != 1) s = std::to_string(mag);
    for (auto& a : m) s += (s.empty() ? "" : "*") + a;
    return s;
  };
  auto emit = [&](const Monomial& m, std::int64_t c) {
    if (out.empty()) out = (c < 0 ? "-" : "") + term(m, c);
    else out += (c < 0 ? " - " : " + ") + term(m, c);
  };
  for (auto& [m, c] : p)
    if (!m.empty()) emit(m, c);
  if (auto it = p.find(Monomial{}); it != p.end()) emit(it->first, it->second);
  return out.empty() ? "0" : out;
}

// Splits `s` at top-level (outside parentheses) occurrences of `sep`.
inline std::vector<std::string> split_top(const std::string& s, const std::string& sep) {
  std::vector<std::string> parts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '(') ++depth;
    else if (s[i] == ')') --depth;
    else if (depth == 0 && s.compare(i, sep.size(), sep) == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + sep.size();
      i += sep.size() - 1;
    }
  }
  parts.push_back(s.substr(start));
  return parts;
}

inline std::optional<std::int64_t> parse_int(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  for (char ch : s)
    if (ch < '0' || ch > '9') return std::nullopt;
  return std::stoll(s);
}

inline void add_term(Poly& p, const Monomial& m, std::int64_t c, bool& overflow) {
  std::int64_t sum;
  if (add_overflows(p[m], c, sum)) overflow = true;
  if (sum == 0) p.erase(m);
  else p[m] = sum;
}

// Reads a symbol in canonical form; a text that does not print back as itself is one atom.
inline Poly parse(const std::string& s) {
  Poly atom{{Monomial{s}, 1}};
  if (s.empty()) return atom;
  // Turn " - " into " + -" at the top level so terms split on one separator.
  std::vector<std::string> pieces;
  for (auto& plus : split_top(s, " + ")) {
    auto minus = split_top(plus, " - ");
    pieces.push_back(minus[0]);
    for (std::size_t i = 1; i < minus.size(); ++i) pieces.push_back("-" + minus[i]);
  }
  Poly p;
  bool overflow = false;
  for (std::string t : pieces) {
    std::int64_t sign = 1;
    if (!t.empty() && t[0] == '-') {
      sign = -1;
      t = t.substr(1);
    }
    std::int64_t coeff = 1;
    Monomial m;
    auto factors = split_top(t, "*");
    for (std::size_t i = 0; i < factors.size(); ++i) {
      if (auto v = parse_int(factors[i]); v && i == 0) coeff = *v;
      else if (factors[i].empty()) return atom;
      else m.push_back(factors[i]);
    }
    std::sort(m.begin(), m.end());
    add_term(p, m, sign * coeff, overflow);
  }
  if (overflow || print(p) != s) return atom;
  return p;
}

// The polynomial of a dim, or nullopt for an unknown dim.
inline std::optional<Poly> of(const Dim& d) {
  if (d.is_static()) return d.value == 0 ? Poly{} : Poly{{Monomial{}, d.value}};
  if (d.symbol.empty()) return std::nullopt;
  return parse(d.symbol);
}

inline std::optional<Poly> add(Poly a, const Poly& b, std::int64_t sign) {
  bool overflow = false;
  for (auto& [m, c] : b) add_term(a, m, sign * c, overflow);
  if (overflow) return std::nullopt;
  return a;
}

inline std::optional<Poly> mul(const Poly& a, const Poly& b) {
  Poly out;
  bool overflow = false;
  for (auto& [ma, ca] : a)
    for (auto& [mb, cb] : b) {
      Monomial m = ma;
      m.insert(m.end(), mb.begin(), mb.end());
      std::sort(m.begin(), m.end());
      std::int64_t c;
      if (mul_overflows(ca, cb, c)) return std::nullopt;
      add_term(out, m, c, overflow);
    }
  if (overflow) return std::nullopt;
  return out;
}

// a / b when b divides every term of a exactly (b a single term), else nullopt.
inline std::optional<Poly> divide_exact(const Poly& a, const Poly& b) {
  if (b.size() != 1) return std::nullopt;
  const auto& [mb, cb] = *b.begin();
  Poly out;
  for (auto& [ma, ca] : a) {
    if (ca % cb != 0) return std::nullopt;
    Monomial rest = ma;
    for (auto& atom : mb) {
      auto it = std::find(rest.begin(), rest.end(), atom);
      if (it == rest.end()) return std::nullopt;
      rest.erase(it);
    }
    out[rest] = ca / cb;
  }
  return out;
}

inline std::string wrap(const Poly& p) { return "(" + print(p) + ")"; }

}  // namespace detail::dim_expr

// An integer known at compile time, as a number or as an expression over dim names; unlike a Dim it
// may be negative (Reshape's -1, Slice's -1 end). The elements of shape-like values (Value::element_dims
// stores them as SymInts). Unknown when neither is set.
struct SymInt {
  std::optional<std::int64_t> number;
  std::string expr;  // canonical (see above), when symbolic

  SymInt() = default;
  SymInt(std::int64_t v) : number(v) {}  // NOLINT: implicit, like Dim's
  static SymInt symbol(std::string e) {
    SymInt s;
    s.expr = std::move(e);
    return s;
  }
  static SymInt of(const Dim& d) {
    if (d.is_static()) return SymInt(d.value);
    return d.symbol.empty() ? SymInt() : symbol(d.symbol);
  }
  bool known() const { return number.has_value() || !expr.empty(); }
  bool is_number() const { return number.has_value(); }
  // As a dim: a number >= 0 or a symbol; negative numbers and unknowns are Dim().
  Dim as_dim() const {
    if (number) return *number >= 0 ? Dim(*number) : Dim();
    return expr.empty() ? Dim() : Dim::named(expr);
  }
  bool operator==(const SymInt& o) const { return number == o.number && expr == o.expr; }
  bool operator!=(const SymInt& o) const { return !(*this == o); }
  std::string str() const { return number ? std::to_string(*number) : (expr.empty() ? "?" : expr); }
};

namespace detail::dim_expr {
inline std::optional<Poly> of(const SymInt& s) {
  if (s.number) return *s.number == 0 ? Poly{} : Poly{{Monomial{}, *s.number}};
  if (s.expr.empty()) return std::nullopt;
  return parse(s.expr);
}
inline SymInt to_sym(const Poly& p) {
  if (p.empty()) return SymInt(0);
  if (p.size() == 1 && p.begin()->first.empty()) return SymInt(p.begin()->second);
  return SymInt::symbol(print(p));
}
template <typename Op>
inline SymInt binary(const SymInt& a, const SymInt& b, Op op) {
  auto pa = of(a), pb = of(b);
  if (!pa || !pb) return SymInt();
  auto r = op(*pa, *pb);
  return r ? to_sym(*r) : SymInt();
}
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
}  // namespace detail::dim_expr

inline SymInt sym_add(const SymInt& a, const SymInt& b) {
  return detail::dim_expr::binary(a, b, [](auto& x, auto& y) { return detail::dim_expr::add(x, y, 1); });
}
inline SymInt sym_sub(const SymInt& a, const SymInt& b) {
  return detail::dim_expr::binary(a, b, [](auto& x, auto& y) { return detail::dim_expr::add(x, y, -1); });
}
inline SymInt sym_mul(const SymInt& a, const SymInt& b) {
  return detail::dim_expr::binary(a, b, [](auto& x, auto& y) { return detail::dim_expr::mul(x, y); });
}
// floor(a / b). Symbolic only for a divisor known positive (a number > 0, or an expression, taken as a
// size): exact where it divides term by term, else an atom "(a)/b" (a taken as a size, >= 0).
inline SymInt sym_floor_div(const SymInt& a, const SymInt& b) {
  namespace de = detail::dim_expr;
  if (a.number && b.number) {
    if (*b.number == 0 || (*a.number == INT64_MIN && *b.number == -1)) return SymInt();
    return de::floor_div(*a.number, *b.number);
  }
  auto pa = de::of(a), pb = de::of(b);
  if (!pa || !pb || pb->empty() || (b.number && *b.number < 0)) return SymInt();
  if (auto q = de::divide_exact(*pa, *pb)) return de::to_sym(*q);
  if (pa->empty()) return SymInt(0);
  std::string divisor = b.number ? std::to_string(*b.number) : de::wrap(*pb);
  return SymInt::symbol(de::wrap(*pa) + "/" + divisor);
}
// a mod b with the sign of b (ONNX Mod with fmod=0, Python's %), symbolic as sym_floor_div.
inline SymInt sym_mod(const SymInt& a, const SymInt& b) {
  namespace de = detail::dim_expr;
  if (a.number && b.number) {
    if (*b.number == 0 || (*a.number == INT64_MIN && *b.number == -1)) return SymInt();
    std::int64_t r = *a.number % *b.number;
    return (r != 0 && ((r < 0) != (*b.number < 0))) ? r + *b.number : r;
  }
  auto pa = de::of(a), pb = de::of(b);
  if (!pa || !pb || pb->empty() || (b.number && *b.number < 0)) return SymInt();
  if (de::divide_exact(*pa, *pb)) return SymInt(0);
  std::string divisor = b.number ? std::to_string(*b.number) : de::wrap(*pb);
  return SymInt::symbol(de::wrap(*pa) + "%" + divisor);
}

inline Dim dim_add(const Dim& a, const Dim& b) { return sym_add(SymInt::of(a), SymInt::of(b)).as_dim(); }
// a - b; unknown when the result is a negative number (a dim never is).
inline Dim dim_sub(const Dim& a, const Dim& b) { return sym_sub(SymInt::of(a), SymInt::of(b)).as_dim(); }
inline Dim dim_mul(const Dim& a, const Dim& b) { return sym_mul(SymInt::of(a), SymInt::of(b)).as_dim(); }
inline Dim dim_floor_div(const Dim& a, const Dim& b) { return sym_floor_div(SymInt::of(a), SymInt::of(b)).as_dim(); }
inline Dim dim_mod(const Dim& a, const Dim& b) { return sym_mod(SymInt::of(a), SymInt::of(b)).as_dim(); }

namespace detail::dim_expr {
inline std::optional<std::int64_t> eval_poly(const Poly& p, const std::map<std::string, std::int64_t>& sizes);

// An atom's value: a bound name, or "(X)/Y", "(X)%Y" evaluated from its parts.
inline std::optional<std::int64_t> eval_atom(const std::string& atom, const std::map<std::string, std::int64_t>& sizes) {
  if (auto it = sizes.find(atom); it != sizes.end()) return it->second;
  if (atom.size() < 4 || atom[0] != '(') return std::nullopt;
  int depth = 0;
  std::size_t close = 0;
  for (std::size_t i = 0; i < atom.size(); ++i) {
    if (atom[i] == '(') ++depth;
    else if (atom[i] == ')' && --depth == 0) {
      close = i;
      break;
    }
  }
  if (close == 0 || close + 2 > atom.size() || (atom[close + 1] != '/' && atom[close + 1] != '%')) return std::nullopt;
  std::string rhs = atom.substr(close + 2);
  if (rhs.size() >= 2 && rhs.front() == '(' && rhs.back() == ')') rhs = rhs.substr(1, rhs.size() - 2);
  auto x = eval_poly(parse(atom.substr(1, close - 1)), sizes);
  auto y = eval_poly(parse(rhs), sizes);
  if (!x || !y || *y <= 0 || *x < 0) return std::nullopt;
  return atom[close + 1] == '/' ? *x / *y : *x % *y;
}

inline std::optional<std::int64_t> eval_poly(const Poly& p, const std::map<std::string, std::int64_t>& sizes) {
  std::int64_t total = 0;
  for (auto& [m, c] : p) {
    std::int64_t term = c;
    for (auto& atom : m) {
      auto v = eval_atom(atom, sizes);
      if (!v || mul_overflows(term, *v, term)) return std::nullopt;
    }
    if (add_overflows(total, term, total)) return std::nullopt;
  }
  return total;
}
}  // namespace detail::dim_expr

// The value's number once every name in it has a size; nullopt otherwise.
inline std::optional<std::int64_t> sym_eval(const SymInt& s, const std::map<std::string, std::int64_t>& sizes) {
  auto p = detail::dim_expr::of(s);
  if (!p) return std::nullopt;
  return detail::dim_expr::eval_poly(*p, sizes);
}
inline std::optional<std::int64_t> dim_eval(const Dim& d, const std::map<std::string, std::int64_t>& sizes) {
  return sym_eval(SymInt::of(d), sizes);
}

}  // namespace ondine
