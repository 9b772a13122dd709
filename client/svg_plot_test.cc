#include "client/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace boulder::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// A small XML well-formedness check: tags nest and close in order under one root, attribute
// quotes pair up, '<' never appears in text and every '&' starts an entity. Returns "" when
// well-formed, else what is wrong.
std::string XmlProblem(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string entity = xml.substr(i, semi == std::string::npos ? 8 : semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "bare & at " + std::to_string(i);
      }
    }
    if (xml[i] != '<') {
      ++i;
      continue;
    }
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(i + 1, end - i - 1);
    i = end + 1;
    size_t quotes = 0;
    for (char c : tag) quotes += c == '"';
    if (quotes % 2 != 0) return "unbalanced quotes in <" + tag + ">";
    if (tag.find('<') != std::string::npos) return "'<' inside <" + tag + ">";
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "unexpected </" + name + ">";
      open.pop_back();
      continue;
    }
    const bool self_closing = !tag.empty() && tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" /\n"));
    if (open.empty()) ++roots;
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "expected one root element, got " + std::to_string(roots);
  return "";
}

// The `points` attribute of each polyline of `css_class`, split into "x,y" pairs.
std::vector<std::vector<std::string>> Polylines(const std::string& svg,
                                                const std::string& css_class) {
  std::vector<std::vector<std::string>> out;
  const std::string start = "<polyline class=\"" + css_class + "\"";
  for (size_t at = svg.find(start); at != std::string::npos; at = svg.find(start, at + 1)) {
    const size_t p = svg.find("points=\"", at) + 8;
    const std::string points = svg.substr(p, svg.find('"', p) - p);
    std::vector<std::string> pairs = absl::StrSplit(points, ' ');
    out.push_back(std::move(pairs));
  }
  return out;
}

PlotData Decay(int steps) {
  PlotData data;
  data.title = "job 7 · minigpt (SUCCEEDED)";
  for (int s = 1; s <= steps; ++s) {
    data.loss.push_back({s, 4.5 * std::exp(-s / 50.0)});
    data.lr.push_back({s, 3e-4 * std::min(1.0, s / 20.0)});
  }
  return data;
}

TEST(XmlProblemTest, CatchesWhatItChecks) {
  EXPECT_EQ(XmlProblem("<a><b/></a>"), "");
  EXPECT_EQ(XmlProblem("<a><b></a>"), "unexpected </a>");
  EXPECT_EQ(XmlProblem("<a>x & y</a>"), "bare & at 5");
  EXPECT_EQ(XmlProblem("<a x=\"1></a>"), "unbalanced quotes in <a x=\"1>");
  EXPECT_EQ(XmlProblem("<a/><b/>"), "expected one root element, got 2");
}

