// Where `moe report` may write its page, and how. The page goes to a new temporary file created with
// O_CREAT|O_EXCL|O_NOFOLLOW beside --out (nothing at that name is ever opened or followed), renamed over --out.
// An existing --out is replaced only when it is a regular file (not a symbolic link) that begins with the mark
// every page begins with (launch/sweep/report_page.h); inside the run or sweep directory only PATH/report.html may be
// written. Anything else: BadInput naming --out, the path and why, with nothing written.
#pragma once

#include <filesystem>
#include <string>

namespace moe::report {

// BadInput when the page of the run or sweep in `input_dir` may not be written to `out`.
void check_output(const std::filesystem::path& out, const std::filesystem::path& input_dir);

// Checks again, then writes `html` to `out` (BadInput, no temporary file left, when it cannot).
void write_output(const std::filesystem::path& out, const std::filesystem::path& input_dir, const std::string& html);

}  // namespace moe::report
