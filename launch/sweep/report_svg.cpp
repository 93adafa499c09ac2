// SVG charts of the report (launch/sweep/report_svg.h).
#include "launch/sweep/report_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace moe::report {
namespace {

constexpr double kWidth = 720, kHeight = 280;
constexpr double kLeft = 80, kRight = 150, kTop = 30, kBottom = 45;  // room for ticks, labels, legend
constexpr const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string num(double v, const char* format = "%.2f") {
  char text[40];
  std::snprintf(text, sizeof text, format, v);
  return text;
}

struct Extent {
  double lo = 0, hi = 1;
  double map(double v, double from, double to) const { return from + (v - lo) / (hi - lo) * (to - from); }
};

// The range of the values, widened when flat so that the mapping is defined.
Extent extent(const std::vector<const std::vector<double>*>& all) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto* v : all)
    for (const double x : *v)
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
  if (!std::isfinite(lo)) return {};
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    const double pad = hi == 0 ? 1.0 : std::fabs(hi) * 0.05;
    return {lo - pad, hi + pad};
  }
  return {lo, hi};
}

// Tick values: multiples of 1, 2 or 5 times a power of ten, about five of them inside the extent.
std::vector<double> nice_ticks(const Extent& e) {
  const double raw = (e.hi - e.lo) / 4, power = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = power * (raw / power < 1.5 ? 1 : raw / power < 3.5 ? 2 : raw / power < 7.5 ? 5 : 10);
  std::vector<double> ticks;
  for (double t = std::ceil(e.lo / step) * step; t <= e.hi + step * 1e-9; t += step)
    ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

std::string axes(const Extent& xs, const Extent& ys, const std::string& x_label, const std::string& y_label) {
  std::ostringstream s;
  const double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
  s << "<g class=\"axes\" stroke=\"#444\" fill=\"none\"><path d=\"M" << x0 << " " << y1 << "V" << y0 << "H" << x1
    << "\"/></g><g class=\"ticks\" font-size=\"11\" fill=\"#333\">";
  for (const double yv : nice_ticks(ys)) {
    const double py = ys.map(yv, y0, y1);
    s << "<text x=\"" << x0 - 6 << "\" y=\"" << num(py + 4) << "\" text-anchor=\"end\">" << format_number(yv)
      << "</text><line x1=\"" << x0 << "\" x2=\"" << x1 << "\" y1=\"" << num(py) << "\" y2=\"" << num(py)
      << "\" stroke=\"#eee\"/>";
  }
  for (const double xv : nice_ticks(xs))
    s << "<text x=\"" << num(xs.map(xv, x0, x1)) << "\" y=\"" << y0 + 16 << "\" text-anchor=\"middle\">"
      << format_number(xv) << "</text>";
  s << "<text x=\"" << (x0 + x1) / 2 << "\" y=\"" << kHeight - 8 << "\" text-anchor=\"middle\">" << escape(x_label)
    << "</text><text transform=\"translate(14," << (y0 + y1) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
    << escape(y_label) << "</text></g>";
  return s.str();
}

std::string joined(const std::vector<double>& v, const char* format) {
  std::string out;
  for (const double x : v) {
    if (!out.empty()) out += ' ';
    out += num(x, format);
  }
  return out;
}

// A colour from a value in [0, 1]: a perceptual ramp from dark blue through green to yellow (viridis' ends).
std::string ramp(double t) {
  static const double stops[][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = std::clamp(t, 0.0, 1.0) * 4;
  const int i = std::min(3, int(t));
  const double f = t - i;
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", int(stops[i][0] + f * (stops[i + 1][0] - stops[i][0])),
                int(stops[i][1] + f * (stops[i + 1][1] - stops[i][1])),
                int(stops[i][2] + f * (stops[i + 1][2] - stops[i][2])));
  return text;
}

// At most `most` bytes of `name`, cut at a character boundary (never inside a UTF-8 sequence) and marked by "~".
std::string shortened(const std::string& name, size_t most) {
  if (name.size() <= most) return name;
  size_t cut = most - 1;
  while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0) == 0x80) --cut;
  return name.substr(0, cut) + "~";
}

