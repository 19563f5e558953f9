// ondine/error.hpp - the one exception type of the library.
//
// Every failure that a user can cause (bad file, unsupported op, wrong input) is reported as an
// ondine::Error carrying where it happened: the file, the node and its op. Code that can add context
// while the error propagates catches, adds, and rethrows (see Error::in_file).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace ondine {

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
