#!/usr/bin/env bash
# The tree is formatted with the repository's .clang-format: every C++ source and header, checked, not
# argued. Fix with: clang-format -i FILE...
set -euo pipefail
cd "$1"
command -v clang-format >/dev/null || { echo "clang-format is not installed (Debian: clang-format)"; exit 1; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
else
  mapfile -t files < <(find core parallel optim checkpoint data launch tests bench \
                         \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -type f)
fi
bad=()
for f in "${files[@]}"; do
  [ -f "$f" ] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not formatted with .clang-format (clang-format -i ...):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "${#files[@]} files formatted"
