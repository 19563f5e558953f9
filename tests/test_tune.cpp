// The tuner (lower/tune.hpp): which knobs it tries for a model, that a caller's setting is kept, the cache
// (a second tune times nothing; another CPU's entry or a corrupt file is not trusted), and that the tuned
// plan computes what the reference does. Which alternative wins depends on the CPU: not checked here
// (bench/ measures it).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ondine/lower/lower.hpp"
#include "ondine/lower/artifact.hpp"
#include "ondine/lower/int8_plan.hpp"
#include "ondine/lower/tune.hpp"
#include "ondine/reference/executor.hpp"
#include "support.hpp"

namespace test_tune {

using namespace ondine;

// Two 3x3 convolutions (Winograd candidates) and a Linear layer: every float knob applies.
Graph conv_and_linear() {
  test::GraphBuilder b;
  Value* x = b.input("x", {1, 16, 12, 12});
  std::map<std::string, Attribute> same{{"pads", std::vector<std::int64_t>{1, 1, 1, 1}}};
  Value* y = b.op("Relu", {b.op("Conv", {x, b.weight({16, 16, 3, 3}), b.weight({16})}, same)});
  y = b.op("Conv", {y, b.weight({16, 16, 3, 3}), b.weight({16})}, same);
  y = b.op("GlobalAveragePool", {y});
  y = b.op("Flatten", {y});
  y = b.op("MatMul", {y, b.weight({16, 10})});
  b.g.add_output(y);
  infer_shapes(b.g);
  return std::move(b.g);
}

std::string temp_path(const std::string& name) {
  std::string p = std::string(ONDINE_TEST_TMP_DIR) + "/" + name;
  std::remove(p.c_str());
  return p;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST_CASE("tune: the knobs that apply, the plan it keeps equal to the reference, decisions in the cache", "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_basic.txt");
  t.runs = 1;
  std::vector<std::string> progress;
  t.progress = [&](const std::string& s) { progress.push_back(s); };
  lower::TuneResult r = lower::tune(g, {}, t);
  INFO(r.text());
  CHECK_FALSE(r.from_cache);
  std::map<std::string, std::string> knobs;
  for (const auto& d : r.decisions) knobs[d.knob] = d.value;
  CHECK(knobs.count("conv_layout") == 1);
  CHECK(knobs.count("conv_algorithm") == 1);
  CHECK(knobs.count("matmul_kernel") == 1);
  CHECK(knobs.count("precision") == 1);  // fp32 given (the default): the caller's
  CHECK(r.options.precision == lower::Precision::Fp32);
  CHECK_FALSE(progress.empty());
  CHECK(r.text().find("conv_algorithm = ") != std::string::npos);

  // The kept plan computes what the reference does (Winograd within its rounding).
  auto in = test::uniform_tensor({1, 16, 12, 12}, 3);
  auto want = ReferenceExecutor(g).run({{"x", in}});
  auto got = lower::compile(g, r.options).run({{"x", in}});
  CHECK(test::relative_error(got.begin()->second, want.begin()->second) <= 1e-4);

  // The second tune of the same model on this machine is a cache hit: the same decisions, nothing timed.
  const std::string file = read_all(t.cache_path);
  CHECK(file.rfind("ondine-tune 1\n", 0) == 0);
  CHECK(file.find(r.key) != std::string::npos);
  progress.clear();
  lower::TuneResult again = lower::tune(g, {}, t);
  CHECK(again.from_cache);
  CHECK(again.decisions_str() == r.decisions_str());
  CHECK(again.options.conv_algorithm == r.options.conv_algorithm);
  CHECK(again.options.conv_layout == r.options.conv_layout);
  REQUIRE(progress.size() == 1);
  CHECK(progress[0].find("from the cache") != std::string::npos);
}

TEST_CASE("tune: a knob the caller set is not tuned; precision auto makes bf16 a candidate where it is native",
          "[tune]") {
  Graph g = conv_and_linear();
  lower::CompileOptions forced;
  forced.conv_algorithm = lower::ConvAlgorithm::Direct;
  forced.precision = lower::Precision::Auto;
  lower::TuneOptions t;
  t.cache_path = "none";
  t.runs = 1;
  lower::TuneResult r = lower::tune(g, forced, t);
  INFO(r.text());
  CHECK(r.options.conv_algorithm == lower::ConvAlgorithm::Direct);
  bool saw_precision = false;
  for (const auto& d : r.decisions) {
    if (d.knob == "conv_algorithm") {
      CHECK(d.value == "direct");
      CHECK(d.why == "set by the caller");
    }
    if (d.knob == "precision") {
      saw_precision = true;
      CHECK((d.value == "fp32" || d.value == "bf16"));
    }
  }
  CHECK(saw_precision == lower::effective_isa().bf16_native);
  CHECK(r.options.precision != lower::Precision::Auto);  // resolved
}

TEST_CASE("tune: the thread split runs a plan on fewer threads, computes the same, and applies only at the count "
          "it was measured at",
          "[tune]") {
  Graph g = conv_and_linear();
  auto in = test::uniform_tensor({1, 16, 12, 12}, 5);
  const auto want = ReferenceExecutor(g).run({{"x", in}});
  lower::CompileOptions two;
  two.threads = 2;
  lower::CompileOptions split = two;
  split.plan_threads = 1;
  CHECK(lower::plan_thread_count(two) == 2);
  CHECK(lower::plan_thread_count(split) == 1);
  CompiledModel on_one = lower::compile(g, split);
  CHECK(on_one.program().threads == 1);
  CHECK(lower::compile(g, two).program().threads == 2);
  CHECK(test::relative_error(on_one.run({{"x", in}}).begin()->second, want.begin()->second) <= 1e-4);

  // The tuner tries it at 2 threads (its value names the count), not at 1; a caller's split is kept.
  lower::TuneOptions t;
  t.cache_path = "none";
  t.runs = 1;
  std::map<std::string, std::string> knobs;
  for (const auto& d : lower::tune(g, two, t).decisions) knobs[d.knob] = d.value;
  REQUIRE(knobs.count("threads") == 1);
  CHECK((knobs["threads"] == "all" || knobs["threads"] == "1/2"));
  lower::CompileOptions one;
  one.threads = 1;
  knobs.clear();
  for (const auto& d : lower::tune(g, one, t).decisions) knobs[d.knob] = d.value;
  CHECK(knobs.count("threads") == 0);
  const lower::TuneResult kept = lower::tune(g, split, t);
  CHECK(kept.options.plan_threads == 1);
  CHECK(kept.key.find(";threads=1/2") != std::string::npos);

  // Stored in an artifact: it applies where the loader runs 2 threads, not 4; a caller's split wins.
  lower::CompileOptions at_two = two, at_four;
  at_four.threads = 4;
  lower::apply_tuned("threads=1/2", at_two);
  lower::apply_tuned("threads=1/2", at_four);
  CHECK(at_two.plan_threads == 1);
  CHECK(at_four.plan_threads == 0);
  lower::CompileOptions mine = two;
  mine.plan_threads = 2;
  lower::apply_tuned("threads=1/2", mine);
  CHECK(mine.plan_threads == 2);
  lower::CompileOptions all = two;
  lower::apply_tuned("threads=all", all);
  CHECK(all.plan_threads == 0);
  for (const char* bad : {"threads=2/2", "threads=0/2", "threads=one", "threads=1/2x"})
    CHECK_THROWS_WITH(lower::apply_tuned(bad, all), Catch::Contains(std::string(bad)));
}

TEST_CASE("tune cache: decisions made with a knob free are not reused where the caller fixed it", "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_fixed.txt");
  t.runs = 1;
  lower::CompileOptions free_options;
  free_options.threads = 1;
  lower::TuneResult free_run = lower::tune(g, free_options, t);
  lower::CompileOptions fixed = free_options;
  fixed.conv_algorithm = lower::ConvAlgorithm::Direct;
  lower::TuneResult fixed_run = lower::tune(g, fixed, t);
  CHECK_FALSE(fixed_run.from_cache);  // another key: ";conv_algorithm=direct"
  CHECK(fixed_run.key != free_run.key);
  CHECK(fixed_run.key.find(";conv_algorithm=direct") != std::string::npos);
  CHECK(lower::tune(g, fixed, t).from_cache);  // its own entry now
  CHECK(lower::tune(g, free_options, t).from_cache);
}

