// Bar chart layout and SVG text.
//
// A chart is laid out before anything is written: widths first, from the estimated lengths of its
// labels (categories, the values and notes at the bars' ends); then heights, which depend on how
// many rows the legend wraps into at that width. Positions along the value axis are px from the
// axis' 0 ("along"); positions on the category axis are absolute ("across"); point() maps the two
// to x and y for either orientation, so one drawing routine serves both.
#include "study/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string_view>

#include "core/error.h"
#include "io/atomic_file.h"

namespace layup {
namespace {

// Okabe & Ito's palette; yellow comes late because it is faint on white.
constexpr const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                    "#56B4E9", "#D55E00", "#F0E442", "#000000"};
constexpr double kMarginPx = 12;
constexpr double kFontPx = 12;       // category labels, legend, axis label
constexpr double kSmallFontPx = 11;  // tick labels, values at the bars, notes
constexpr double kTitleFontPx = 15;
constexpr double kBarPx = 16;  // a horizontal bar's thickness; a vertical one's least width
constexpr double kLinePx = kSmallFontPx + 4;
constexpr double kBaselinePx = 4;  // from a line's middle down to the baseline of 11-12 px text

[[gnu::format(printf, 2, 3)]] void append(std::string& out, const char* format, ...) {
  va_list args, args_copy;
  va_start(args, format);
  va_copy(args_copy, args);
  const int length = std::vsnprintf(nullptr, 0, format, args_copy);
  va_end(args_copy);
  const size_t old_size = out.size();
  out.resize(old_size + length + 1);  // room for the terminating zero vsnprintf writes
  std::vsnprintf(out.data() + old_size, length + 1, format, args);
  out.resize(old_size + length);
  va_end(args);
}

std::string escape_xml(std::string_view text) {
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
      default:  // XML 1.0 forbids most control characters, even as character references
        out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
    }
  }
  return out;
}

// No font metrics are at hand, so widths are estimated from the character count (UTF-8 lead
// bytes); 0.6 em is about a digit or a capital in common sans-serif fonts, so estimates err wide.
double text_width(std::string_view text, double font_px, bool bold = false) {
  double chars = 0;
  for (char c : text) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return chars * font_px * (bold ? 0.66 : 0.6);
}

void append_text(std::string& out, double x, double y, double font_px, std::string_view text,
                 const std::string& attributes = "") {
  if (text.empty()) return;
  append(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\"%s>%s</text>\n", x, y, font_px,
         attributes.c_str(), escape_xml(text).c_str());
}

struct NiceAxis {
  double max = 1;
  int intervals = 5;  // gridlines after the one at 0
};

NiceAxis nice_axis(double largest_value) {
  if (!(largest_value > 0)) return {};
  // Trying the decades around log10's guess makes a rounding error in log10 harmless.
  const int decade = static_cast<int>(std::floor(std::log10(largest_value)));
  for (int exponent = decade - 1; exponent <= decade + 1; ++exponent) {
    for (const NiceAxis step : {NiceAxis{1, 5}, NiceAxis{2, 4}, NiceAxis{2.5, 5}, NiceAxis{5, 5}}) {
      // Dividing by an exact power of ten rounds once, so 5 * 10^-2 is the double 0.05.
      const double max = exponent >= 0 ? step.max * std::pow(10.0, exponent)
                                       : step.max / std::pow(10.0, -exponent);
      if (max >= largest_value) return {max, step.intervals};
    }
  }
  return {};  // not reached: 10^(decade + 1) > largest_value
}

void check_chart(const BarChart& chart) {
  const std::string name = "chart '" + chart.title + "'";
  const size_t categories = chart.categories.size();
  LAYUP_CHECK(categories > 0, name, " has no categories; give one per bar or bar group");
  LAYUP_CHECK(!chart.series.empty(), name, " has no series; give at least one");
  for (const ChartSeries& series : chart.series) {
    LAYUP_CHECK(series.values.size() == categories, name, ": series '", series.name, "' has ",
                series.values.size(), " values for ", categories,
                " categories; give one value per category (NaN for no bar)");
    for (size_t c = 0; c < categories; ++c) {
      const double value = series.values[c];
      LAYUP_CHECK(std::isnan(value) || (std::isfinite(value) && value >= 0), name, ": series '",
                  series.name, "' has the value ", value, " for '", chart.categories[c],
                  "'; bars start at 0, so give a finite value >= 0 (NaN for no bar)");
    }
  }
  LAYUP_CHECK(chart.notes.empty() || chart.notes.size() == categories, name, " has ",
              chart.notes.size(), " notes for ", categories,
              " categories; give none or one per category ('' for none)");
  LAYUP_CHECK(chart.highlight >= -1 && chart.highlight < static_cast<int>(categories), name,
              ": highlight ", chart.highlight, " is not a category index (0 to ", categories - 1,
              ", or -1 for none)");
}

