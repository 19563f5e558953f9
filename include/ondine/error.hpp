// SPDX-License-Identifier: Apache-2.0
// ondine/error.hpp - the one exception type of the library.
//
// Every failure that a user can cause (bad file, unsupported op, wrong input) is reported as an
// ondine::Error carrying where it happened: the file, the node and its op. Code that can add context
// while the error propagates catches, adds, and rethrows (see Error::in_file).
//
// Messages quote names taken from files (node, tensor, value and file names), which a malformed or
// hostile model can fill with any bytes. what() is therefore always one line of printable text:
// control bytes and bytes that are not part of valid UTF-8 are written as \xNN (escape_text), so an
// error printed to a terminal or a log cannot inject escape sequences or forge lines.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace ondine {

namespace detail {
// `text` with every control byte (below 0x20, and 0x7f) and every byte outside a well-formed UTF-8
// sequence written as \xNN; valid multi-byte characters are kept. Idempotent: the output is printable.
inline std::string escape_text(const std::string& text) {
  static const char* const hex = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) escape(c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (no overlong forms, no surrogates, <= U+10FFFF).
    std::size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) {
      unsigned char b = static_cast<unsigned char>(text[i + k]);
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xbf);
    }
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text, i, len);
    i += len;
  }
  return out;
}
}  // namespace detail

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(message), message_(std::move(message)) {
    rebuild();
  }

  // Builder-style context setters, usable in a throw expression:
  //   throw Error("bad axis").at_node(node.name(), node.op_type());
  Error& at_node(std::string node, std::string op) {
    node_ = std::move(node);
    op_ = std::move(op);
    rebuild();
    return *this;
  }
  Error& in_file(std::string file) {
    if (file_.empty()) file_ = std::move(file);
    rebuild();
    return *this;
  }

  const std::string& message() const noexcept { return message_; }
  const std::string& file() const noexcept { return file_; }
  const std::string& node() const noexcept { return node_; }
  const std::string& op() const noexcept { return op_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  void rebuild() {
    what_.clear();
    if (!file_.empty()) what_ += file_ + ": ";
    if (!op_.empty() || !node_.empty()) {
      what_ += "node '" + node_ + "' (" + op_ + "): ";
    }
    what_ += message_;
    what_ = detail::escape_text(what_);
  }

  std::string message_, file_, node_, op_, what_;
};

namespace detail {
// Throws an Error when `cond` is false. Used for invariants a user can break with bad input.
inline void check(bool cond, const std::string& message) {
  if (!cond) throw Error(message);
}
}  // namespace detail

}  // namespace ondine
