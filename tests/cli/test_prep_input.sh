#!/usr/bin/env bash
# `moe prep` from the outside against careless and hostile inputs (docs/data.md "What prep reads",
# "What --out may be"): each refusal ends with exit code 2, a message naming the file, line or option, and
# nothing written; nothing blocks on a FIFO or reads a device forever (every command runs under a
# timeout, and a timeout fails the case); what is skipped within the bounds is named in the summary. Also
# that training refuses a prepared directory whose token ids do not fit model.vocab before writing anything.
#
# Usage: test_prep_input.sh MOE_BINARY SOURCE_DIR
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_BINARY SOURCE_DIR" >&2
  exit 2
fi
moe=$1
config="$2/configs/tiny.json"
unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS
small=(--set train.steps=2 --set model.d_model=32 --set model.layers=1 --set model.heads=2
       --set model.ffn_hidden=32 --set train.seq_len=16 --set train.global_batch=2 --set train.micro_batch=1
       --set train.eval_sequences=2 --set train.threads=1 --quiet)

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL [$case_name] $1"
}

# Every path under the working directory with its type (links not followed), then every file's sha256.
snapshot() {
  find . -printf '%y %p\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
}

# run_case NAME EXIT_CODE SETUP COMMAND...
# In a fresh directory: runs SETUP, runs COMMAND under a 60 s timeout, and asserts its exit code, that its
# stderr (exit 2) or stdout (exit 0) holds every string of `expect`, and, for exit 2, that the directory
# is unchanged byte for byte.
expect=()
run_case() {
  case_name=$1
  local want_rc=$2 setup=$3
  shift 3
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/moe_prep_test.XXXXXX") || { fail "mktemp -d failed"; return; }
  (
    cd "$dir" || exit 1
    "$setup" || exit 1
    snapshot > "$dir.before"
    timeout 60 "$@" > "$dir.stdout" 2> "$dir.stderr"
    echo $? > "$dir.rc"
  )
  if [ ! -f "$dir.rc" ]; then
    fail "setup failed"
  else
    local rc text
    rc=$(cat "$dir.rc")
    if [ "$want_rc" = 0 ]; then text=$(cat "$dir.stdout"); else text=$(cat "$dir.stderr"); fi
    if [ "$rc" = "$want_rc" ]; then pass; else fail "exit code $rc, expected $want_rc; stderr: $(cat "$dir.stderr")"; fi
    local needle
    for needle in "${expect[@]}"; do
      if [[ "$text" == *"$needle"* ]]; then pass; else fail "output lacks '$needle'; it was: $text"; fi
    done
    if [ "$want_rc" != 0 ]; then
      if diff <(cd "$dir" && snapshot) "$dir.before" > /dev/null; then
        pass
      else
        fail "the directory changed (something was written or overwritten):"
        diff <(cd "$dir" && snapshot) "$dir.before" | sed 's/^/    /'
      fi
    fi
  fi
  rm -rf "$dir" "$dir.before" "$dir.stdout" "$dir.stderr" "$dir.rc"
  expect=()
}

# ---- Setups: each runs in the case's directory. -------------------------------------------------------------
doc() { printf '{"text": "document %s with some words that make it a document of its own %s"}\n' "$1" "$1"; }
many_docs() { for i in $(seq 1 "$1"); do doc "$i"; done; }
nul_in_string() { { doc 1; printf '{"text": "raw\0nul"}\n'; doc 3; } > docs.jsonl; }
nul_after_object() { { doc 1; printf '{"text": "fine"}\0trailing\n'; doc 3; } | gzip -c > docs.jsonl.gz; }
nul_in_thousand() { { many_docs 500; printf '{"text": "a\0b"}\n'; many_docs 600; } > docs.jsonl; }
long_line() {
  { printf '{"text": "'; head -c 3000000 /dev/zero | tr '\0' 'a'; printf '"}\n'; doc 2; } | gzip -c > big.jsonl.gz
}
fifo_tokenizer() { doc 1 > docs.jsonl && mkfifo tok.bpe; }
fifo_input() { mkfifo docs.jsonl; }
fifo_in_dir() { mkdir in && doc 1 > in/a.jsonl && mkfifo in/b.jsonl; }
bad_file_in_dir() {
  mkdir in
  for i in $(seq 1 40); do doc "$i" | gzip -c > "in/$i.jsonl.gz"; done
  # One pretty-printed JSON document: no line of it is an object on its own.
  printf '{\n  "documents": [\n    {\n      "text": "one"\n    }\n  ]\n}\n' | gzip -c > in/x.json.gz
}
text_and() { doc 1 > docs.jsonl; "$@"; }
out_nonempty() { text_and mkdir out && echo mine > out/file; }
out_loop() { text_and ln -s loop loop; }
out_dangling() { text_and ln -s nowhere out; }
out_through_file() { text_and touch afile; }
# A prepared directory whose manifest says a smaller vocabulary than its BPE ids use.
forged_vocab() {
  for i in $(seq 1 300); do echo "line $i of a text that is long enough to train a tiny model on"; done > a.txt
  "$moe" prep --input a=a.txt --out prepared --vocab 400 --quiet > /dev/null || return 1
  sed -i 's/"vocab": [0-9]*/"vocab": 257/' prepared/manifest.json
}

