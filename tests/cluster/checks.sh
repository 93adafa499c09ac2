# What the cluster tests share (sourced after cluster.sh and cluster_login): counting checks, and the
# MOE_BINARY SOURCE_DIR arguments of the tests that train.
passed=0
failed=0
check() {  # check DESCRIPTION COMMAND...: the command must succeed
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)) && echo "FAIL: $what"; fi
}
contains() { [[ "$1" == *"$2"* ]]; }
lacks() { [[ "$1" != *"$2"* ]]; }
# The last command of a test: the counts, and its status (0 when no check failed).
checks_summary() {
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}
# training_test_args "$0" "$@": sets moe (the binary) and config (configs/tiny_moe.json of the source tree).
training_test_args() {
  local self=$1
  shift
  if [ $# -ne 2 ]; then
    echo "usage: $self MOE_BINARY SOURCE_DIR" >&2
    exit 2
  fi
  moe=$(realpath "$1")
  config=$(realpath "$2/configs/tiny_moe.json")
}
# What the launch tests read back from a run directory $shared/NAME (set $shared first).
# events_of NAME EVENT KEY...: each EVENT of events.log, its KEYs only, one JSON object per line.
events_of() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e["event"] == sys.argv[2]:
        print(json.dumps({k: e[k] for k in sys.argv[3:] if k in e}, sort_keys=True))
' "$shared/$1/events.log" "${@:2}"; }
# losses NAME: step, loss, grad_norm and eval_loss of each line of metrics.jsonl, as Python's repr prints them.
losses() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(m["step"], *(repr(m[k]) for k in ("loss", "grad_norm", "eval_loss") if k in m))
' "$shared/$1/metrics.jsonl"
}
logged() { cat "$shared/$1/metrics.jsonl" 2> /dev/null | wc -l; }  # with builtins and coreutils: polled fast
