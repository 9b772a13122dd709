#include "client/progress.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "client/table.h"

namespace boulder::client {
namespace {

constexpr int kMaxBarCells = 40;
constexpr int kMinBarCells = 10;
// Eighth blocks, index k = k/8 of a cell filled.
constexpr const char* kPartial[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
constexpr const char* kFull = "█";
constexpr const char* kEmpty = "░";

double Fraction(const v1::StepReport& r) {
  if (r.total_steps() <= 0) return 0;
  return std::clamp(static_cast<double>(r.step()) / static_cast<double>(r.total_steps()), 0.0, 1.0);
}

std::string Bar(double fraction, int cells) {
  // The epsilon keeps products such as 0.6 * 40 * 8 from flooring to one eighth less.
  int eighths = static_cast<int>(std::floor(fraction * cells * 8 + 1e-9));
  int full = eighths / 8;
  int partial = eighths % 8;
  std::string out = "[";
  for (int i = 0; i < full; ++i) out += kFull;
  int used = full;
  if (partial > 0) {
    out += kPartial[partial];
    ++used;
  }
  for (int i = used; i < cells; ++i) out += kEmpty;
  out += "]";
  return out;
}

std::string StepText(const v1::StepReport& r) {
  return absl::StrCat("step ", r.step(), "/", r.total_steps());
}

std::string LossText(const v1::StepReport& r) {
  if (r.has_val_loss()) return absl::StrFormat("loss %.4f  val %.4f", r.loss(), r.val_loss());
  return absl::StrFormat("loss %.4f", r.loss());
}

std::string LrText(const v1::StepReport& r) { return absl::StrFormat("lr %.1e", r.lr()); }

std::string RateText(const v1::StepReport& r) {
  return absl::StrCat(WithThousands(std::llround(r.tokens_per_second())), " tok/s");
}

std::string EtaText(absl::Duration eta) { return absl::StrCat("ETA ", ClockDuration(eta)); }

}  // namespace

std::string RenderProgressBar(const v1::StepReport& report, absl::Duration eta, int width) {
  const std::string step = StepText(report);
  const std::string loss = LossText(report);
  const std::string lr = LrText(report);
  const std::string rate = RateText(report);
  const std::string eta_text = EtaText(eta);
  // Tails from the most to the least detailed.
  const std::string tails[] = {
      absl::StrCat(loss, "  ", lr, "  ", rate, "  ", eta_text),
      absl::StrCat(loss, "  ", rate, "  ", eta_text),
      absl::StrCat(loss, "  ", eta_text),
  };
  const int usable = width - 1;
  for (const std::string& tail : tails) {
    // "STEP [" + bar + "] " + tail
    int cells = usable - static_cast<int>(DisplayWidth(step) + DisplayWidth(tail)) - 4;
    if (cells >= kMinBarCells) {
      return absl::StrCat(step, " ", Bar(Fraction(report), std::min(cells, kMaxBarCells)), " ",
                          tail);
    }
  }
  std::string plain = absl::StrCat(step, " ", tails[2]);
  if (usable > 0 && static_cast<int>(plain.size()) > usable) plain.resize(usable);
  return plain;
}

std::string RenderProgressLine(const v1::StepReport& report, absl::Duration eta) {
  return absl::StrCat(StepText(report), " (", static_cast<int>(std::floor(Fraction(report) * 100)),
                      "%)  ", LossText(report), "  ", LrText(report), "  ", RateText(report), "  ",
                      EtaText(eta));
}

std::string StepTimeText(double seconds) {
  if (seconds < 1) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string RankStepTimesLine(const std::map<int32_t, double>& seconds_by_rank, int width) {
  std::vector<std::string> parts;
  for (const auto& [rank, seconds] : seconds_by_rank) {
    parts.push_back(absl::StrCat("rank ", rank, ": ", StepTimeText(seconds)));
  }
  const size_t usable = width > 1 ? static_cast<size_t>(width - 1) : 0;
  std::string all = absl::StrJoin(parts, "  ");
  if (all.size() <= usable) return all;
  for (size_t shown = parts.size() - 1; shown > 0; --shown) {
    std::string line = absl::StrCat(absl::StrJoin(parts.begin(), parts.begin() + shown, "  "),
                                    "  +", parts.size() - shown, " more");
    if (line.size() <= usable) return line;
  }
  all.resize(usable);
  return all;
}

int ChartRowsFor(int height) {
  const int rows = std::min(8, (height - 4) / 3);
  return rows >= 2 ? rows : 0;
}

void EtaEstimator::Add(const v1::StepReport& report) {
  double sample = report.step_time_seconds();
  absl::Time time = ToAbslTime(report.time());
  if (sample <= 0 && last_time_ != absl::InfinitePast() && time != absl::InfinitePast() &&
      report.step() > last_step_) {
    sample =
        absl::ToDoubleSeconds(time - last_time_) / static_cast<double>(report.step() - last_step_);
  }
  if (sample > 0) {
    constexpr double kAlpha = 0.3;
    seconds_per_step_ =
        seconds_per_step_ == 0 ? sample : kAlpha * sample + (1 - kAlpha) * seconds_per_step_;
  }
  step_ = report.step();
  total_ = report.total_steps();
  last_step_ = report.step();
  last_time_ = time;
}

absl::Duration EtaEstimator::Eta() const {
  if (total_ > 0 && step_ >= total_) return absl::ZeroDuration();
  if (seconds_per_step_ <= 0 || total_ <= 0) return absl::InfiniteDuration();
  return absl::Seconds(seconds_per_step_ * static_cast<double>(total_ - step_));
}

StepLineThrottle::StepLineThrottle(absl::Duration min_interval, double min_fraction)
    : min_interval_(min_interval), min_fraction_(min_fraction) {}

bool StepLineThrottle::ShouldPrint(int64_t step, int64_t total, absl::Time now) {
  bool print = !printed_any_ || (total > 0 && step >= total && step != last_step_) ||
               now - last_time_ >= min_interval_ ||
               (total > 0 && static_cast<double>(step - last_step_) >=
                                 min_fraction_ * static_cast<double>(total));
  if (print) {
    printed_any_ = true;
    last_step_ = step;
    last_time_ = now;
  }
  return print;
}

}  // namespace boulder::client