# ---- NUL bytes and malformed lines: skipped and counted, refused past the bound. ----------------------------
expect=("docs.jsonl:2" "U+0000" "--max-bad-lines 0.1%")
run_case "a raw NUL in a string" 2 nul_in_string "$moe" prep --input docs.jsonl --out out --tokenizer byte --quiet

expect=("docs.jsonl.gz:2" "--max-bad-lines")
run_case "a NUL after the object" 2 nul_after_object "$moe" prep --input docs.jsonl.gz --out out --tokenizer byte --quiet

expect=("skipped 1 of 3 JSON Lines lines" "docs.jsonl:2")
run_case "a bad line within --max-bad-lines 1" 0 nul_in_string "$moe" prep --input docs.jsonl --out out \
  --tokenizer byte --max-bad-lines 1 --quiet

expect=("skipped 1 of 1101 JSON Lines lines" "docs.jsonl:501")
run_case "one bad line in 1101 is within 0.1%" 0 nul_in_thousand "$moe" prep --input docs.jsonl --out out \
  --tokenizer byte --quiet

# ---- Bounds on lines and files. -----------------------------------------------------------------------------
expect=("big.jsonl.gz:1" "longer than --max-line-bytes 1000000")
run_case "a line over --max-line-bytes" 2 long_line "$moe" prep --input big.jsonl.gz --out out --tokenizer byte \
  --max-line-bytes 1000000 --quiet

expect=("skipped 1 of 2 JSON Lines lines" "big.jsonl.gz:1: longer than --max-line-bytes")
run_case "a line over --max-line-bytes, allowed" 0 long_line "$moe" prep --input big.jsonl.gz --out out \
  --tokenizer byte --max-line-bytes 1000000 --max-bad-lines 50% --quiet

expect=("1 of 41 input files" "x.json.gz:1" "not JSON Lines" "--max-bad-files 0.1%")
run_case "a file that is not JSON Lines among 40" 2 bad_file_in_dir "$moe" prep --input in --out out --quiet

expect=("skipped 1 of 41 input files" "x.json.gz")
run_case "a file that is not JSON Lines, allowed" 0 bad_file_in_dir "$moe" prep --input in --out out \
  --tokenizer byte --max-bad-files 3% --quiet

expect=("--max-bad-files 5x" "a count")
run_case "--max-bad-files not a number" 2 bad_file_in_dir "$moe" prep --input in --out out --max-bad-files 5x --quiet

# ---- FIFOs and devices: refused, never waited on. ---------------------------------------------------------
expect=("--tokenizer tok.bpe" "a FIFO")
run_case "a FIFO tokenizer" 2 fifo_tokenizer "$moe" prep --input docs.jsonl --out out --tokenizer tok.bpe --quiet

expect=("--tokenizer /dev/zero" "a character device")
run_case "/dev/zero as the tokenizer" 2 text_and "$moe" prep --input docs.jsonl --out out --tokenizer /dev/zero --quiet

expect=("docs.jsonl" "not a regular file")
run_case "a FIFO input" 2 fifo_input "$moe" prep --input docs.jsonl --out out --quiet

expect=("in/b.jsonl: a FIFO")
run_case "a FIFO in an input directory" 2 fifo_in_dir "$moe" prep --input in --out out --tokenizer byte --quiet

# ---- --out ------------------------------------------------------------------------------------------------
expect=("--out out" "exists (a directory)" "overwrites nothing")
run_case "--out a non-empty directory" 2 out_nonempty "$moe" prep --input docs.jsonl --out out/ --quiet

expect=("--out loop/out" "symbolic links")
run_case "--out through a link loop" 2 out_loop "$moe" prep --input docs.jsonl --out loop/out --quiet

expect=("--out loop" "exists (a symbolic link)")
run_case "--out a link loop" 2 out_loop "$moe" prep --input docs.jsonl --out loop --quiet

expect=("--out out" "exists (a symbolic link)")
run_case "--out a dangling link" 2 out_dangling "$moe" prep --input docs.jsonl --out out --quiet

expect=("--out afile/out" "afile is a file, not a directory")
run_case "--out through a file" 2 out_through_file "$moe" prep --input docs.jsonl --out afile/out --quiet

expect=("moe prep: out/ written")
run_case "--out with a trailing slash" 0 text_and "$moe" prep --input docs.jsonl --out out/ --tokenizer byte --quiet

# ---- Training on prepared data whose ids do not fit. -------------------------------------------------------
expect=("prepared" ".bin" "holds token id" "257 ids")
run_case "train on shards with ids beyond the manifest's vocab" 2 forged_vocab "$moe" train --config "$config" \
  "${small[@]}" --set model.vocab=512 --set 'data.sources=[{"name": "a", "path": "prepared"}]' --run-dir run

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
