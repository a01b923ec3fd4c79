// A progress line on stderr for the example programs' long timed loops: one line, rewritten in
// place with a carriage return, shown only when stderr is a terminal (nothing at all otherwise,
// so logs, pipes and tests see exactly the program's output), and cleared when done.
#pragma once

#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include <unistd.h>

namespace specdec_examples {

/// True when stderr is a terminal.
[[nodiscard]] inline bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

/// One progress line on stderr (see the file comment). Updates come at most every 100 ms
/// unless forced, so calling update() from a hot loop costs a clock read. The destructor
/// clears the line.
class progress_line {
public:
    /// Shown when stderr is a terminal (or `enabled` says so).
    explicit progress_line(bool enabled = stderr_is_terminal()) : enabled_(enabled) {}
    progress_line(const progress_line&) = delete;
    progress_line& operator=(const progress_line&) = delete;
    ~progress_line() { clear(); }

    [[nodiscard]] bool enabled() const noexcept { return enabled_; }

    /// Rewrites the line with printf-style text (at most 200 characters are shown).
    /// Skipped when the last update is under 100 ms old, unless `force`.
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    void show(bool force, const char* format, ...) {
        if (!enabled_) return;
        const auto now = std::chrono::steady_clock::now();
        if (!force && now - last_ < std::chrono::milliseconds(100)) return;
        char text[201];
        va_list args;
        va_start(args, format);
        const int n = std::vsnprintf(text, sizeof text, format, args);
        va_end(args);
        if (n < 0) return;
        const std::size_t length = std::strlen(text);
        // Pad with spaces over what a longer previous text left.
        std::fprintf(stderr, "\r%s%*s", text, static_cast<int>(shown_ > length ? shown_ - length : 0), "");
        if (shown_ > length) std::fprintf(stderr, "\r%s", text);
        std::fflush(stderr);
        shown_ = length;
        last_ = now;
    }

    /// "LABEL: DONE/TOTAL UNIT", e.g. "plain: 30/64 tokens" (rate-limited, the last one forced).
    void count(const char* label, std::size_t done, std::size_t total, const char* unit = "tokens") {
        show(done >= total, "%s: %zu/%zu %s", label, done, total, unit);
    }

    /// Erases the line (before the program prints its results, or at the end).
    void clear() {
        if (!enabled_ || shown_ == 0) return;
        std::fprintf(stderr, "\r%*s\r", static_cast<int>(shown_), "");
        std::fflush(stderr);
        shown_ = 0;
    }

private:
    bool enabled_;
    std::size_t shown_ = 0;  // characters on the line now (0: nothing shown)
    std::chrono::steady_clock::time_point last_{};
};

}  // namespace specdec_examples