TEST_CASE("tune: no budget keeps the heuristics, saying so", "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = "none";
  t.budget_seconds = 0;
  lower::TuneResult r = lower::tune(g, {}, t);
  INFO(r.text());
  for (const auto& d : r.decisions)
    if (d.knob == "conv_layout") CHECK(d.why.find("budget ran out") != std::string::npos);
  CHECK(r.options.conv_layout == lower::ConvLayout::Auto);
}

TEST_CASE("tune cache: another CPU's entry is not applied, a corrupt file is ignored with a warning naming it",
          "[tune]") {
  Graph g = conv_and_linear();
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_foreign.txt");
  t.runs = 1;
  t.budget_seconds = 0;  // structure only
  std::vector<std::string> warnings;
  t.warn = [&](const std::string& s) { warnings.push_back(s); };
  lower::TuneResult first = lower::tune(g, {}, t);
  CHECK_FALSE(first.from_cache);

  // The same model, tuned on "another CPU": the entry's cpu= differs, so it never matches here.
  std::string file = read_all(t.cache_path);
  const std::size_t cpu = file.find(";cpu=");
  REQUIRE(cpu != std::string::npos);
  file.replace(cpu, 5, ";cpu=Other CPU ");
  std::ofstream(t.cache_path, std::ios::trunc) << file;
  CHECK_FALSE(lower::tune(g, {}, t).from_cache);
  CHECK(warnings.empty());

  // A corrupt file: a warning naming it, nothing trusted, rewritten at the end.
  std::ofstream(t.cache_path, std::ios::trunc) << "not a cache\nmodel=x\n";
  lower::TuneResult r = lower::tune(g, {}, t);
  CHECK_FALSE(r.from_cache);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find(t.cache_path) != std::string::npos);
  CHECK(read_all(t.cache_path).rfind("ondine-tune 1\n", 0) == 0);
  std::ofstream(t.cache_path, std::ios::trunc) << "ondine-tune 1\ngarbage line\n";
  warnings.clear();
  CHECK_FALSE(lower::tune(g, {}, t).from_cache);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("line 2") != std::string::npos);
}

