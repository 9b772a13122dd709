#include "client/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace boulder::client {
namespace {

constexpr char kLossColor[] = "#1f77b4";
constexpr char kLrColor[] = "#ff7f0e";
constexpr char kValidationColor[] = "#2ca02c";
constexpr char kInk[] = "#333333";
constexpr char kGrid[] = "#e5e5e5";

struct XY {
  double x;
  double y;  // NaN: a gap
};

std::string Escape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The points, or the means of consecutive groups of them when there are more than `max`.
std::vector<XY> Thin(const std::vector<PlotPoint>& points, size_t max) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  std::vector<XY> out;
  const size_t n = points.size();
  const size_t group = max == 0 || n <= max ? 1 : (n + max - 1) / max;
  for (size_t lo = 0; lo < n; lo += group) {
    const size_t hi = std::min(n, lo + group);
    double steps = 0;
    double sum = 0;
    int finite = 0;
    for (size_t i = lo; i < hi; ++i) {
      steps += static_cast<double>(points[i].step);
      if (std::isfinite(points[i].value)) {
        sum += points[i].value;
        ++finite;
      }
    }
    out.push_back({steps / static_cast<double>(hi - lo), finite > 0 ? sum / finite : kNaN});
  }
  return out;
}

// Finite y range of the series; false when there is none.
bool YRange(const std::vector<const std::vector<XY>*>& series, double* lo, double* hi) {
  *lo = std::numeric_limits<double>::infinity();
  *hi = -*lo;
  for (const std::vector<XY>* s : series) {
    for (const XY& p : *s) {
      if (!std::isfinite(p.y)) continue;
      *lo = std::min(*lo, p.y);
      *hi = std::max(*hi, p.y);
    }
  }
  return *lo <= *hi;
}

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

// Maps data coordinates into the plot area.
struct Frame {
  double left;
  double top;
  double width;
  double height;
  AxisScale x;
  double X(double v) const { return left + (v - x.lo) / (x.hi - x.lo) * width; }
  static double Y(const AxisScale& s, double v, double top, double height) {
    return top + height - (v - s.lo) / (s.hi - s.lo) * height;
  }
};

// One polyline per run of finite points (a lone point becomes a dot), with `attributes`.
std::string Curve(const std::vector<XY>& points, const Frame& f, const AxisScale& y,
                  absl::string_view css_class, absl::string_view attributes) {
  std::string out;
  std::vector<std::string> run;
  auto flush = [&] {
    if (run.size() == 1) {
      const size_t comma = run[0].find(',');
      absl::StrAppend(&out, "<circle class=\"", css_class, "\" cx=\"", run[0].substr(0, comma),
                      "\" cy=\"", run[0].substr(comma + 1), "\" r=\"2\" ", attributes, "/>\n");
    } else if (run.size() > 1) {
      absl::StrAppend(&out, "<polyline class=\"", css_class, "\" fill=\"none\" ", attributes,
                      " points=\"");
      for (size_t i = 0; i < run.size(); ++i) absl::StrAppend(&out, i ? " " : "", run[i]);
      absl::StrAppend(&out, "\"/>\n");
    }
    run.clear();
  };
  for (const XY& p : points) {
    if (!std::isfinite(p.y)) {
      flush();
      continue;
    }
    run.push_back(absl::StrCat(Num(f.X(p.x)), ",", Num(Frame::Y(y, p.y, f.top, f.height))));
  }
  flush();
  return out;
}

std::string Text(double x, double y, absl::string_view anchor, absl::string_view text,
                 absl::string_view extra = "") {
  return absl::StrCat("<text x=\"", Num(x), "\" y=\"", Num(y), "\" text-anchor=\"", anchor, "\"",
                      extra.empty() ? "" : " ", extra, ">", Escape(text), "</text>\n");
}

std::string Line(double x1, double y1, double x2, double y2) {
  return absl::StrCat("<line x1=\"", Num(x1), "\" y1=\"", Num(y1), "\" x2=\"", Num(x2), "\" y2=\"",
                      Num(y2), "\"/>\n");
}

}  // namespace

