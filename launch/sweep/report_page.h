// The frame of a `moe report` page: the charts' markup and their data, built together so that what is embedded is
// what is drawn, and the HTML around them. Every page begins with kPageStart (the mark by which `moe report`
// knows a page it may replace, launch/sweep/report_output.h), forbids every script and fetch by its
// Content-Security-Policy, escapes every text, and embeds its data as JSON that no content can end early.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "launch/sweep/report_svg.h"

namespace moe::report {

inline constexpr std::string_view kPageStart =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"generator\" content=\"moe "
    "report\">";

struct Page {
  nlohmann::json data = {{"charts", nlohmann::json::object()}, {"heatmaps", nlohmann::json::object()}};
  std::string body;
  void add(const LineChart& chart);
  void add(const Heatmap& map);
  void section(const std::string& title);
  void note(const std::string& id, const std::string& text);  // a paragraph of escaped text
};

// JSON as the text of a <script type="application/json"> element: <, >, &, U+2028 and U+2029 as \u escapes,
// so no string in it can end the element or open a comment, and JSON.parse of the text gives `data` back.
std::string script_json(const nlohmann::json& data);

// The page: `subtitle` is text (escaped here).
std::string page_html(const std::string& title, const std::string& subtitle, const Page& page);

}  // namespace moe::report
