// SPDX-License-Identifier: Apache-2.0
// ondine/runtime/streams.hpp - many requests through one model from N streams: each stream is a thread of its
// own with an OpenMP team of its own (its share of the threads), pinned to its own cores where the process may
// choose, running one request at a time. The streams share the model (its packed weights) and nothing else;
// requests are taken in order from one counter and their outputs returned in request order.
//
// Why: a small model at batch 1 spends much of a run synchronising its threads, and a run cannot use more
// cores than its work splits into; independent streams of one or a few threads keep every core on a request
// of its own (OpenVINO's THROUGHPUT hint; its LATENCY hint is one stream with every core).
//
// In a container the CPU set (sched_getaffinity) may list more cores than a CPU quota lets the process use;
// the streams then split the listed cores, and the quota, not the plan, limits what they get: pass
// StreamOptions::threads to match the quota.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "ondine/error.hpp"

namespace ondine::runtime {

struct StreamOptions {
  // How many streams (0: one per thread, i.e. streams of one thread; never more than there are requests).
  int streams = 0;
  // The threads of all streams together (0: the cores this process may run on); each stream gets an equal
  // share, at least one (`--streams 2 --threads 2`: two streams of one thread).
  int threads = 0;
  // Pin each stream (and its OpenMP team) to cores of its own, where the process's CPU set has enough.
  bool pin = true;
};

// The cores this process may run on (its CPU set), in order; at least one entry.
inline std::vector<int> usable_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

// What the streams are chosen for when StreamOptions::streams is not given (OpenVINO's performance hints).
// Latency: one stream with every thread (each request as fast as it goes). Throughput: streams of one thread;
// on 8 threads or more, streams of two threads for requests over kThroughputFlopsPerThread and of four over
// four times that (many streams of a large model hold many activations in the shared cache). On 2 cores, one-
// thread streams were measured faster at every size tried, MobileNetV2 (0.6 GFLOP) to U-Net at 512x512 (97
// GFLOP): docs/performance.md, "Throughput".
enum class Hint { Latency, Throughput };

inline const char* hint_name(Hint h) { return h == Hint::Latency ? "latency" : "throughput"; }

// The work of one request (floating-point operations) below which a throughput stream runs on one thread.
constexpr double kThroughputFlopsPerThread = 16e9;

// The StreamOptions `hint` gives for requests of `flops_per_request` operations (0: unknown, taken as small)
// over `threads` threads (0: the cores this process may run on).
inline StreamOptions options_for_hint(Hint hint, double flops_per_request, int threads = 0) {
  StreamOptions o;
  o.threads = threads > 0 ? threads : static_cast<int>(usable_cpus().size());
  if (hint == Hint::Latency) {
    o.streams = 1;
    return o;
  }
  const int per_stream = o.threads < 8                                      ? 1
                         : flops_per_request > 4 * kThroughputFlopsPerThread ? 4
                         : flops_per_request > kThroughputFlopsPerThread     ? 2
                                                                             : 1;
  o.streams = std::max(1, o.threads / per_stream);
  return o;
}

// How `requests` requests run: the number of streams, the threads of each, and each stream's cores (empty when
// not pinned).
struct StreamPlan {
  int streams = 1;
  int threads_per_stream = 1;
  std::vector<std::vector<int>> cpus;
};

// `requests`: how many there will be (never more streams than that); SIZE_MAX where unknown (a StreamPool).
inline StreamPlan plan_streams(const StreamOptions& options, std::size_t requests) {
  const std::vector<int> cpus = usable_cpus();
  const int total = options.threads > 0 ? options.threads : static_cast<int>(cpus.size());
  int streams = options.streams > 0 ? options.streams : total;
  if (requests < static_cast<std::size_t>(streams)) streams = static_cast<int>(std::max<std::size_t>(requests, 1));
  StreamPlan plan;
  plan.streams = streams;
  plan.threads_per_stream = std::max(1, total / streams);
  const std::size_t need = static_cast<std::size_t>(streams) * static_cast<std::size_t>(plan.threads_per_stream);
  if (options.pin && need <= cpus.size()) {
    plan.cpus.resize(static_cast<std::size_t>(streams));
    for (int s = 0; s < streams; ++s)
      for (int t = 0; t < plan.threads_per_stream; ++t)
        plan.cpus[static_cast<std::size_t>(s)].push_back(cpus[static_cast<std::size_t>(s * plan.threads_per_stream + t)]);
  }
  return plan;
}

namespace detail {
// Pins the calling thread to `cpus` (the OpenMP team it starts inherits the mask); false where the system refuses.
inline bool pin_this_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}
}  // namespace detail

