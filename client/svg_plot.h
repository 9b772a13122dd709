// The SVG of `boulder plot`: a job's training loss (and validation loss, when step reports
// carry one) against the step on the left axis, and the learning rate on a right axis, with
// ticks, labels, grid lines, a title and a legend. Hand-written SVG 1.1 (no dependency) that
// browsers, GitHub and image tools show.
//
// Pure functions; thread-safe.
#ifndef BOULDER_CLIENT_SVG_PLOT_H_
#define BOULDER_CLIENT_SVG_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace boulder::client {

struct PlotPoint {
  int64_t step = 0;
  double value = 0;  // non-finite values break the curve there
};

struct PlotData {
  std::string title;                  // e.g. "job 7 · minigpt (SUCCEEDED)"; escaped on output
  std::vector<PlotPoint> loss;        // training loss, by increasing step
  std::vector<PlotPoint> lr;          // learning rate; no right axis when empty or all zero
  std::vector<PlotPoint> validation;  // validation loss; not drawn when empty
};

struct SvgPlotOptions {
  int width = 960;   // pixels
  int height = 540;  // pixels
  // Curves with more points are drawn from the means of consecutive groups of points, so
  // that a long run gives a file of a few hundred KiB rather than tens of MiB.
  size_t max_points = 4000;
};

// An axis range with round tick values: lo <= the data's minimum, hi >= its maximum, ticks
// every `step` (1, 2 or 5 times a power of ten) from lo to hi inclusive, at most
// max_ticks + 1 of them. An empty or one-value range is widened around the value first.
struct AxisScale {
  double lo = 0;
  double hi = 1;
  double step = 1;
  std::vector<double> ticks;
};
// REQUIRES: lo and hi finite, max_ticks >= 1.
AxisScale NiceScale(double lo, double hi, int max_ticks);

// A tick label with as many decimals as `step` needs: (0.5, 0.1) -> "0.5", (250, 50) ->
// "250"; scientific for steps under 1e-3: (3e-4, 1e-4) -> "3.0e-04", (0, 1e-4) -> "0".
std::string TickLabel(double value, double step);

// The whole SVG document, starting with the XML declaration. `data.loss` must not be empty
// for a useful plot; an empty one still yields a well-formed document with empty axes.
std::string RenderLossSvg(const PlotData& data, const SvgPlotOptions& options = {});

}  // namespace boulder::client

#endif  // BOULDER_CLIENT_SVG_PLOT_H_
