#!/usr/bin/env python3
# Makes arithmetic.txt, the arithmetic part of the embedded corpus: one correct integer equation a
# line ("37+85=122", "12*7=84", "(3+4)*5=35", "8-15=-7"). Deterministic: its own splitmix64 generator
# with a fixed seed, so any Python 3 makes the same bytes.
#
#   python3 make_arithmetic.py > arithmetic.txt
#
# Operators are +, - and *, with the usual precedence; a result may be negative, an operand never is.
import sys

BUDGET_BYTES = 500_000
SEED = 20240601
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64


def equation(rng):
    # (template, operand bound): sums of three-digit numbers, products of two-digit ones, and short
    # mixed expressions so the model must learn precedence and parentheses.
    kind = rng.below(10)
    if kind < 3:
        a, b = rng.below(1000), rng.below(1000)
        return f"{a}+{b}", a + b
    if kind < 5:
        a, b = rng.below(1000), rng.below(1000)
        return f"{a}-{b}", a - b
    if kind < 7:
        a, b = rng.below(100), rng.below(100)
        return f"{a}*{b}", a * b
    a, b, c = rng.below(20), rng.below(20), rng.below(20)
    if kind == 7:
        return f"({a}+{b})*{c}", (a + b) * c
    if kind == 8:
        return f"{a}*{b}+{c}", a * b + c
    return f"{a}+{b}*{c}", a + b * c


def main():
    rng = SplitMix64(SEED)
    lines, size = [], 0
    while True:
        text, value = equation(rng)
        line = f"{text}={value}\n"
        if size + len(line) > BUDGET_BYTES:
            break
        lines.append(line)
        size += len(line)
    sys.stdout.write("".join(lines))


if __name__ == "__main__":
    main()
