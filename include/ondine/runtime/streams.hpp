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
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

// How `requests` requests run: the number of streams, the threads of each, and each stream's cores (empty when
// not pinned).
struct StreamPlan {
  int streams = 1;
  int threads_per_stream = 1;
  std::vector<std::vector<int>> cpus;
};

inline StreamPlan plan_streams(const StreamOptions& options, std::size_t requests) {
  const std::vector<int> cpus = usable_cpus();
  const int total = options.threads > 0 ? options.threads : static_cast<int>(cpus.size());
  int streams = options.streams > 0 ? options.streams : total;
  streams = std::max(1, std::min<int>(streams, static_cast<int>(std::max<std::size_t>(requests, 1))));
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

// Runs `run(i)` for every request i in [0, requests) on the streams `plan` describes, and returns the results
// in request order. `run` is called from the streams' threads at once (it must be thread-safe, as a compiled
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
        results[i] = run(i);
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

}  // namespace ondine::runtime
