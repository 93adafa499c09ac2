#!/usr/bin/env bash
# Every environment variable the program reads is in docs/cli.md's "Environment variables" table: what a run
# computes is chosen by its config, and the environment holds only the machine's, the launchers' and the developers'
# switches, each listed with who sets it. A variable read by getenv, env_int or through a k...Variable constant in
# core/, launch/, parallel/, optim/, checkpoint/ or data/ and missing from the table fails this check.
set -euo pipefail
cd "$1"
sources=(core launch parallel optim checkpoint data)
mapfile -t read < <(
  {
    grep -rhoE '(getenv|env_int)\("[A-Za-z_][A-Za-z0-9_]*"' "${sources[@]}" --include='*.cpp' --include='*.h' \
      --include='*.cu' | sed -E 's/.*\("//; s/"$//'
    grep -rhoE 'k[A-Za-z]*Variable = "[A-Za-z_][A-Za-z0-9_]*"' "${sources[@]}" --include='*.cpp' --include='*.h' |
      sed -E 's/.*= "//; s/"$//'
  } | sort -u)
table=$(awk '/^## Environment variables/ {on = 1; next} /^## / {on = 0} on' docs/cli.md)
[ -n "$table" ] || { echo "docs/cli.md has no \"## Environment variables\" section"; exit 1; }
missing=()
for name in "${read[@]}"; do
  grep -qF "\`$name\`" <<<"$table" || grep -qF "\`$name=" <<<"$table" || missing+=("$name")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "read by the program but not in docs/cli.md's \"Environment variables\" table (a config key, or a row there):"
  printf '  %s\n' "${missing[@]}"
  exit 1
fi
echo "the ${#read[@]} environment variables the program reads are documented"
