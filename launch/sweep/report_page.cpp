// The frame of a report page (launch/sweep/report_page.h).
#include "launch/sweep/report_page.h"

namespace moe::report {
using json = nlohmann::json;

void Page::add(const LineChart& c) {
  json series = json::array();
  for (const Series& s : c.series) series.push_back({{"name", s.name}, {"x", s.x}, {"y", s.y}});
  data["charts"][c.id] = {{"title", c.title}, {"series", series}};
  body += line_chart_svg(c);
}

void Page::add(const Heatmap& m) {
  json values = json::array();
  for (const auto& row : m.values) {
    json r = json::array();
    for (const auto& v : row) r.push_back(v ? json(*v) : json(nullptr));
    values.push_back(r);
  }
  data["heatmaps"][m.id] = {{"title", m.title}, {"rows", m.row_labels}, {"cols", m.col_labels}, {"values", values}};
  body += heatmap_svg(m);
}

void Page::section(const std::string& title) { body += "<h2>" + escape(title) + "</h2>\n"; }

void Page::note(const std::string& id, const std::string& text) {
  body += "<p class=\"note\" id=\"" + escape(id) + "\">" + escape(text) + "</p>\n";
}

std::string script_json(const json& data) {
  // ensure_ascii writes every non-ASCII character (U+2028 and U+2029 among them) as \uXXXX; the replace handler
  // keeps a page for a string that is not UTF-8. <, > and & occur only inside strings, where \u escapes are valid.
  const std::string text = data.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    if (c == '<')
      out += "\\u003c";
    else if (c == '>')
      out += "\\u003e";
    else if (c == '&')
      out += "\\u0026";
    else
      out += c;
  }
  return out;
}

std::string page_html(const std::string& title, const std::string& subtitle, const Page& page) {
  return std::string(kPageStart) +
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
         "<title>" +
         escape(title) +
         "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222;max-width:1600px}"
         "figure.chart{display:inline-block;margin:8px;vertical-align:top}figcaption{font-weight:bold;font-size:14px}"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}"
         "th{background:#f3f3f3}td.l,th.l{text-align:left}.note{color:#555;font-size:13px}</style></head>\n<body>"
         "<h1>" +
         escape(title) + "</h1><p class=\"note\" id=\"subtitle\">" + escape(subtitle) + "</p>\n" + page.body +
         "<script type=\"application/json\" id=\"moe-report-data\">" + script_json(page.data) +
         "</script>\n</body></html>\n";
}

}  // namespace moe::report
