// What the tests of `moe report` share: running the program, reading a page's embedded data and the SVG drawn
// in the DOM, and headless Chromium started fully offline.
#pragma once

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_compare.h"

namespace moe::report_test {
using namespace test_support;
using json = nlohmann::json;

inline int shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

inline std::string quoted(const std::string& s) { return "'" + s + "'"; }

// `moe report ARGS` with its stdout and stderr kept in files of `dir`; the exit code. `timeout` ends it if it
// ever blocks (exit 124, which no test expects).
inline int moe_report(const std::string& args, const fs::path& dir) {
  return shell("timeout 120 " + std::string(MOE_BINARY) + " report " + args + " > " +
               quoted((dir / "report.stdout").string()) + " 2> " + quoted((dir / "report.stderr").string()));
}

// The JSON of <script type="application/json" id="moe-report-data"> in a page (or a DOM).
inline json embedded_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"moe-report-data\">";
  const size_t from = html.find(open), to = html.find("</script>", from);
  if (from == std::string::npos || to == std::string::npos) return json();
  return json::parse(html.substr(from + open.size(), to - from - open.size()), nullptr, false);
}

inline std::vector<double> numbers(const std::string& text) {
  std::vector<double> out;
  std::istringstream in(text);
  for (double v; in >> v;) out.push_back(v);
  return out;
}

// Every <polyline class="series"> of the chart with id `chart` in the DOM: name to (data-x, data-y, points).
struct Drawn {
  std::vector<double> x, y, px, py;
};
inline std::map<std::string, Drawn> polylines(const std::string& dom, const std::string& chart) {
  std::map<std::string, Drawn> out;
  const size_t from = dom.find("id=\"" + chart + "\""), to = dom.find("</figure>", from);
  if (from == std::string::npos) return out;
  const std::string part = dom.substr(from, to - from);
  const std::regex line(
      "<polyline class=\"series\" data-series=\"([^\"]*)\" data-x=\"([^\"]*)\" data-y=\"([^\"]*)\" "
      "points=\"([^\"]*)\"");
  for (std::sregex_iterator it(part.begin(), part.end(), line), end; it != end; ++it) {
    Drawn d{numbers((*it)[2]), numbers((*it)[3]), {}, {}};
    std::string points = (*it)[4];
    std::replace(points.begin(), points.end(), ',', ' ');
    const std::vector<double> xy = numbers(points);
    for (size_t i = 0; i + 1 < xy.size(); i += 2) d.px.push_back(xy[i]), d.py.push_back(xy[i + 1]);
    out[(*it)[1]] = d;
  }
  return out;
}

inline std::string chromium() {
  for (const char* path : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (fs::exists(path)) return path;
  return "";
}

// Chromium never reaches the network: no background requests, component updates, sync or QUIC, every proxied
// request sent to a port where nothing listens, and every host name unresolvable.
inline const char* const kOfflineFlags =
    "--disable-background-networking --disable-component-update --disable-sync --disable-quic "
    "--disable-default-apps --disable-domain-reliability --disable-client-side-phishing-detection --no-pings "
    "--proxy-server=127.0.0.1:9 --host-resolver-rules=\"MAP * ~NOTFOUND\"";

// Headless Chromium, offline: the DOM after load (stdout) and the console (stderr).
inline int browse(const std::string& browser, const fs::path& page, const std::string& action, const fs::path& out,
                  const fs::path& console) {
  const std::string command =
      browser + " --headless --no-sandbox --disable-gpu --no-first-run --disable-extensions " + kOfflineFlags +
      " --enable-logging=stderr --v=0 --user-data-dir=" + quoted((out.parent_path() / "chromium-profile").string()) +
      " " + action + " " + quoted("file://" + fs::absolute(page).string()) + " > " + quoted(out.string()) + " 2> " +
      quoted(console.string());
  return shell(command);
}

}  // namespace moe::report_test
