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
