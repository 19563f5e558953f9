// SPDX-License-Identifier: Apache-2.0
// ondine/passes/pass.hpp - what a pass is, and the context it runs in.
//
// A pass is a small type with a name and a run function that says whether it changed the graph:
//
//   struct RemoveIdentity {
//     static constexpr const char* name = "remove-identity";
//     bool run(Graph& g, PassContext& ctx);   // true when the graph changed
//   };
//
// Built-in and user passes are the same kind of thing: PassManager::add<P>() takes either, and a
// PassRegistry maps names to passes so pipelines can be written as strings ("fold-bn,fuse").
// Passes see only the IR (ondine/ir): never protobuf, never oneDNN.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "ondine/ir/graph.hpp"

namespace ondine {

// Shared by every pass of one PassManager::run: options for the passes, a log for remarks, and the
// count of rewrites the running pass applied (the manager reads and resets it per pass).
class PassContext {
 public:
  // Pass options as key=value strings ("layout" = "nhwc"); a pass documents the keys it reads.
  std::map<std::string, std::string> options;
  // Remarks ("fold-bn: folded 'bn1' into 'conv1'"); null: remarks are dropped.
  std::function<void(const std::string&)> log;

  std::string option(const std::string& key, const std::string& fallback = "") const {
    auto it = options.find(key);
    return it == options.end() ? fallback : it->second;
  }

  // A pass calls this once per rewrite it applies, with a one-line description.
  void rewrite(const std::string& what) {
    ++rewrites_;
    if (log) log(pass_ + ": " + what);
  }
  void remark(const std::string& what) const {
    if (log) log(pass_ + ": " + what);
  }
  std::size_t rewrites() const { return rewrites_; }

  // Set by the pass manager around each pass.
  void begin_pass(std::string name) {
    pass_ = std::move(name);
    rewrites_ = 0;
  }
  const std::string& current_pass() const { return pass_; }

 private:
  std::string pass_;
  std::size_t rewrites_ = 0;
};

namespace detail {

// The type-erased pass the manager holds; PassModel adapts any type with `name` and `run`.
class AnyPass {
 public:
  virtual ~AnyPass() = default;
  virtual std::string name() const = 0;
  virtual bool run(Graph& g, PassContext& ctx) = 0;
};

// What add<P>() needs of a pass type, checked with a readable message instead of a template backtrace.
template <typename P, typename = void>
struct has_pass_name : std::false_type {};
template <typename P>
struct has_pass_name<P, std::void_t<decltype(std::string(P::name))>> : std::true_type {};
template <typename P, typename = void>
struct has_pass_run : std::false_type {};
template <typename P>
struct has_pass_run<P, std::void_t<decltype(std::declval<P&>().run(std::declval<Graph&>(), std::declval<PassContext&>()))>>
    : std::is_convertible<decltype(std::declval<P&>().run(std::declval<Graph&>(), std::declval<PassContext&>())), bool> {};

template <typename P>
class PassModel final : public AnyPass {
  static_assert(has_pass_name<P>::value,
                "a pass needs `static constexpr const char* name = \"my-pass\";` (its name in pipelines)");
  static_assert(has_pass_run<P>::value,
                "a pass needs `bool run(Graph& g, PassContext& ctx)` returning true when it changed the graph");

 public:
  template <typename... Args>
  explicit PassModel(Args&&... args) : pass_(std::forward<Args>(args)...) {}
  std::string name() const override { return P::name; }
  bool run(Graph& g, PassContext& ctx) override { return pass_.run(g, ctx); }

 private:
  P pass_;
};

// A pass from a name and a function (pm.add("my-pass", [](Graph&, PassContext&) { ... })).
class FunctionPass final : public AnyPass {
 public:
  FunctionPass(std::string name, std::function<bool(Graph&, PassContext&)> fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  bool run(Graph& g, PassContext& ctx) override { return fn_(g, ctx); }

 private:
  std::string name_;
  std::function<bool(Graph&, PassContext&)> fn_;
};

}  // namespace detail
}  // namespace ondine