// Legend rows that fit beside the plot; the series past them are drawn but not named.
constexpr size_t kLegendRows = 18;
std::string legend_entry(size_t row, const std::string& colour, const std::string& name) {
  if (row >= kLegendRows) return "";
  const double y = kTop + 12 * double(row);
  return "<g class=\"legend\" font-size=\"10\"><rect x=\"" + num(kWidth - kRight + 10) + "\" y=\"" + num(y) +
         "\" width=\"12\" height=\"3\" fill=\"" + colour + "\"/><text x=\"" + num(kWidth - kRight + 26) + "\" y=\"" +
         num(y + 5) + "\">" + escape(shortened(name, 22)) + "</text></g>";
}

}  // namespace

std::string escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
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
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_number(double v) { return std::isfinite(v) ? num(v, "%.4g") : ""; }

std::string line_chart_svg(const LineChart& c) {
  std::vector<const std::vector<double>*> xs, ys;
  for (const Series& s : c.series) xs.push_back(&s.x), ys.push_back(&s.y);
  const Extent ex = extent(xs), ey = extent(ys);
  std::ostringstream s;
  s << "<figure class=\"chart\" id=\"" << escape(c.id) << "\"><figcaption>" << escape(c.title)
    << "</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << kWidth << " " << kHeight
    << "\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" data-y-min=\"" << num(ey.lo, "%.17g")
    << "\" data-y-max=\"" << num(ey.hi, "%.17g") << "\" data-x-min=\"" << num(ex.lo, "%.17g") << "\" data-x-max=\""
    << num(ex.hi, "%.17g") << "\">";
  s << axes(ex, ey, c.x_label, c.y_label);
  size_t shown = 0;
  for (const Series& series : c.series) {
    if (series.x.empty()) continue;
    const std::string colour = kPalette[shown % (sizeof kPalette / sizeof *kPalette)];
    std::string points;
    for (size_t i = 0; i < series.x.size(); ++i) {
      if (i) points += ' ';
      points += num(ex.map(series.x[i], kLeft, kWidth - kRight));
      points += ',';
      points += num(ey.map(series.y[i], kHeight - kBottom, kTop));
    }
    s << "<polyline class=\"series\" data-series=\"" << escape(series.name) << "\" data-x=\""
      << joined(series.x, "%.17g") << "\" data-y=\"" << joined(series.y, "%.17g") << "\" points=\"" << points
      << "\" fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\"><title>" << escape(series.name)
      << "</title></polyline>";
    // A polyline of one point draws nothing: a single point gets a marker.
    if (series.x.size() == 1)
      s << "<circle class=\"marker\" data-series=\"" << escape(series.name) << "\" cx=\""
        << num(ex.map(series.x[0], kLeft, kWidth - kRight)) << "\" cy=\""
        << num(ey.map(series.y[0], kHeight - kBottom, kTop)) << "\" r=\"3.5\" fill=\"" << colour << "\"/>";
    s << legend_entry(shown++, colour, series.name);
  }
  if (shown > kLegendRows)
    s << "<text x=\"" << kWidth - kRight + 10 << "\" y=\"" << kTop + 12 * kLegendRows + 5 << "\" font-size=\"10\">and "
      << shown - kLegendRows << " more</text>";
  if (shown == 0)
    s << "<text class=\"empty\" x=\"" << kWidth / 2 << "\" y=\"" << kHeight / 2
      << "\" text-anchor=\"middle\">no data yet</text>";
  s << "</svg></figure>\n";
  return s.str();
}

