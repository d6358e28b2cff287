// Tests of the SVG bar charts: well-formed documents, bar lengths proportional to the values,
// stacks that end at their sums, escaped text, nice axes, and errors for charts that cannot be
// drawn.
#include "study/svg_chart.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;
using test_files::read_text;
using test_files::TempDir;

const double kNoBar = NAN;

// The attributes of every element that starts with `opening` ("<rect class=\"bar\""), in order.
std::vector<std::map<std::string, std::string>> elements(const std::string& svg,
                                                         const std::string& opening) {
  std::vector<std::map<std::string, std::string>> found;
  for (size_t at = svg.find(opening); at != std::string::npos; at = svg.find(opening, at + 1)) {
    const std::string tag = svg.substr(at, svg.find('>', at) - at);
    std::map<std::string, std::string> attributes;
    // Each attribute is ` name="value"`; values hold no '"', since text is escaped.
    for (size_t equals = tag.find("=\""); equals != std::string::npos;
         equals = tag.find("=\"", equals + 1)) {
      const size_t name_start = tag.rfind(' ', equals) + 1;
      const size_t value_end = tag.find('"', equals + 2);
      attributes[tag.substr(name_start, equals - name_start)] =
          tag.substr(equals + 2, value_end - equals - 2);
      equals = value_end;
    }
    found.push_back(attributes);
  }
  return found;
}

std::vector<std::map<std::string, std::string>> bars(const std::string& svg) {
  return elements(svg, "<rect class=\"bar\"");
}

double number(const std::map<std::string, std::string>& attributes, const std::string& name) {
  return std::stod(attributes.at(name));
}

