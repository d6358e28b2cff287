// Bar charts written as standalone SVG files, for the reports of `layup study`.
//
// A chart is plain data (categories, one or more series of values, a title and an axis label);
// render_svg lays it out and returns one self-contained SVG document a browser opens directly:
// no scripts, no style sheets, no fonts beyond the browser's sans-serif. The writer knows nothing
// about training; the caller decides what a category or a series is.
//
// Layout: the value axis runs from 0 to a "nice" maximum (1, 2, 2.5 or 5 times a power of ten)
// with 4 to 6 gridlines. The picture grows with the number of categories and the length of the
// labels (estimated from their character count), so labels do not overlap however many there
// are. Colours come from the Okabe-Ito palette, which colour-blind readers can tell apart.
//
// Every bar is a <rect class="bar" data-category=... data-series=... data-value=...>, so tests
// and scripts can find the bars and their values in the SVG text.
#pragma once

#include <string>
#include <vector>

namespace layup {

// One colour of bars: one value per category of the chart. NaN draws no bar (a run that was
// refused or did not fit); every other value must be finite and >= 0.
struct ChartSeries {
  std::string name;  // the legend entry, shown when the chart has more than one series
  std::vector<double> values;
};

struct BarChart {
  std::string title;                    // drawn at the top
  std::string value_label;              // the value axis' label, with its unit: "median ms/step"
  std::vector<std::string> categories;  // one per bar group: "default", "grads=pinned", ...
  std::vector<ChartSeries> series;
  bool stacked = false;            // false: a category's bars side by side; true: one stacked bar
  bool horizontal = true;          // bars run left to right, category labels on the left
  std::vector<std::string> notes;  // empty, or one per category, drawn past the bar's end
  int highlight = -1;              // a category to emphasise (bold label, shaded band); -1: none
  // > 0: the value axis ends at (a nice value above) this, and longer bars stop at its end, with
  // their real value written there: one outlier then does not flatten every other bar.
  double axis_limit = 0.0;
};

// A complete SVG document for one chart. Throws layup::Error when the chart is malformed: no
// categories or series, a series whose length differs from the categories', a negative or
// infinite value, notes of the wrong count, a highlight out of range.
std::string render_svg(const BarChart& chart);

// Several charts side by side under one title, in one SVG document (e.g. time, energy and memory
// of each mode). Throws as render_svg does, and for an empty list.
std::string render_svg_panels(const std::vector<BarChart>& panels, const std::string& title);

// Writes an SVG document to `path` atomically; throws layup::Error naming the path when it cannot.
void write_svg(const std::string& path, const std::string& svg);

// The top of a value axis that starts at 0 and shows `largest_value`: the smallest of 1, 2, 2.5
// and 5 times a power of ten that is >= largest_value (87 -> 100, 0.0123 -> 0.02); 1 for 0.
double nice_axis_max(double largest_value);

// A value as the chart prints it: 3 significant digits, without trailing zeros ("12.3", "0.5",
// "1234", "0.00123"); very large or small magnitudes in exponent form.
std::string format_chart_value(double value);

}  // namespace layup
