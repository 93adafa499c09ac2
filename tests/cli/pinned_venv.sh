# pinned_venv VENV REQUIREMENTS WHAT [PIP_OPTION...]: a virtual environment at VENV holding REQUIREMENTS (pinned
# versions, tests/requirements-*.txt), made with Debian's python3 (python3-venv) when missing or made from
# another version of the file (VENV/requirements.sha256). When it cannot be made (no network) the calling test
# fails, unless MOE_TEST_OFFLINE=1 says this machine is offline: then it is skipped (exit 77). WHAT names the
# packages in the messages; PIP_OPTIONs go to pip install (e.g. --no-deps). Sourced by the tests that need one.
# Tests that share an environment may start together (ctest -j): one makes it while the others wait on VENV.lock
# (flock), then find it made.
pinned_venv() {
  mkdir -p "$(dirname "$1")"
  (flock 9 && make_pinned_venv "$@") 9> "$1.lock"
  local status=$?
  [ "$status" = 0 ] || exit "$status"
}

# pinned_venv's work, under its lock (a subshell: exit 77 or 1 leaves it with that status).
make_pinned_venv() {
  local venv=$1 requirements=$2 what=$3
  shift 3
  # Debian's python3 (python3-venv) first: a pyenv python3 may lack ensurepip.
  local python="" candidate
  for candidate in /usr/bin/python3 python3; do
    if command -v "$candidate" > /dev/null && "$candidate" -c "import venv, ensurepip" 2> /dev/null; then
      python=$candidate
      break
    fi
  done
  local stamp="$venv/requirements.sha256" want
  want=$(sha256sum "$requirements" | cut -d' ' -f1)
  [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2> /dev/null)" = "$want" ] && return 0
  if [ -z "$python" ]; then
    echo "FAIL: no python3 with venv and ensurepip to make $venv (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
  rm -rf "$venv"
  if ! { "$python" -m venv "$venv" \
    && "$venv/bin/pip" install -q --disable-pip-version-check "$@" -r "$requirements"; } > "$venv.log" 2>&1; then
    tail -5 "$venv.log" >&2
    rm -rf "$venv"
    if [ "${MOE_TEST_OFFLINE:-0}" = 1 ]; then
      echo "skipped: MOE_TEST_OFFLINE=1 and $what could not be installed from PyPI (log: $venv.log)"
      exit 77
    fi
    echo "FAIL: could not install $requirements from PyPI into $venv (log: $venv.log); this test needs PyPI," \
      "or set MOE_TEST_OFFLINE=1 on a machine without network to skip it" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
}

# venv_test_start NAME REQUIREMENTS WHAT [PIP_OPTION...] -- MOE_BINARY SOURCE_DIR VENV: the common start of a test
# that runs a pinned environment's tools. Checks the test's three arguments and names them (moe, src, venv; config:
# configs/tiny_moe.json), makes the environment (pinned_venv, REQUIREMENTS relative to SOURCE_DIR), clears the
# variables an enclosing mpirun leaves (each `moe` the test starts is its own job), and makes a work directory
# (work) named after NAME, removed at exit, and enters it.
venv_test_start() {
  local name=$1 requirements=$2 what=$3
  shift 3
  local pip_options=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    pip_options+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift
  if [ $# -ne 3 ]; then
    echo "usage: $0 MOE_BINARY SOURCE_DIR VENV" >&2
    exit 2
  fi
  moe=$1 src=$2 venv=$3
  config="$src/configs/tiny_moe.json"
  pinned_venv "$venv" "$src/$requirements" "$what" "${pip_options[@]}"
  unset OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_SIZE OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS
  work=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  cd "$work"
}