// Every opening tag is closed in order; text cannot hold '<' or '>' since all of it is escaped.
::testing::AssertionResult well_formed(const std::string& svg) {
  std::vector<std::string> open;
  size_t at = svg.find("<svg");
  if (at == std::string::npos) return ::testing::AssertionFailure() << "no <svg> element";
  for (; at != std::string::npos; at = svg.find('<', at + 1)) {
    const size_t end = svg.find('>', at);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unclosed tag";
    const std::string tag = svg.substr(at + 1, end - at - 1);
    const std::string name =
        tag.substr(tag[0] == '/', tag.find_first_of(" />", 1) - (tag[0] == '/'));
    if (tag[0] == '/') {
      if (open.empty() || open.back() != name) {
        return ::testing::AssertionFailure() << "</" << name << "> does not close the open tag";
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(name);
    }
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> not closed";
  return ::testing::AssertionSuccess();
}

BarChart two_series_chart() {
  BarChart chart;
  chart.title = "peak memory";
  chart.value_label = "GB";
  chart.categories = {"default", "grads=pinned", "refused run"};
  chart.series = {{"device", {1, 2, kNoBar}}, {"host", {3, kNoBar, kNoBar}}};
  chart.notes = {"", "", "refused"};
  return chart;
}

TEST(SvgChart, DrawsOneBarPerValueAndNoneForNaN) {
  for (bool horizontal : {true, false}) {
    for (bool stacked : {false, true}) {
      BarChart chart = two_series_chart();
      chart.horizontal = horizontal;
      chart.stacked = stacked;
      const std::string svg = render_svg(chart);
      EXPECT_TRUE(well_formed(svg)) << svg;
      EXPECT_EQ(bars(svg).size(), 3u);
      EXPECT_EQ(elements(svg, "<rect class=\"legend\"").size(), 2u);
      EXPECT_TRUE(contains(svg, ">refused</text>"));  // the note of a category without bars
    }
  }
}

TEST(SvgChart, BarLengthIsProportionalToValue) {
  BarChart chart;
  chart.categories = {"one", "two", "zero"};
  chart.series = {{"time", {1, 2, 0}}};
  const auto across = bars(render_svg(chart));
  ASSERT_EQ(across.size(), 3u);
  EXPECT_NEAR(number(across[1], "width") / number(across[0], "width"), 2.0, 1e-3);
  EXPECT_EQ(number(across[2], "width"), 0.0);
  EXPECT_EQ(number(across[0], "x"), number(across[1], "x"));  // both start at the axis' 0
  EXPECT_EQ(across[1].at("data-value"), "2");

  chart.horizontal = false;
  const auto upright = bars(render_svg(chart));
  ASSERT_EQ(upright.size(), 3u);
  EXPECT_NEAR(number(upright[1], "height") / number(upright[0], "height"), 2.0, 1e-3);
  EXPECT_NEAR(number(upright[0], "y") + number(upright[0], "height"),
              number(upright[1], "y") + number(upright[1], "height"), 1e-2);  // common baseline
}

// With an axis limit, an outlier stops at the axis' end (with its real value) and the other bars
// keep the length they would have on that axis.
TEST(SvgChart, BarsPastTheAxisLimitStopAtItsEnd) {
  BarChart chart;
  chart.categories = {"one", "two", "outlier"};
  chart.series = {{"time", {1, 2, 40}}};
  chart.axis_limit = 2.0;
  const auto limited = bars(render_svg(chart));
  ASSERT_EQ(limited.size(), 3u);
  EXPECT_NEAR(number(limited[1], "width") / number(limited[0], "width"), 2.0, 1e-3);
  // The axis ends at nice_axis_max(2) = 2: the outlier's bar is as long as the bar of 2.
  EXPECT_NEAR(number(limited[2], "width"), number(limited[1], "width"), 1e-2);
  EXPECT_EQ(limited[2].at("data-value"), "40");
  EXPECT_TRUE(contains(render_svg(chart), ">40<"));  // its value is written at the end

  chart.axis_limit = 0.0;  // no limit: the axis reaches the outlier
  const auto whole = bars(render_svg(chart));
  EXPECT_NEAR(number(whole[2], "width") / number(whole[0], "width"), 40.0, 1e-2);
}

TEST(SvgChart, StackedSegmentsEndAtTheSum) {
  BarChart chart;
  chart.categories = {"stacked", "reference"};
  chart.series = {{"weights", {1, 3.5}}, {"grads", {2.5, kNoBar}}};
  chart.stacked = true;
  const auto segments = bars(render_svg(chart));
  ASSERT_EQ(segments.size(), 3u);  // stacked: 1 + 2.5; reference: 3.5 alone
  const auto &low = segments[0], &high = segments[1], &reference = segments[2];
  EXPECT_NEAR(number(low, "x") + number(low, "width"), number(high, "x"), 1e-2);
  EXPECT_NEAR(number(high, "x") + number(high, "width") - number(low, "x"),
              number(reference, "width"), 1e-2);
  EXPECT_EQ(number(low, "y"), number(high, "y"));
  EXPECT_EQ(high.at("data-series"), "grads");
}

TEST(SvgChart, EscapesAllText) {
  BarChart chart;
  chart.title = "a<b&c";
  chart.value_label = "\"ms\"";
  chart.categories = {"x>y"};
  chart.series = {{"s&t", {1}}, {"u", {2}}};
  chart.notes = {"<refused>"};
  const std::string svg = render_svg(chart);
  EXPECT_TRUE(well_formed(svg));
  EXPECT_TRUE(contains(svg, ">a&lt;b&amp;c</text>"));
  EXPECT_TRUE(contains(svg, "&quot;ms&quot;"));
  EXPECT_TRUE(contains(svg, "data-category=\"x&gt;y\" data-series=\"s&amp;t\""));
  EXPECT_TRUE(contains(svg, "&lt;refused&gt;"));
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
}

TEST(SvgChart, AxisEndsAtANiceMaximumWithFourToSixGridlines) {
  EXPECT_EQ(nice_axis_max(87), 100);
  EXPECT_EQ(nice_axis_max(0.0123), 0.02);
  EXPECT_EQ(nice_axis_max(2.4), 2.5);
  EXPECT_EQ(nice_axis_max(5), 5);
  EXPECT_EQ(nice_axis_max(0.05), 0.05);
  EXPECT_EQ(nice_axis_max(1000), 1000);
  EXPECT_EQ(nice_axis_max(1001), 2000);
  EXPECT_EQ(nice_axis_max(0), 1);
  for (double value = 1e-4; value < 1e7; value *= 1.37) {
    const double max = nice_axis_max(value);
    EXPECT_GE(max, value);
    EXPECT_LE(max, 2.01 * value);
  }

  BarChart chart;
  chart.categories = {"a"};
  chart.series = {{"time", {87}}};
  const std::string svg = render_svg(chart);
  const size_t gridlines = elements(svg, "<line class=\"grid\"").size();  // the one at 0 included
  EXPECT_GE(gridlines, 5u);
  EXPECT_LE(gridlines, 7u);
  EXPECT_TRUE(contains(svg, ">100</text>"));
  EXPECT_NEAR(number(bars(svg)[0], "width"), 0.87 * 420, 0.01);
}

TEST(SvgChart, FormatsValuesWithThreeSignificantDigits) {
  EXPECT_EQ(format_chart_value(0), "0");
  EXPECT_EQ(format_chart_value(12.345), "12.3");
  EXPECT_EQ(format_chart_value(1.5), "1.5");
  EXPECT_EQ(format_chart_value(0.0123), "0.0123");
  EXPECT_EQ(format_chart_value(1234), "1234");
  EXPECT_EQ(format_chart_value(0.015), "0.015");
  EXPECT_EQ(format_chart_value(2.5e7), "2.5e+07");
}

TEST(SvgChart, HighlightsOneCategory) {
  BarChart chart = two_series_chart();
  chart.highlight = 1;
  const std::string svg = render_svg(chart);
  EXPECT_EQ(elements(svg, "<rect class=\"highlight\"").size(), 1u);
  EXPECT_TRUE(contains(svg, "text-anchor=\"end\" font-weight=\"bold\">grads=pinned</text>"));
}

TEST(SvgChart, LongLabelsDoNotOverlap) {
  BarChart chart;
  for (int i = 0; i < 12; ++i)
    chart.categories.push_back("activations=pinned,grads=" + std::to_string(i));
  chart.series = {{"time", std::vector<double>(12, 1.0)}};
  for (bool horizontal : {true, false}) {
    chart.horizontal = horizontal;
    const auto labels = elements(render_svg(chart), "<text x=");
    std::vector<double> positions;
    for (const auto& label : labels) {
      if (label.count("class") && label.at("class") == "category") {
        positions.push_back(number(label, horizontal ? "y" : "x"));
      }
    }
    ASSERT_EQ(positions.size(), 12u);
    // A 12 px sans-serif character is at least 6 px wide and a line at least 12 px high.
    const double least_gap = horizontal ? 12 : 6.0 * chart.categories[0].size();
    for (size_t i = 1; i < positions.size(); ++i)
      EXPECT_GE(positions[i] - positions[i - 1], least_gap);
  }
}

TEST(SvgChart, RefusesChartsItCannotDraw) {
  BarChart negative = two_series_chart();
  negative.series[1].values[0] = -1;
  EXPECT_TRUE(contains(error_message([&] { render_svg(negative); }),
                       "series 'host' has the value -1 for 'default'"));
  BarChart infinite = two_series_chart();
  infinite.series[0].values[0] = INFINITY;
  EXPECT_TRUE(contains(error_message([&] { render_svg(infinite); }), "finite value >= 0"));
  BarChart short_series = two_series_chart();
  short_series.series[0].values.pop_back();
  EXPECT_TRUE(contains(error_message([&] { render_svg(short_series); }),
                       "series 'device' has 2 values for 3 categories"));
  BarChart notes = two_series_chart();
  notes.notes.pop_back();
  EXPECT_TRUE(contains(error_message([&] { render_svg(notes); }), "2 notes for 3 categories"));
  BarChart highlight = two_series_chart();
  highlight.highlight = 3;
  EXPECT_TRUE(contains(error_message([&] { render_svg(highlight); }), "highlight 3"));
  EXPECT_TRUE(contains(error_message([&] { render_svg(BarChart{}); }), "no categories"));
  EXPECT_TRUE(contains(error_message([&] { render_svg_panels({}, "modes"); }), "no charts"));
}

TEST(SvgChart, PanelsStandSideBySide) {
  std::vector<BarChart> panels(3);
  const char* titles[] = {"time", "energy", "memory"};
  for (int i = 0; i < 3; ++i) {
    panels[i].title = titles[i];
    panels[i].horizontal = false;
    panels[i].categories = {"gpu", "offload", "shared"};
    panels[i].series = {{titles[i], {1.0 + i, 2.0, kNoBar}}};
  }
  const std::string svg = render_svg_panels(panels, "modes");
  EXPECT_TRUE(well_formed(svg));
  EXPECT_EQ(bars(svg).size(), 6u);
  const auto groups = elements(svg, "<g transform=");
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_TRUE(contains(svg, ">energy</text>"));
  EXPECT_TRUE(contains(groups[2].at("transform"), "translate("));
  EXPECT_NE(groups[1].at("transform"), groups[2].at("transform"));
}

TEST(SvgChart, WritesTheFileOrNamesThePath) {
  TempDir dir;
  const std::string path = dir.file("chart.svg");
  const std::string svg = render_svg(two_series_chart());
  write_svg(path, svg);
  EXPECT_EQ(read_text(path), svg);
  const std::string unwritable = dir.file("no-such-dir/chart.svg");
  EXPECT_TRUE(contains(error_message([&] { write_svg(unwritable, svg); }), unwritable));
}

}  // namespace
}  // namespace layup
