// The charts of `moe report` as plain SVG text (no script, no network): line charts of one or more series and
// heatmaps. Every plotted value is also written on its element (data-x / data-y on a polyline, data-value on a
// heatmap cell), so a reader or a test can check the picture against the numbers. Not here: what to plot
// (launch/sweep/report.cpp).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace moe::report {

struct Series {
  std::string name;
  std::vector<double> x, y;  // equal sizes; x increasing
};

struct LineChart {
  std::string id;  // unique in the page: the element's id
  std::string title, x_label, y_label;
  std::vector<Series> series;
};
// An <svg> with axes, ticks, a legend and one <polyline class="series"> per non-empty series (and a
// <circle class="marker"> for a series of one point, which a polyline alone would not show).
std::string line_chart_svg(const LineChart& chart);

struct Heatmap {
  std::string id, title, x_label, y_label;
  std::vector<std::string> row_labels, col_labels;
  std::vector<std::vector<std::optional<double>>> values;  // [row][col]; nullopt: no data (grey)
  bool show_values = false;                                // the number inside each cell (small grids)
  bool lower_is_better = false;                            // the colour scale's direction, for the legend
};
// An <svg> with one <rect class="cell" data-row data-col data-value> per cell with a value.
std::string heatmap_svg(const Heatmap& map);

// Text escaped for HTML and XML, in text and in attributes (& < > " ').
std::string escape(const std::string& text);
// A number as the page shows it: %.4g; "" for a non-finite one.
std::string format_number(double v);

}  // namespace moe::report