struct Drawing {
  double width = 0, height = 0;
  double plot_y = 0;     // the top of the plot area, to line up panels
  std::string elements;  // with the origin at the drawing's top left corner
};

Drawing draw_chart(const BarChart& chart) {
  check_chart(chart);
  const bool horizontal = chart.horizontal;
  const size_t categories = chart.categories.size(), series = chart.series.size();
  const size_t bars_per_group = chart.stacked ? 1 : series;
  auto note = [&](size_t c) { return chart.notes.empty() ? std::string() : chart.notes[c]; };

  // What is written at each bar's end: its value, or a stack's total; NaN where there is no bar.
  std::vector<std::vector<double>> end_value(categories, std::vector<double>(bars_per_group, NAN));
  double largest_end = 0;
  for (size_t c = 0; c < categories; ++c) {
    for (size_t s = 0; s < series; ++s) {
      const double value = chart.series[s].values[c];
      if (std::isnan(value)) continue;
      double& end = end_value[c][chart.stacked ? 0 : s];
      end = chart.stacked && !std::isnan(end) ? end + value : value;
      largest_end = std::max(largest_end, end);
    }
  }
  const NiceAxis axis =
      nice_axis(chart.axis_limit > 0 ? std::min(largest_end, chart.axis_limit) : largest_end);
  auto tick_value = [&](int i) { return axis.max * i / axis.intervals; };

  // Widths.
  double label_px = 0, note_px = 0, end_label_px = 0, tick_label_px = 0;
  for (size_t c = 0; c < categories; ++c) {
    const bool bold = static_cast<int>(c) == chart.highlight;
    label_px = std::max(label_px, text_width(chart.categories[c], kFontPx, bold));
    note_px = std::max(note_px, text_width(note(c), kSmallFontPx));
    for (double end : end_value[c]) {
      if (std::isnan(end)) continue;
      end_label_px = std::max(end_label_px, text_width(format_chart_value(end), kSmallFontPx));
    }
  }
  for (int i = 0; i <= axis.intervals; ++i) {
    tick_label_px =
        std::max(tick_label_px, text_width(format_chart_value(tick_value(i)), kSmallFontPx));
  }
  // A vertical bar is at least as wide as its value, so neighbouring values do not collide.
  const double bar_px = horizontal ? kBarPx : std::max(kBarPx + 4, end_label_px + 4);
  const double group_px = bars_per_group * bar_px;
  const double band_px = horizontal ? group_px + 10 : std::max({group_px, label_px, note_px}) + 12;
  const double axis_px = horizontal ? 420 : 260;
  const double plot_x =
      horizontal ? kMarginPx + label_px + 8 : kMarginPx + kFontPx + 8 + tick_label_px + 6;
  // Bars past the axis (axis_limit) stop at its end.
  auto along = [&](double value) { return std::min(value / axis.max, 1.0) * axis_px; };
  const double plot_right = horizontal ? plot_x + axis_px : plot_x + categories * band_px;
  double content_right = plot_right + (horizontal ? tick_label_px / 2 : 0);
  std::vector<double> note_along(categories, 6);  // past the values at the bars' ends
  for (size_t c = 0; c < categories; ++c) {
    for (double end : end_value[c]) {
      if (std::isnan(end)) continue;
      const double label_end = along(end) + 4 + text_width(format_chart_value(end), kSmallFontPx);
      note_along[c] = std::max(note_along[c], horizontal ? label_end + 8 : along(end) + kLinePx);
    }
    if (horizontal) {
      content_right =
          std::max(content_right, plot_x + note_along[c] + text_width(note(c), kSmallFontPx));
    }
  }
  double width = std::max(content_right, kMarginPx + text_width(chart.title, kTitleFontPx, true));
  std::vector<double> legend_px(series > 1 ? series : 0);
  for (size_t s = 0; s < legend_px.size(); ++s) {
    legend_px[s] = 14 + text_width(chart.series[s].name, kFontPx);
    width = std::max(width, kMarginPx + legend_px[s]);
  }
  width += kMarginPx;

  // Heights, drawing the title and the legend on the way down.
  std::string out;
  double y = kMarginPx;
  if (!chart.title.empty()) {
    append_text(out, kMarginPx, y + kTitleFontPx, kTitleFontPx, chart.title,
                " font-weight=\"bold\"");
    y += kTitleFontPx + 10;
  }
  double legend_x = kMarginPx;
  for (size_t s = 0; s < legend_px.size(); ++s) {
    if (legend_x > kMarginPx && legend_x + legend_px[s] > width - kMarginPx) {
      legend_x = kMarginPx;
      y += 18;
    }
    append(out,
           "<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" "
           "fill=\"%s\"/>\n",
           legend_x, y + 2, kPalette[s % std::size(kPalette)]);
    append_text(out, legend_x + 14, y + 11, kFontPx, chart.series[s].name);
    legend_x += legend_px[s] + 16;
  }
  if (!legend_px.empty()) y += 22;
  const double header_bottom = y;
  // A vertical chart keeps two lines above its top gridline for a value and a note.
  const double plot_y = header_bottom + (horizontal ? 4 : 2 * kLinePx);
  const double plot_bottom = plot_y + (horizontal ? categories * band_px : axis_px);
  const double height = plot_bottom + (horizontal ? 40 : 22) + kMarginPx;

  struct Point {
    double x, y;
  };
  auto point = [&](double along_px, double across) {
    return horizontal ? Point{plot_x + along_px, across} : Point{across, plot_bottom - along_px};
  };
  auto band_start = [&](size_t c) { return (horizontal ? plot_y : plot_x) + c * band_px; };
  auto append_rect = [&](const std::string& attributes, double low, double high, double across,
                         double thickness) {
    const Point corner = point(horizontal ? low : high, across);
    const double along_px = high - low;
    append(out, "<rect%s x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"", attributes.c_str(),
           corner.x, corner.y, horizontal ? along_px : thickness,
           horizontal ? thickness : along_px);
  };

  // The highlight band behind everything, then the gridlines and the axis' labels.
  if (chart.highlight >= 0) {
    const double start = band_start(chart.highlight);
    if (horizontal) {
      append_rect(" class=\"highlight\"", -plot_x + kMarginPx / 2, axis_px, start, band_px);
    } else {
      append_rect(" class=\"highlight\"", -22, plot_bottom - header_bottom, start, band_px);
    }
    out += " fill=\"#FFF0C0\"/>\n";
  }
  for (int i = 0; i <= axis.intervals; ++i) {
    const Point from = point(along(tick_value(i)), horizontal ? plot_y : plot_x);
    const Point to = point(along(tick_value(i)), horizontal ? plot_bottom : plot_right);
    append(out,
           "<line class=\"grid\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"%s\"/>\n",
           from.x, from.y, to.x, to.y, i == 0 ? "#333333" : "#DDDDDD");
    const std::string tick = format_chart_value(tick_value(i));
    if (horizontal) {
      append_text(out, to.x, plot_bottom + 14, kSmallFontPx, tick, " text-anchor=\"middle\"");
    } else {
      append_text(out, plot_x - 6, from.y + kBaselinePx, kSmallFontPx, tick,
                  " text-anchor=\"end\"");
    }
  }
  if (horizontal) {
    append_text(out, plot_x + axis_px / 2, plot_bottom + 32, kFontPx, chart.value_label,
                " text-anchor=\"middle\"");
  } else {
    const double x = kMarginPx + kFontPx, middle = (plot_y + plot_bottom) / 2;
    std::string rotate;
    append(rotate, " text-anchor=\"middle\" transform=\"rotate(-90 %.1f %.1f)\"", x, middle);
    append_text(out, x, middle, kFontPx, chart.value_label, rotate);
  }

  // Each category: its bars, the values at their ends, its label and its note.
  for (size_t c = 0; c < categories; ++c) {
    const double group_start = band_start(c) + (band_px - group_px) / 2;
    double stack_px = 0;
    for (size_t s = 0; s < series; ++s) {
      const double value = chart.series[s].values[c];
      if (std::isnan(value)) continue;
      const double low = chart.stacked ? stack_px : 0;
      stack_px = std::min(low + along(value), axis_px);
      const std::string category = escape_xml(chart.categories[c]);
      const std::string name = escape_xml(chart.series[s].name);
      append_rect(" class=\"bar\" data-category=\"" + category + "\" data-series=\"" + name + "\"",
                  low, stack_px, group_start + (chart.stacked ? 0 : s * bar_px), bar_px);
      // The white edge keeps stacked segments and neighbouring bars apart.
      append(out,
             " data-value=\"%.6g\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
             "<title>%s, %s: %s</title></rect>\n",
             value, kPalette[s % std::size(kPalette)], category.c_str(), name.c_str(),
             format_chart_value(value).c_str());
    }
    for (size_t bar = 0; bar < bars_per_group; ++bar) {
      const double end = end_value[c][bar];
      if (std::isnan(end)) continue;
      const Point at = point(along(end) + 4, group_start + (bar + 0.5) * bar_px);
      append_text(out, at.x, at.y + (horizontal ? kBaselinePx : 0), kSmallFontPx,
                  format_chart_value(end), horizontal ? "" : " text-anchor=\"middle\"");
    }
    const double middle = band_start(c) + band_px / 2;
    const std::string anchor = horizontal ? " text-anchor=\"end\"" : " text-anchor=\"middle\"";
    const bool emphasised = static_cast<int>(c) == chart.highlight;
    const Point label =
        horizontal ? Point{plot_x - 8, middle + kBaselinePx} : Point{middle, plot_bottom + 16};
    append_text(out, label.x, label.y, kFontPx, chart.categories[c],
                " class=\"category\"" + anchor + (emphasised ? " font-weight=\"bold\"" : ""));
    const Point note_at = point(note_along[c], middle);
    append_text(out, note_at.x, note_at.y + (horizontal ? kBaselinePx : 0), kSmallFontPx, note(c),
                " class=\"note\" font-style=\"italic\" fill=\"#444444\"" +
                    (horizontal ? std::string() : anchor));
  }
  return {width, height, plot_y, out};
}