TEST(RenderLossSvgTest, WellFormedWithOneLossPointPerStepReport) {
  const std::string svg = RenderLossSvg(Decay(250));
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_EQ(svg.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg ", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("xmlns=\"http://www.w3.org/2000/svg\""));
  const auto loss = Polylines(svg, "loss");
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_EQ(loss[0].size(), 250u);
  const auto lr = Polylines(svg, "lr");
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr[0].size(), 250u);
  // Axes titles, the right axis for the learning rate, the legend and the title.
  EXPECT_THAT(svg, HasSubstr(">step</text>"));
  EXPECT_THAT(svg, HasSubstr(">loss</text>"));
  EXPECT_THAT(svg, HasSubstr(">learning rate</text>"));
  EXPECT_THAT(svg, HasSubstr(">training loss</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>job 7 · minigpt (SUCCEEDED)</title>"));
  // Ticks: steps 0..250 every 50, loss 0..5 every 1, lr 0..3e-4 every 5e-5.
  EXPECT_THAT(svg, HasSubstr(">250</text>"));
  EXPECT_THAT(svg, HasSubstr(">5</text>"));
  EXPECT_THAT(svg, HasSubstr(">3.0e-04</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("validation")));
}

TEST(RenderLossSvgTest, FirstAndLastPointsSitOnTheAxesCorners) {
  // Default 960x540, margins: left 80, right 90 (lr axis), top 50, bottom 60, so the plot is
  // x 80..870, y 50..480. Steps 0..250 and loss 0..5 (the nice ranges around the data).
  PlotData data = Decay(250);
  data.loss.front() = {0, 5};
  data.loss.back() = {250, 0};
  const auto loss = Polylines(RenderLossSvg(data), "loss");
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_EQ(loss[0].front(), "80.00,50.00");
  EXPECT_EQ(loss[0].back(), "870.00,480.00");
}

TEST(RenderLossSvgTest, NonFiniteLossBreaksTheCurve) {
  PlotData data = Decay(10);
  data.loss[4].value = std::numeric_limits<double>::quiet_NaN();
  data.loss[9].value = std::numeric_limits<double>::infinity();
  const std::string svg = RenderLossSvg(data);
  EXPECT_EQ(XmlProblem(svg), "");
  const auto loss = Polylines(svg, "loss");
  ASSERT_EQ(loss.size(), 2u);
  EXPECT_EQ(loss[0].size(), 4u);  // steps 1-4
  EXPECT_EQ(loss[1].size(), 4u);  // steps 6-9
}

TEST(RenderLossSvgTest, EscapesTheTitleAndDrawsValidationWhenGiven) {
  PlotData data = Decay(20);
  data.title = "job 8 · a<b & \"c\"";
  data.validation = {{10, 1.0}, {20, 0.5}};
  const std::string svg = RenderLossSvg(data);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_THAT(svg, HasSubstr("<title>job 8 · a&lt;b &amp; &quot;c&quot;</title>"));
  EXPECT_EQ(Polylines(svg, "validation").size(), 1u);
  EXPECT_THAT(svg, HasSubstr(">validation loss</text>"));
}

TEST(RenderLossSvgTest, NoLearningRateAxisWhenItIsZero) {
  PlotData data = Decay(20);
  for (PlotPoint& p : data.lr) p.value = 0;
  const std::string svg = RenderLossSvg(data);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_THAT(svg, Not(HasSubstr("learning rate")));
  EXPECT_TRUE(Polylines(svg, "lr").empty());
}

TEST(RenderLossSvgTest, LongRunsAreThinnedToMeansOfGroups) {
  SvgPlotOptions options;
  options.max_points = 4000;
  const auto loss = Polylines(RenderLossSvg(Decay(10000), options), "loss");
  ASSERT_EQ(loss.size(), 1u);
  EXPECT_EQ(loss[0].size(), 3334u);  // groups of ceil(10000 / 4000) = 3
}

TEST(RenderLossSvgTest, OnePointAndNoPointsStayWellFormed) {
  PlotData one;
  one.loss = {{1, 4.5}};
  const std::string svg = RenderLossSvg(one);
  EXPECT_EQ(XmlProblem(svg), "");
  EXPECT_THAT(svg, HasSubstr("<circle class=\"loss\""));
  EXPECT_EQ(XmlProblem(RenderLossSvg(PlotData())), "");
}

TEST(NiceScaleTest, RoundTicksCoveringTheData) {
  AxisScale s = NiceScale(0.05, 4.6, 5);
  EXPECT_DOUBLE_EQ(s.step, 1);
  EXPECT_THAT(s.ticks, ElementsAre(0, 1, 2, 3, 4, 5));
  s = NiceScale(0, 250, 8);
  EXPECT_DOUBLE_EQ(s.step, 50);
  EXPECT_THAT(s.ticks, ElementsAre(0, 50, 100, 150, 200, 250));
  s = NiceScale(0, 3e-4, 6);
  EXPECT_NEAR(s.step, 5e-5, 1e-18);
  EXPECT_EQ(s.ticks.size(), 7u);
  EXPECT_NEAR(s.hi, 3e-4, 1e-15);
}

TEST(NiceScaleTest, OneValueIsWidened) {
  AxisScale s = NiceScale(2, 2, 5);
  EXPECT_NEAR(s.lo, 1.8, 1e-12);
  EXPECT_NEAR(s.hi, 2.2, 1e-12);
  EXPECT_NEAR(s.step, 0.1, 1e-12);
  EXPECT_EQ(s.ticks.size(), 5u);
  s = NiceScale(0, 0, 4);
  EXPECT_NEAR(s.lo, -1, 1e-12);
  EXPECT_NEAR(s.hi, 1, 1e-12);
}

TEST(TickLabelTest, DecimalsFollowTheStep) {
  EXPECT_EQ(TickLabel(0.5, 0.1), "0.5");
  EXPECT_EQ(TickLabel(250, 50), "250");
  EXPECT_EQ(TickLabel(1.25, 0.05), "1.25");
  EXPECT_EQ(TickLabel(3e-4, 1e-4), "3.0e-04");
  EXPECT_EQ(TickLabel(0, 1e-4), "0");
}

}  // namespace
}  // namespace boulder::client
