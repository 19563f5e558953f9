// SPDX-License-Identifier: Apache-2.0
// ondine/passes/pass_manager.hpp - runs a sequence of passes over a graph, and names passes for pipelines.
//
//   PassManager pm;
//   pm.add<FoldBatchNorm>();                       // a built-in pass
//   pm.add<MyPass>(/*constructor args*/);          // a user's pass: any type with `name` and `run`
//   pm.add("strip-names", [](Graph& g, PassContext& ctx) { ...; return changed; });
//   pm.add_pipeline("fold-constants,fuse*", pass_registry());   // '*': repeat until nothing changes
//   pm.run(graph);
//   std::cout << pm.summary_text();               // time, nodes before/after, rewrites per pass
//
// Debugging options (PassManager::Options): verify the graph after every pass (on by default; a
// pass that breaks the graph is named in the error), dump the graph before/after a named pass, and
// stop after the first N pass executions to bisect a miscompile.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ondine/error.hpp"
#include "ondine/ir/graph.hpp"
#include "ondine/passes/pass.hpp"

namespace ondine {

// Names -> pass factories, so pipelines can be strings. pass_registry() (ondine/passes/pipeline.hpp)
// is the process-wide one with every built-in pass; users add theirs with add<MyPass>().
class PassRegistry {
 public:
  using Factory = std::function<std::unique_ptr<detail::AnyPass>()>;

  template <typename P>
  PassRegistry& add() {
    return add(P::name, [] { return std::unique_ptr<detail::AnyPass>(new detail::PassModel<P>()); });
  }
  PassRegistry& add(const std::string& name, Factory make) {
    if (name.empty() || name.find_first_of(", *\t\n") != std::string::npos)
      throw Error("pass name '" + name + "' is not valid (non-empty, no commas, spaces or '*')");
    if (name == "none" || name == "default")
      throw Error("pass name '" + name + "' is reserved (pipelines use it for no passes / the default pipeline)");
    factories_[name] = std::move(make);
    return *this;
  }
  bool contains(const std::string& name) const { return factories_.count(name) != 0; }
  std::unique_ptr<detail::AnyPass> create(const std::string& name) const {
    auto it = factories_.find(name);
    if (it == factories_.end()) {
      std::string known;
      for (auto& [n, f] : factories_) known += (known.empty() ? "" : ", ") + n;
      std::string hint = name == "quantize" || name == "quantize-dynamic"
                             ? " (the quantization passes are registered when a model compiles, or by calling "
                               "ondine::lower::register_quantization_passes())"
                             : "";
      throw Error("unknown pass '" + name + "'" + hint + " (known passes: " + known + ")");
    }
    return it->second();
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (auto& [n, f] : factories_) out.push_back(n);
    return out;
  }

 private:
  std::map<std::string, Factory> factories_;
};

// What one execution of a pass did.
struct PassRecord {
  std::string name;
  std::size_t iteration = 1;  // > 1 for repeats of a '*' entry
  double ms = 0;
  std::size_t nodes_before = 0, nodes_after = 0;
  std::size_t subgraph_nodes_before = 0, subgraph_nodes_after = 0;  // in If branches and Loop/Scan bodies
  std::size_t rewrites = 0;
  bool changed = false;
};

class PassManager {
 public:
  struct Options {
    bool verify_each = true;            // Graph::verify() after every pass
    std::size_t max_iterations = 16;    // step limit of a repeated ('*') entry
    std::size_t stop_after = 0;         // > 0: stop after this many pass executions (bisecting)
    std::set<std::string> dump_before;  // pass names whose input graph is dumped
    std::set<std::string> dump_after;   // pass names whose output graph is dumped
    bool dump_dot = false;              // dumps as Graphviz DOT instead of text
    // Where dumps go (a title line, then the graph); default: stderr.
    std::function<void(const std::string& title, const std::string& graph)> dump;
  };

  PassManager() = default;
  explicit PassManager(Options options) : options_(std::move(options)) {}

  Options& options() { return options_; }
  PassContext& context() { return ctx_; }