TEST_CASE("tune: an input with symbolic dims is an error naming it", "[tune]") {
  Graph g;
  Value* x = g.add_input("tokens", DType::Float32, Shape{Dim::named("batch"), Dim(4)});
  g.add_output(g.add_node("Relu", {x}, {"y"}, {}, "relu")->output(0));
  lower::TuneOptions t;
  t.cache_path = "none";
  CHECK_THROWS_WITH(lower::tune(g, {}, t), Catch::Contains("'tokens'") && Catch::Contains("bind its symbolic dims"));
}

// The choice each step reports (StepInfo::choice), by the step's op: the first step of that op with one.
std::string choice_of(const CompiledModel& m, const std::string& op) {
  for (const auto& s : m.steps())
    if (s.op == op && !s.choice.empty()) return s.choice;
  return "";
}

TEST_CASE("per-step report: each alternative taken says whether a heuristic, the tuner or an option chose it",
          "[tune][report]") {
  Graph g = conv_and_linear();
  lower::CompileOptions options;
  options.threads = 1;
  const bool avx2 = lower::isa_runs_on(lower::CpuIsa::Avx2, lower::effective_isa().isa);

  CompiledModel heuristic = lower::compile(g, options);
  INFO(heuristic.to_text());
  if (avx2) CHECK(choice_of(heuristic, "Conv").find("layout blocked (heuristic)") != std::string::npos);
  CHECK(choice_of(heuristic, "MatMul").find("(heuristic)") != std::string::npos);
  CHECK(heuristic.to_text().find("[layout ") != std::string::npos);  // to_text (inspect --compiled) shows it

  lower::CompileOptions forced = options;
  forced.conv_algorithm = lower::ConvAlgorithm::Direct;
  forced.matmul_kernel = lower::MatMulKernel::Gemm;
  CompiledModel by_option = lower::compile(g, forced);
  INFO(by_option.to_text());
  if (avx2) CHECK(choice_of(by_option, "Conv").find("direct (option)") != std::string::npos);
  CHECK(choice_of(by_option, "MatMul") == "gemm (option)");

  // As an artifact's stored decisions (or lower::tune) set them: "tuned"; a caller's own setting still wins.
  lower::CompileOptions tuned = options;
  lower::apply_tuned("conv_algorithm=winograd,matmul_kernel=gemm", tuned);
  CHECK(tuned.choice_origins.at("conv_algorithm") == "tuned");
  CompiledModel by_tuner = lower::compile(g, tuned);
  INFO(by_tuner.to_text());
  if (avx2) CHECK(choice_of(by_tuner, "Conv").find("winograd (tuned)") != std::string::npos);
  CHECK(choice_of(by_tuner, "MatMul") == "gemm (tuned)");
  lower::CompileOptions caller = forced;
  lower::apply_tuned("conv_algorithm=winograd", caller);
  CHECK(caller.conv_algorithm == lower::ConvAlgorithm::Direct);
  CHECK(caller.choice_origins.count("conv_algorithm") == 0);

  if (lower::effective_isa().bf16_native) {  // the precision per step, and a node kept float32
    lower::CompileOptions bf16 = options;
    bf16.precision = lower::Precision::Bf16;
    bf16.keep_fp32 = {"MatMul*"};
    CompiledModel m = lower::compile(g, bf16);
    INFO(m.to_text());
    CHECK(choice_of(m, "Conv").find("bf16 (option)") != std::string::npos);
    CHECK(choice_of(m, "MatMul").find("fp32 (keep_fp32)") != std::string::npos);
    bf16.precision = lower::Precision::Auto;
    bf16.keep_fp32.clear();
    if (lower::effective_isa().bf16_faster)
      CHECK(choice_of(lower::compile(g, bf16), "Conv").find("bf16 (heuristic)") != std::string::npos);
  }
}