std::string svg_document(double width, double height, const std::string& elements) {
  std::string out;
  append(out,
         "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
         "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
         "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
         std::ceil(width), std::ceil(height), std::ceil(width), std::ceil(height));
  return out + elements + "</svg>\n";
}

}  // namespace

double nice_axis_max(double largest_value) {
  return nice_axis(largest_value).max;
}

std::string format_chart_value(double value) {
  char text[32];
  const double magnitude = std::fabs(value);
  if (magnitude == 0) return "0";
  if (!std::isfinite(value) || magnitude >= 1e6 || magnitude < 1e-3) {
    std::snprintf(text, sizeof text, "%.3g", value);
    return text;
  }
  const int decimals = std::max(0, 2 - static_cast<int>(std::floor(std::log10(magnitude))));
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  std::string out = text;
  if (out.find('.') != std::string::npos) {
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
  }
  return out;
}

std::string render_svg(const BarChart& chart) {
  const Drawing drawing = draw_chart(chart);
  return svg_document(drawing.width, drawing.height, drawing.elements);
}

std::string render_svg_panels(const std::vector<BarChart>& panels, const std::string& title) {
  LAYUP_CHECK(!panels.empty(), "the panels '", title, "' have no charts; give at least one");
  std::vector<Drawing> drawings;
  double plot_y = 0;
  for (const BarChart& panel : panels) {
    drawings.push_back(draw_chart(panel));
    plot_y = std::max(plot_y, drawings.back().plot_y);
  }
  std::string elements;
  const double top = title.empty() ? 0 : kMarginPx + kTitleFontPx + 6;
  append_text(elements, kMarginPx, kMarginPx + kTitleFontPx, kTitleFontPx + 1, title,
              " font-weight=\"bold\"");
  double x = 0, height = 0;
  for (const Drawing& drawing : drawings) {
    // Panels whose legends wrap into fewer rows move down, so that all plots start level.
    const double y = top + plot_y - drawing.plot_y;
    append(elements, "<g transform=\"translate(%.1f %.1f)\">\n", x, y);
    elements += drawing.elements + "</g>\n";
    x += drawing.width;
    height = std::max(height, y + drawing.height);
  }
  const double width = std::max(x, 2 * kMarginPx + text_width(title, kTitleFontPx + 1, true));
  return svg_document(width, height, elements);
}

void write_svg(const std::string& path, const std::string& svg) {
  write_text_atomically(path, svg);
}

}  // namespace layup