// Runs `run(i, stream)` for every request i in [0, requests) on the streams `plan` describes (`stream`: which one,
// 0 to plan.streams - 1, for state a stream keeps, such as an execution context), and returns the results in
// request order. `run` is called from the streams' threads at once (it must be thread-safe, as a compiled
// model's run is), each with OpenMP set to its stream's share of the threads. The first exception a request
// throws stops the streams taking new requests and is rethrown here, once every stream has stopped.
template <typename Result, typename Run>
std::vector<Result> run_streams(std::size_t requests, const StreamPlan& plan, Run&& run) {
  std::vector<Result> results(requests);
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto stream = [&](int s, bool own_thread) {
    if (own_thread && !plan.cpus.empty()) detail::pin_this_thread(plan.cpus[static_cast<std::size_t>(s)]);
    omp_set_num_threads(plan.threads_per_stream);
    for (std::size_t i = next++; i < requests && !failed; i = next++) {
      try {
        results[i] = run(i, s);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  if (plan.streams <= 1) {
    // One stream: the calling thread runs it (no thread to start, no pinning), its OpenMP setting restored after.
    const int saved = omp_get_max_threads();
    stream(0, false);
    omp_set_num_threads(saved);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(plan.streams));
    for (int s = 0; s < plan.streams; ++s) threads.emplace_back(stream, s, true);
    for (std::thread& t : threads) t.join();
  }
  if (error) std::rethrow_exception(error);
  return results;
}

// Request i's error, naming it: "request 3 of 10: ...", its node, op and file kept.
inline Error request_error(const Error& e, std::size_t i, std::size_t n) {
  Error named("request " + std::to_string(i) + " of " + std::to_string(n) + ": " + e.message());
  if (!e.node().empty() || !e.op().empty()) named.at_node(e.node(), e.op());
  if (!e.file().empty()) named.in_file(e.file());
  return named;
}

// Streams that stay up and take requests as they come (a server's queue): `submit(f)` queues `f(stream)` and
// returns its future, which carries its result or the exception it threw (one request's failure is its own).
// Each stream is a thread of its own, pinned as `plan` says, with OpenMP set to its share of the threads.
// Requests run in the order submitted, each on the first stream free. The destructor runs what is queued, then
// stops the streams.
class StreamPool {
 public:
  explicit StreamPool(StreamPlan plan) : plan_(std::move(plan)) {
    threads_.reserve(static_cast<std::size_t>(plan_.streams));
    for (int s = 0; s < plan_.streams; ++s) threads_.emplace_back([this, s] { work(s); });
  }
  ~StreamPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  template <typename F>
  std::future<std::invoke_result_t<F&, int>> submit(F&& f) {
    using Result = std::invoke_result_t<F&, int>;
    auto task = std::make_shared<std::packaged_task<Result(int)>>(std::forward<F>(f));
    std::future<Result> result = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back([task](int stream) { (*task)(stream); });
    }
    ready_.notify_one();
    return result;
  }

  const StreamPlan& plan() const { return plan_; }

 private:
  void work(int s) {
    if (!plan_.cpus.empty()) detail::pin_this_thread(plan_.cpus[static_cast<std::size_t>(s)]);
    omp_set_num_threads(plan_.threads_per_stream);
    for (;;) {
      std::function<void(int)> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(s);  // a packaged_task: what it throws goes to its future
    }
  }

  StreamPlan plan_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void(int)>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ondine::runtime