  // Adds a pass of type P (constructed from args); with `repeat`, it runs until it reports no change.
  template <typename P, typename... Args>
  PassManager& add(Args&&... args) {
    entries_.push_back({std::make_unique<detail::PassModel<P>>(std::forward<Args>(args)...), false});
    return *this;
  }
  template <typename P, typename... Args>
  PassManager& add_repeated(Args&&... args) {
    entries_.push_back({std::make_unique<detail::PassModel<P>>(std::forward<Args>(args)...), true});
    return *this;
  }
  PassManager& add(const std::string& name, std::function<bool(Graph&, PassContext&)> fn, bool repeat = false) {
    if (name.empty()) throw Error("PassManager::add: a pass needs a name");
    if (!fn) throw Error("PassManager::add: pass '" + name + "' has no function");
    entries_.push_back({std::make_unique<detail::FunctionPass>(name, std::move(fn)), repeat});
    return *this;
  }
  PassManager& add(std::unique_ptr<detail::AnyPass> pass, bool repeat = false) {
    if (!pass) throw Error("PassManager::add: null pass");
    entries_.push_back({std::move(pass), repeat});
    return *this;
  }
  // Appends "name,name*,..." (a '*' suffix repeats that pass until nothing changes, up to
  // max_iterations). Blanks around names are ignored; "" and "none" add nothing; an empty entry
  // ("a,,b") or an unknown name throws, the latter listing the known names. Nothing is added when
  // any entry is bad.
  PassManager& add_pipeline(const std::string& pipeline, const PassRegistry& registry) {
    std::vector<Entry> parsed;
    for (auto& [name, repeat] : parse_pipeline(pipeline)) parsed.push_back({registry.create(name), repeat});
    for (auto& e : parsed) entries_.push_back(std::move(e));
    return *this;
  }

