// Progress.h - parax-run's progress: on a terminal one line redrawn in place
// (a bar, then the text); piped, a line each time (what a log keeps). Under
// an MPI launcher always lines: Open MPI hands its ranks a pseudo-terminal
// for stdout whether or not mpirun's own output goes to one.

#ifndef PARAX_RUN_PROGRESS_H
#define PARAX_RUN_PROGRESS_H

#include "Options.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace parax::run {

class Progress {
public:
  explicit Progress(std::FILE *out = stdout)
      : out_(out), terminal_(isatty(fileno(out)) == 1 && !launchedByMpi()) {}
  ~Progress() { finish(); }
  /// `done` of the work in [0, 1], and what to say ("step 3 of 10: ...");
  /// `brief`, when given, instead of `text` on a terminal's one line.
  void show(double done, const std::string &text, const std::string &brief = "") {
    if (!terminal_) {
      std::fprintf(out_, "parax-run: %s\n", text.c_str());
    } else {
      constexpr int kWidth = 20;
      int filled = static_cast<int>(std::clamp(done, 0.0, 1.0) * kWidth + 0.5);
      std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
      // Cut to the terminal's width (a wrapped line is not redrawn in
      // place); \r and erase-to-end-of-line draw it again.
      std::string shown = brief.empty() ? text : brief;
      struct winsize size {};
      size_t room = ioctl(fileno(out_), TIOCGWINSZ, &size) == 0 && size.ws_col > 0 ? size.ws_col : 80;
      size_t used = std::string("[] ").size() + kWidth;
      shown = room > used + 1 ? shown.substr(0, room - used - 1) : std::string();
      std::fprintf(out_, "\r[%s] %s\033[K", bar.c_str(), shown.c_str());
      drawn_ = true;
    }
    std::fflush(out_);
  }
  /// Ends a line drawn in place (before anything else is printed).
  void finish() {
    if (drawn_) std::fputc('\n', out_), std::fflush(out_);
    drawn_ = false;
  }
  bool terminal() const { return terminal_; }

private:
  std::FILE *out_;
  bool terminal_;
  bool drawn_ = false;
};

} // namespace parax::run

#endif // PARAX_RUN_PROGRESS_H
