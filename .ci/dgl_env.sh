#!/usr/bin/env bash
# The tests against a real DGL, in a second pinned environment.
#
# DGL's last release (2.1.0) ships libraries for torch 2.0.0-2.2.1 only, so these tests cannot
# run in the main CI environment. This script keeps a venv ($CACHE/dgl-venv) with torch 2.2.1 + dgl 2.1.0
# (reused when its versions are right; the wheels are kept in $CACHE/dgl-wheels so a rebuild
# of the venv does not download again), compiles this package's CPU build against that torch
# in a copy of the tree (.ci-cache/dgl-src: an in-place build here would overwrite the main
# environment's extension), and runs tests/with_dgl there. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

export PIP_DISABLE_PIP_VERSION_CHECK=1
export DGLBACKEND=pytorch
# The environment and its wheels live outside the checkout, so a fresh clone (as CI uses)
# reuses them instead of downloading ~5 GB again.
CACHE=${PYTORCH_ZEROCOPY_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pytorch_zerocopy-ci}
VENV=$CACHE/dgl-venv
WHEELS=$CACHE/dgl-wheels
SRC=$ROOT/.ci-cache/dgl-src
# numpy < 2 and pandas < 2.3: DGL 2.1 and torch 2.2 were built against numpy 1.
REQS=(torch==2.2.1 dgl==2.1.0 "numpy<2" "pandas<2.3" pyyaml pydantic pytest psutil ninja)
TORCHDATA=torchdata==0.7.1  # newer torchdata lacks the datapipes DGL imports; --no-deps

venv_ok() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - <<'EOF' >/dev/null 2>&1
import dgl, numpy, torch, torchdata, pytest
assert torch.__version__.split("+")[0] == "2.2.1", torch.__version__
assert dgl.__version__ == "2.1.0", dgl.__version__
assert torchdata.__version__.startswith("0.7.1"), torchdata.__version__
assert int(numpy.__version__.split(".")[0]) < 2, numpy.__version__
EOF
}

start=$(date +%s)
if venv_ok; then
  echo "dgl env: reusing $VENV"
else
  echo "dgl env: building $VENV (torch 2.2.1, dgl 2.1.0)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  mkdir -p "$WHEELS"
  # The wheels are downloaded once (the marker records for which requirements the set is
  # complete), then installed from $WHEELS alone.
  want="${REQS[*]} $TORCHDATA"
  if [ "$(cat "$WHEELS/complete" 2>/dev/null)" != "$want" ]; then
    "$VENV/bin/pip" download -q -d "$WHEELS" "${REQS[@]}"
    "$VENV/bin/pip" download -q --no-deps -d "$WHEELS" "$TORCHDATA"
    echo "$want" >"$WHEELS/complete"
  fi
  "$VENV/bin/pip" install -q --no-index --find-links "$WHEELS" "${REQS[@]}"
  "$VENV/bin/pip" install -q --no-index --no-deps --find-links "$WHEELS" "$TORCHDATA"
  venv_ok || { echo "dgl env: the environment does not import dgl 2.1.0 on torch 2.2.1" >&2; exit 1; }
fi
echo "dgl env: ready in $(( $(date +%s) - start )) s"

# A copy of the tracked and untracked-but-not-ignored files. Extraction keeps modification
# times, so the ninja build in $SRC/build recompiles only what changed since the last run.
mkdir -p "$SRC"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - -cf - | tar -xf - -C "$SRC"
else  # not a git checkout: everything but environments, caches and build outputs
  tar --exclude=./.ci-venv --exclude=./.ci-dgl-venv --exclude=./.ci-cache --exclude=./build \
      --exclude='*.so' --exclude=__pycache__ -cf - . | tar -xf - -C "$SRC"
fi
start=$(date +%s)
(cd "$SRC" && FORCE_ONLY_CPU=1 MAX_JOBS="${MAX_JOBS:-4}" "$VENV/bin/python" setup.py -q build_ext --inplace >build.log 2>&1) \
  || { tail -50 "$SRC/build.log"; echo "dgl env: building against torch 2.2.1 failed" >&2; exit 1; }
echo "dgl env: built against torch 2.2.1 in $(( $(date +%s) - start )) s"

cd "$SRC"
set +e
"$VENV/bin/python" -m pytest -q tests/with_dgl "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "dgl env: pytest collected no DGL tests" >&2
  exit 1
fi
exit "$rc"
