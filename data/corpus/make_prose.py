#!/usr/bin/env python3
# Makes prose.txt, the English source of the embedded corpus, from the Jargon File 4.4.7 (public
# domain) as Debian's jargon-text package ships it. It does not download anything.
#
#   apt-get install jargon-text
#   python3 make_prose.py [/usr/share/doc/jargon-text/jargon.txt.gz] > prose.txt
#
# Kept: the essay chapters (1, 2, 4-12; chapter 3 is a revision table), an evenly spread subset of
# lexicon entries, and the appendices A-C (folklore, portrait of a hacker). The text is folded to
# ASCII and dedented so that a byte-level model sees plain English, not UTF-8 punctuation.
import gzip
import re
import sys
import unicodedata

BUDGET_BYTES = 500_000

# Punctuation the File uses, folded to ASCII; anything else non-ASCII loses its accents or is dropped.
ASCII_FOLD = {
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2014": "--", "\u2013": "-",
    "\u00b7": "-", "\u2122": "(TM)", "\u00d7": "x", "\u2026": "...", "\u00a0": " ", "\u00bd": "1/2",
}


def to_ascii(text):
    out = []
    for ch in text:
        if ord(ch) < 128:
            out.append(ch)
        elif ch in ASCII_FOLD:
            out.append(ASCII_FOLD[ch])
        else:
            decomposed = unicodedata.normalize("NFKD", ch)
            out.append("".join(c for c in decomposed if ord(c) < 128))
    return "".join(out)


def dedent(lines):
    return [line[3:] if line.startswith("   ") else line.lstrip() for line in lines]


def section(lines, start_heading, stop_heading):
    # Headings stand at column 0; the table of contents repeats their names indented, so it is skipped.
    begin = next(i for i, l in enumerate(lines) if l.startswith(start_heading))
    end = next(i for i in range(begin + 1, len(lines)) if lines[i].startswith(stop_heading))
    return lines[begin:end]


def lexicon_entries(lines):
    # Each letter opens with a two-space-indented header and an index of terms; entries start ":term:".
    begin = next(i for i, l in enumerate(lines) if re.match(r"^   :.+?:", l))
    end = next(i for i in range(begin, len(lines)) if lines[i].startswith("Appendix A. Hacker Folklore"))
    entries, current, in_index = [], None, False
    for line in lines[begin:end]:
        if re.match(r"^  \S", line):
            in_index = True
            continue
        if re.match(r"^   :.+?:", line):
            in_index = False
            current = []
            entries.append(current)
        if not in_index and current is not None:
            current.append(line)
    return entries


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/doc/jargon-text/jargon.txt.gz"
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = to_ascii(f.read()).splitlines()  # first, so headings match ("Chapter\u00a01.")

    head = section(lines, "Chapter 1.", "Chapter 3.") + section(lines, "Chapter 4.", "Glossary")
    tail = section(lines, "Appendix A. Hacker Folklore", "Bibliography")
    head_text = "\n".join(dedent(head)).rstrip() + "\n\n"
    tail_text = "\n".join(dedent(tail)).rstrip() + "\n"

    entries = ["\n".join(dedent(e)).rstrip() + "\n\n" for e in lexicon_entries(lines)]
    room = BUDGET_BYTES - len(head_text) - len(tail_text)
    # Every stride-th entry (fractional stride), so the chosen entries spread over A-Z.
    stride = sum(len(e) for e in entries) / room
    chosen, used, k = [], 0, 0
    while int(k * stride) < len(entries):
        e = entries[int(k * stride)]
        if used + len(e) > room:
            break
        chosen.append(e)
        used += len(e)
        k += 1
    sys.stdout.write(head_text + "".join(chosen) + tail_text)


if __name__ == "__main__":
    main()