AxisScale NiceScale(double lo, double hi, int max_ticks) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, max_ticks);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  // The tolerance keeps e.g. 3e-4 / 6 from rounding past 5e-5 into the next step size.
  constexpr double kEps = 1e-9;
  const double nice = norm <= 1 + kEps ? 1 : norm <= 2 + kEps ? 2 : norm <= 5 + kEps ? 5 : 10;
  AxisScale s;
  s.step = nice * magnitude;
  // The tolerance keeps values that are a multiple of the step up to rounding on the tick.
  s.lo = std::floor(lo / s.step + 1e-9) * s.step;
  s.hi = std::ceil(hi / s.step - 1e-9) * s.step;
  const int count = static_cast<int>(std::lround((s.hi - s.lo) / s.step)) + 1;
  for (int i = 0; i < count; ++i) {
    double t = s.lo + i * s.step;
    if (std::fabs(t) < s.step * 1e-9) t = 0;  // no "-0"
    s.ticks.push_back(t);
  }
  return s;
}

std::string TickLabel(double value, double step) {
  if (step < 1e-3) return value == 0 ? "0" : absl::StrFormat("%.1e", value);
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return absl::StrFormat("%.*f", decimals, value);
}

std::string RenderLossSvg(const PlotData& data, const SvgPlotOptions& options) {
  const std::vector<XY> loss = Thin(data.loss, options.max_points);
  const std::vector<XY> validation = Thin(data.validation, options.max_points);
  const std::vector<XY> lr = Thin(data.lr, options.max_points);
  const bool has_lr =
      std::any_of(lr.begin(), lr.end(), [](const XY& p) { return std::isfinite(p.y) && p.y != 0; });
  const bool has_validation = !validation.empty();

  const double w = options.width;
  const double h = options.height;
  Frame f;
  f.left = 80;
  f.top = 50;
  f.width = std::max(10.0, w - f.left - (has_lr ? 90 : 30));
  f.height = std::max(10.0, h - f.top - 60);

  // Steps start at 1; the axis starts at 0 so that runs compare at a glance.
  double xmax = 1;
  for (const std::vector<XY>* s : {&loss, &validation, &lr}) {
    for (const XY& p : *s) xmax = std::max(xmax, p.x);
  }
  f.x = NiceScale(0, xmax, 8);
  if (f.x.step < 1) f.x = NiceScale(0, std::max(xmax, 8.0), 8);

  double ylo = 0;
  double yhi = 1;
  if (!YRange({&loss, &validation}, &ylo, &yhi)) {
    ylo = 0;
    yhi = 1;
  }
  const AxisScale y = NiceScale(ylo, yhi, 6);
  double lr_lo = 0;
  double lr_hi = 1;
  if (!has_lr || !YRange({&lr}, &lr_lo, &lr_hi)) {
    lr_lo = 0;
    lr_hi = 1;
  }
  // The learning rate axis starts at 0: warm-up and decay read as fractions of the peak.
  const AxisScale y_lr = NiceScale(std::min(0.0, lr_lo), lr_hi, 6);

  const double right = f.left + f.width;
  const double bottom = f.top + f.height;
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  absl::StrAppend(&svg, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", options.width,
                  "\" height=\"", options.height, "\" viewBox=\"0 0 ", options.width, " ",
                  options.height, "\" font-family=\"sans-serif\" font-size=\"12\">\n");
  absl::StrAppend(&svg, "<title>", Escape(data.title), "</title>\n");
  absl::StrAppend(&svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  svg += Text(w / 2, 28, "middle", data.title, "font-size=\"16\"");

  // Grid lines at the ticks.
  absl::StrAppend(&svg, "<g stroke=\"", kGrid, "\" stroke-width=\"1\">\n");
  for (double t : y.ticks) {
    const double py = Frame::Y(y, t, f.top, f.height);
    svg += Line(f.left, py, right, py);
  }
  for (double t : f.x.ticks) svg += Line(f.X(t), f.top, f.X(t), bottom);
  svg += "</g>\n";

  // Axes, tick marks and tick labels.
  absl::StrAppend(&svg, "<g stroke=\"", kInk, "\" stroke-width=\"1\">\n");
  svg += Line(f.left, f.top, f.left, bottom);
  svg += Line(f.left, bottom, right, bottom);
  if (has_lr) svg += Line(right, f.top, right, bottom);
  for (double t : y.ticks) {
    const double py = Frame::Y(y, t, f.top, f.height);
    svg += Line(f.left - 5, py, f.left, py);
  }
  for (double t : f.x.ticks) svg += Line(f.X(t), bottom, f.X(t), bottom + 5);
  if (has_lr) {
    for (double t : y_lr.ticks) {
      const double py = Frame::Y(y_lr, t, f.top, f.height);
      svg += Line(right, py, right + 5, py);
    }
  }
  svg += "</g>\n";
  absl::StrAppend(&svg, "<g fill=\"", kInk, "\">\n");
  for (double t : y.ticks) {
    svg += Text(f.left - 8, Frame::Y(y, t, f.top, f.height) + 4, "end", TickLabel(t, y.step));
  }
  for (double t : f.x.ticks) svg += Text(f.X(t), bottom + 18, "middle", TickLabel(t, f.x.step));
  if (has_lr) {
    for (double t : y_lr.ticks) {
      svg +=
          Text(right + 8, Frame::Y(y_lr, t, f.top, f.height) + 4, "start", TickLabel(t, y_lr.step));
    }
  }
  svg += Text(f.left + f.width / 2, h - 18, "middle", "step");
  const double mid = f.top + f.height / 2;
  svg += Text(0, 0, "middle", "loss",
              absl::StrCat("transform=\"translate(", Num(22), " ", Num(mid), ") rotate(-90)\""));
  if (has_lr) {
    svg +=
        Text(0, 0, "middle", "learning rate",
             absl::StrCat("transform=\"translate(", Num(w - 16), " ", Num(mid), ") rotate(90)\""));
  }
  svg += "</g>\n";

  // The curves, learning rate first so that the loss is drawn on top of it.
  if (has_lr) {
    svg += Curve(
        lr, f, y_lr, "lr",
        absl::StrCat("stroke=\"", kLrColor, "\" stroke-width=\"1.5\" stroke-dasharray=\"6 3\""));
  }
  svg += Curve(
      loss, f, y, "loss",
      absl::StrCat("stroke=\"", kLossColor, "\" stroke-width=\"1.5\" stroke-linejoin=\"round\""));
  if (has_validation) {
    svg += Curve(validation, f, y, "validation",
                 absl::StrCat("stroke=\"", kValidationColor, "\" stroke-width=\"2\""));
  }

  // The legend, in the top right corner of the plot area.
  struct Entry {
    const char* label;
    const char* color;
    const char* dash;
  };
  std::vector<Entry> entries = {{"training loss", kLossColor, ""}};
  if (has_validation) entries.push_back({"validation loss", kValidationColor, ""});
  if (has_lr) entries.push_back({"learning rate", kLrColor, "6 3"});
  absl::StrAppend(&svg, "<g class=\"legend\">\n");
  double ly = f.top + 16;
  for (const Entry& e : entries) {
    const double lx = right - 150;
    absl::StrAppend(&svg, "<line x1=\"", Num(lx), "\" y1=\"", Num(ly - 4), "\" x2=\"", Num(lx + 24),
                    "\" y2=\"", Num(ly - 4), "\" stroke=\"", e.color, "\" stroke-width=\"2\"",
                    *e.dash ? absl::StrCat(" stroke-dasharray=\"", e.dash, "\"") : "", "/>\n");
    svg += Text(lx + 30, ly, "start", e.label, absl::StrCat("fill=\"", kInk, "\""));
    ly += 18;
  }
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace boulder::client
