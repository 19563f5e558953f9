// examples/cli/progress.hpp - one progress line on the terminal for long work (calibration, the error-bound
// searches, compiling, timed runs): rewritten in place on stderr at most ten times a second and erased when
// the work ends, so the output that stays is the results; work done within half a second shows none. Nothing is printed when stderr is not a terminal
// (piped, redirected to a file, CI logs) or with --quiet.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

namespace ondine::cli {

// --quiet: no progress lines, whatever stderr is.
inline bool& progress_quiet() {
  static bool quiet = false;
  return quiet;
}

inline bool progress_enabled() {
  static const bool tty = [] {
    const char* term = std::getenv("TERM");
    return isatty(STDERR_FILENO) != 0 && !(term && std::string(term) == "dumb");
  }();
  return tty && !progress_quiet();
}

class ProgressLine {
 public:
  explicit ProgressLine(std::string label) : label_(std::move(label)), enabled_(progress_enabled()) {}
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;
  ~ProgressLine() { clear(); }

  // `done` of `total` (unknown total: nullopt), and what is being done now.
  void update(std::size_t done, std::optional<std::size_t> total, const std::string& what = "") {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::milliseconds(500)) return;  // quick work shows nothing
    if (shown_ && now - last_ < std::chrono::milliseconds(100) && !(total && done == *total)) return;
    last_ = now;
    std::string line = label_ + ": " + std::to_string(done);
    if (total) {
      line += "/" + std::to_string(*total);
      if (*total > 0) line += " (" + std::to_string(done * 100 / *total) + "%)";
    }
    if (!what.empty()) line += " " + what;
    if (line.size() > 100) line = line.substr(0, 97) + "...";
    std::fprintf(stderr, "\r%s\033[K", line.c_str());
    std::fflush(stderr);
    shown_ = true;
  }

  // Erases the line (the next output starts at the beginning of an empty line).
  void clear() {
    if (!shown_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  std::string label_;
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
};

}  // namespace ondine::cli
