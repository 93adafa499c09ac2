#!/usr/bin/env python3
# Makes code.txt, the source-code part of the embedded corpus: headers of nlohmann/json 3.11.2 (MIT)
# as Debian's nlohmann-json3-dev package installs them. It does not download anything.
#
#   apt-get install nlohmann-json3-dev
#   python3 make_code.py [/usr/include/nlohmann] > code.txt
#
# The MIT notice comes first (the licence asks for it in every copy), then whole files in a fixed
# order, each after a "// ---- file: PATH ----" line, until the next file would pass the budget.
# Left out: the third-party hedley macros and the macro scope files, which are mostly #defines, and the
# long, repetitive binary (CBOR, MessagePack, ...) reader and writer, so more kinds of code fit.
import os
import sys

BUDGET_BYTES = 500_000

MIT_NOTICE = """\
// The C++ below is taken from JSON for Modern C++ (nlohmann/json) version 3.11.2.
// Copyright (c) 2013-2022 Niels Lohmann <https://nlohmann.me>; parts (c) 2009 Florian Loitsch and
// (c) 2008-2009 Bjoern Hoehrmann. Licensed under the MIT License:
//
// Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
// associated documentation files (the "Software"), to deal in the Software without restriction,
// including without limitation the rights to use, copy, modify, merge, publish, distribute,
// sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is
// furnished to do so, subject to the following conditions:
//
// The above copyright notice and this permission notice shall be included in all copies or
// substantial portions of the Software.
//
// THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT
// NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND
// NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM,
// DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT
// OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.

"""

SKIPPED = {"detail/macro_scope.hpp", "detail/macro_unscope.hpp", "detail/input/binary_reader.hpp",
           "detail/output/binary_writer.hpp"}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "/usr/include/nlohmann"
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "thirdparty"]
        for name in files:
            rel = os.path.relpath(os.path.join(folder, name), root)
            if name.endswith(".hpp") and rel not in SKIPPED:
                paths.append(rel)
    # json.hpp first (the public class), then the rest by path, so the order never depends on the disk.
    paths.sort(key=lambda p: (p != "json.hpp", p))

    out = MIT_NOTICE.encode()
    for rel in paths:
        with open(os.path.join(root, rel), "rb") as f:
            piece = f"// ---- file: nlohmann/{rel} ----\n".encode() + f.read() + b"\n"
        if len(out) + len(piece) > BUDGET_BYTES:
            continue  # a smaller file later may still fit
        out += piece
    sys.stdout.buffer.write(out)


if __name__ == "__main__":
    main()