TEST_CASE("peak rates: measured on this CPU once, kept in the tune cache, a corrupt file measured over",
          "[tune][int8]") {
  const std::string path = temp_path("tune_cache_peak.txt");
  lower::PeakRates measured = lower::measure_peak_rates(path, /*store_under_load=*/true);
  INFO(measured.source);
  CHECK(measured.source.rfind("measured here", 0) == 0);  // "under load, not cached" while other tests run
  CHECK(measured.fp32 > 1e9);  // any CPU oneDNN runs on: over a GFLOP/s on one core
  CHECK(measured.int8 > 1e9);
  const std::string stored = read_all(path);
  CHECK(stored.find("\npeak;cpu=") != std::string::npos);
  CHECK(stored.find(";isa=" + std::string(lower::effective_isa().name) + "\tfp32=") != std::string::npos);

  // A second process reads them (a planted value shows it is not measured again); the tuner's own entries stay.
  const std::string key = stored.substr(stored.find("peak;"), stored.find('\t', stored.find("peak;")) - stored.find("peak;"));
  {
    std::ofstream out(path, std::ios::trunc);
    out << "ondine-tune 1\n" << key << "\tfp32=123.0,int8=456.0\n";
  }
  lower::PeakRates cached = lower::measure_peak_rates(path);
  CHECK(cached.fp32 == Approx(123e9));
  CHECK(cached.int8 == Approx(456e9));
  CHECK(cached.source == "measured here, cached in " + path);
  CHECK(lower::int8_plan(lower::compile(conv_and_linear()), cached).rates.fp32 == Approx(123e9));

  {  // another CPU's entry is not read; a file that does not parse is measured over and rewritten
    std::ofstream out(path, std::ios::trunc);
    out << "ondine-tune 1\npeak;cpu=Some Other CPU;isa=avx2\tfp32=1.0,int8=1.0\n";
  }
  CHECK(lower::measure_peak_rates(path, true).source.rfind("measured here", 0) == 0);
  CHECK(lower::measure_peak_rates(path, true).source == "measured here, cached in " + path);  // this CPU's now
  {
    std::ofstream out(path, std::ios::trunc);
    out << "not a cache\n";
  }
  CHECK(lower::measure_peak_rates(path, true).source.rfind("measured here", 0) == 0);
  CHECK(read_all(path).rfind("ondine-tune 1\n", 0) == 0);
  CHECK(lower::measure_peak_rates("none").source.rfind("measured here", 0) == 0);
}