  // "a, b*" -> {{"a", false}, {"b", true}}; "" and "none" -> {}.
  static std::vector<std::pair<std::string, bool>> parse_pipeline(const std::string& pipeline) {
    auto trim = [](const std::string& s) {
      auto first = s.find_first_not_of(" \t\n\r");
      return first == std::string::npos ? std::string() : s.substr(first, s.find_last_not_of(" \t\n\r") - first + 1);
    };
    std::vector<std::pair<std::string, bool>> out;
    const std::string all = trim(pipeline);
    if (all.empty() || all == "none") return out;
    std::size_t start = 0;
    while (true) {
      std::size_t comma = all.find(',', start);
      std::string name = trim(all.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (name.empty()) throw Error("pipeline '" + pipeline + "' has an empty entry");
      bool repeat = name.back() == '*';
      if (repeat) name = trim(name.substr(0, name.size() - 1));
      if (name.empty()) throw Error("pipeline '" + pipeline + "' has a '*' without a pass name");
      out.emplace_back(name, repeat);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  // The pipeline as a string, in the syntax add_pipeline reads.
  std::string pipeline() const {
    std::string s;
    for (auto& e : entries_) s += (s.empty() ? "" : ",") + e.pass->name() + (e.repeat ? "*" : "");
    return s;
  }
  std::size_t size() const { return entries_.size(); }

  // Runs every entry in order; returns true when any pass changed the graph. Throws an Error naming
  // the pass when a pass throws or leaves an invalid graph (with verify_each).
  bool run(Graph& g) {
    records_.clear();
    bool any = false;
    std::size_t executed = 0;
    for (auto& e : entries_) {
      for (std::size_t it = 1;; ++it) {
        if (options_.stop_after && executed >= options_.stop_after) return any;
        bool changed = run_one(*e.pass, g, it);
        ++executed;
        any |= changed;
        if (!e.repeat || !changed) break;
        if (it >= options_.max_iterations) {
          ctx_.remark("still changing after " + std::to_string(it) + " iterations; stopping (max_iterations)");
          break;
        }
      }
    }
    return any;
  }

  const std::vector<PassRecord>& records() const { return records_; }

  // One line per pass execution: name, time, nodes before -> after, rewrites.
  std::string summary_text() const {
    std::ostringstream os;
    double total = 0;
    char line[256];
    std::snprintf(line, sizeof line, "%-22s %9s %15s %9s\n", "pass", "time ms", "nodes", "rewrites");
    os << line;
    for (auto& r : records_) {
      std::string name = r.name + (r.iteration > 1 ? " #" + std::to_string(r.iteration) : "");
      std::string nodes = std::to_string(r.nodes_before) + " -> " + std::to_string(r.nodes_after);
      std::snprintf(line, sizeof line, "%-22s %9.2f %15s %9zu", name.c_str(), r.ms, nodes.c_str(), r.rewrites);
      os << line;
      if (r.subgraph_nodes_before || r.subgraph_nodes_after)
        os << "   subgraphs: " << r.subgraph_nodes_before << " -> " << r.subgraph_nodes_after << " nodes";
      os << "\n";
      total += r.ms;
    }
    std::snprintf(line, sizeof line, "%-22s %9.2f\n", "total", total);
    os << line;
    return os.str();
  }

 private:
  struct Entry {
    std::unique_ptr<detail::AnyPass> pass;
    bool repeat = false;
  };

  bool run_one(detail::AnyPass& pass, Graph& g, std::size_t iteration) {
    const std::string name = pass.name();
    auto dump = [&](const char* when) {
      std::string title = "// graph " + std::string(when) + " pass '" + name + "'";
      std::string text = options_.dump_dot ? g.to_dot() : g.to_text();
      if (options_.dump)
        options_.dump(title, text);
      else
        std::fprintf(stderr, "%s\n%s\n", title.c_str(), text.c_str());
    };
    if (options_.dump_before.count(name)) dump("before");
    PassRecord rec;
    rec.name = name;
    rec.iteration = iteration;
    rec.nodes_before = g.num_nodes();
    rec.subgraph_nodes_before = subgraph_nodes(g);
    ctx_.begin_pass(name);
    auto t0 = std::chrono::steady_clock::now();
    try {
      rec.changed = pass.run(g, ctx_);
      rec.changed = run_in_subgraphs(pass, g) || rec.changed;
    } catch (const Error& e) {
      Error wrapped("pass '" + name + "' failed: " + e.message());
      if (!e.node().empty() || !e.op().empty()) wrapped.at_node(e.node(), e.op());
      throw wrapped;
    } catch (const std::exception& e) {
      throw Error("pass '" + name + "' failed: " + e.what());
    }
    rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    rec.nodes_after = g.num_nodes();
    rec.subgraph_nodes_after = subgraph_nodes(g);
    rec.rewrites = ctx_.rewrites();
    // A pass that rewrote something but says it changed nothing would stop a '*' entry early.
    rec.changed = rec.changed || rec.rewrites > 0;
    records_.push_back(rec);
    if (options_.dump_after.count(name)) dump("after");  // before verifying: the broken graph is what to look at
    // Verified whatever the pass answered: a pass that edits the graph and returns false is a bug too.
    if (options_.verify_each) {
      if (auto problem = g.check()) throw Error("pass '" + name + "' left an invalid graph: " + *problem);
    }
    return rec.changed;
  }

  // Passes see into subgraphs: each runs on every If branch and Loop/Scan body too (nested ones
  // included), after the graph that holds them, so a BatchNormalization inside a branch folds like one
  // outside. A subgraph is a graph like any other to a pass: its captures are inputs, its outputs stay.
  static std::size_t subgraph_nodes(const Graph& g) {
    std::size_t count = 0;
    for (Node* n : g.nodes())
      for (auto& [attr, sub] : n->subgraphs()) count += sub->num_nodes() + subgraph_nodes(*sub);
    return count;
  }

  bool run_in_subgraphs(detail::AnyPass& pass, Graph& g) {
    bool changed = false;
    for (Node* n : g.nodes())
      for (auto& [attr, sub] : n->subgraphs()) {
        changed = pass.run(*sub, ctx_) || changed;
        changed = run_in_subgraphs(pass, *sub) || changed;
      }
    return changed;
  }

  Options options_;
  PassContext ctx_;
  std::vector<Entry> entries_;
  std::vector<PassRecord> records_;
};

}  // namespace ondine