std::string heatmap_svg(const Heatmap& m) {
  const size_t rows = m.values.size(), cols = rows ? m.values[0].size() : 0;
  std::vector<double> all;
  for (const auto& row : m.values)
    for (const auto& v : row)
      if (v && std::isfinite(*v)) all.push_back(*v);
  const Extent e = extent({&all});
  const double left = 110, top = 30, right = 90, bottom = 45;
  const double w = std::max(360.0, std::min(720.0, 60.0 * double(cols) + left + right)) - left - right;
  const double cell_w = cols ? w / double(cols) : w, cell_h = std::clamp(220.0 / std::max<size_t>(rows, 1), 6.0, 40.0);
  const double height = top + cell_h * double(rows) + bottom, width = left + w + right;
  std::ostringstream s;
  s << "<figure class=\"chart heatmap\" id=\"" << escape(m.id) << "\"><figcaption>" << escape(m.title)
    << "</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << num(width) << " " << num(height)
    << "\" width=\"" << num(width) << "\" height=\"" << num(height) << "\" data-rows=\"" << rows << "\" data-cols=\""
    << cols << "\"><g font-size=\"11\" fill=\"#333\">";
  // Row labels on every row when they fit, column labels thinned to about 12.
  for (size_t r = 0; r < rows; ++r)
    if (cell_h >= 10 || r % size_t(std::ceil(10 / cell_h)) == 0)
      s << "<text x=\"" << left - 6 << "\" y=\"" << num(top + cell_h * (double(r) + 0.5) + 4)
        << "\" text-anchor=\"end\">" << escape(r < m.row_labels.size() ? m.row_labels[r] : "") << "</text>";
  const size_t every = std::max<size_t>(1, cols / 12);
  for (size_t c = 0; c < cols; c += every)
    s << "<text x=\"" << num(left + cell_w * (double(c) + 0.5)) << "\" y=\"" << num(top + cell_h * double(rows) + 14)
      << "\" text-anchor=\"middle\">" << escape(c < m.col_labels.size() ? m.col_labels[c] : "") << "</text>";
  s << "<text x=\"" << num(left + w / 2) << "\" y=\"" << num(height - 8) << "\" text-anchor=\"middle\">"
    << escape(m.x_label) << "</text><text transform=\"translate(14," << num(top + cell_h * double(rows) / 2)
    << ") rotate(-90)\" text-anchor=\"middle\">" << escape(m.y_label) << "</text></g>";
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      const auto& v = m.values[r][c];
      const std::string x = num(left + cell_w * double(c)), y = num(top + cell_h * double(r));
      if (!v) {
        s << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << num(cell_w) << "\" height=\"" << num(cell_h)
          << "\" fill=\"#ddd\"/>";
        continue;
      }
      const double t = (*v - e.lo) / (e.hi - e.lo);
      s << "<rect class=\"cell\" data-row=\"" << r << "\" data-col=\"" << c << "\" data-value=\"" << num(*v, "%.9g")
        << "\" x=\"" << x << "\" y=\"" << y << "\" width=\"" << num(cell_w + 0.05) << "\" height=\"" << num(cell_h)
        << "\" fill=\"" << ramp(m.lower_is_better ? 1 - t : t) << "\"/>";
      if (m.show_values)
        s << "<text x=\"" << num(left + cell_w * (double(c) + 0.5)) << "\" y=\""
          << num(top + cell_h * (double(r) + 0.5) + 4) << "\" text-anchor=\"middle\" font-size=\"11\" fill=\""
          << ((m.lower_is_better ? 1 - t : t) > 0.6 ? "#000" : "#fff") << "\">" << format_number(*v) << "</text>";
    }
  s << "<g font-size=\"10\" fill=\"#333\"><text x=\"" << num(left + w + 10) << "\" y=\"" << top + 10 << "\">"
    << (m.lower_is_better ? "low " : "high ") << format_number(m.lower_is_better ? e.lo : e.hi) << "</text><text x=\""
    << num(left + w + 10) << "\" y=\"" << top + 24 << "\">(yellow)</text><text x=\"" << num(left + w + 10) << "\" y=\""
    << top + 44 << "\">" << (m.lower_is_better ? "high " : "low ") << format_number(m.lower_is_better ? e.hi : e.lo)
    << "</text><text x=\"" << num(left + w + 10) << "\" y=\"" << top + 58 << "\">(purple)</text></g>";
  s << "</svg></figure>\n";
  return s.str();
}

}  // namespace moe::report