TEST_CASE("tune per step: a node's own algorithm or precision, stored as decisions naming the node", "[tune][report]") {
  namespace tn = lower::detail::tune;
  CHECK(tn::decode_name(tn::encode_name("a,b=c@d%e\tf")) == "a,b=c@d%e\tf");
  CHECK(tn::encode_name("a,b") == "a%2Cb");
  Graph g = conv_and_linear();
  std::vector<std::string> convs;
  for (Node* n : g.topo_order())
    if (n->op_type() == "Conv") {  // unique names, one with the characters decisions separate on
      n->set_name(convs.empty() ? "stem,conv=1@a" : "conv2");
      convs.push_back(n->name());
    }
  REQUIRE(convs.size() == 2);
  auto step_choice = [](const CompiledModel& m, const std::string& name) {
    for (const auto& s : m.steps())
      if (s.name == name && !s.choice.empty()) return s.choice;
    return std::string();
  };
  lower::CompileOptions options;
  options.threads = 1;
  lower::CompileOptions o = options;
  lower::apply_tuned("conv_algorithm@" + tn::encode_name(convs[0]) + "=winograd,conv_algorithm@" +
                         tn::encode_name(convs[1]) + "=direct,matmul_kernel=gemm",
                     o);
  CHECK(o.conv_algorithm == lower::ConvAlgorithm::Auto);  // the model-wide setting stays the heuristic's
  CHECK(o.conv_algorithm_per_node.size() == 2);
  CompiledModel m = lower::compile(g, o);
  INFO(m.to_text());
  if (lower::isa_runs_on(lower::CpuIsa::Avx2, lower::effective_isa().isa)) {
    CHECK(step_choice(m, convs[0]).find("winograd (tuned)") != std::string::npos);
    CHECK(step_choice(m, convs[1]).find("direct (tuned)") != std::string::npos);
  }
  const auto inputs = tn::seeded_inputs(g, {});
  CHECK(tn::relative_error(m.run(inputs), ReferenceExecutor(g).run(inputs)) < 1e-4);
  CHECK_THROWS_WITH(lower::apply_tuned("conv_algorithm@x=sideways", o), Catch::Contains("conv_algorithm@x=sideways"));
  CHECK_THROWS(lower::apply_tuned("layout@x=any", o));

  if (lower::effective_isa().bf16_native) {  // one layer kept float32 by the tuner
    lower::CompileOptions b = options;
    b.precision = lower::Precision::Bf16;
    lower::apply_tuned("precision@" + tn::encode_name(convs[0]) + "=fp32", b);
    CompiledModel mb = lower::compile(g, b);
    INFO(mb.to_text());
    CHECK(step_choice(mb, convs[0]).find("fp32 (tuned)") != std::string::npos);
    CHECK(step_choice(mb, convs[1]).find("bf16 (option)") != std::string::npos);
  }

  // The cache keeps per-step decisions: a second tune applies them without timing anything.
  lower::TuneOptions t;
  t.cache_path = temp_path("tune_cache_per_step.txt");
  t.runs = 1;
  lower::TuneResult first = lower::tune(g, options, t);
  {
    std::ofstream out(t.cache_path, std::ios::trunc);
    out << "ondine-tune 1\n"
        << first.key << "\t" << first.decisions_str() << ",conv_algorithm@" << tn::encode_name(convs[1]) << "=direct\n";
  }
  lower::TuneResult again = lower::tune(g, options, t);
  INFO(again.text());
  CHECK(again.from_cache);
  CHECK(again.options.conv_algorithm_per_node.count(convs[1]) == 1);
  CHECK(again.decisions_str().find("conv_algorithm@" + tn::encode_name(convs[1]) + "=direct") != std::string::npos);
}

}  // namespace test_tune
