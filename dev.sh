#!/usr/bin/env bash
# strata's two entry points on a fresh machine (no GPU needed):
#   bash dev.sh demo   -- the main job on an embedded default
#   bash dev.sh test   -- the whole test suite
# Each makes .venv and installs the exact CPU pins first (a no-op once done).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv
# Exact pins for the CPU machine: torch 2.13.0 (CPU, from this machine's disk), triton 3.6.0
# as on the GPU image, whose interpreter needs numpy < 2.4.
PINS=(torch==2.13.0 triton==3.6.0 "numpy>=1.26,<2.4" gguf==0.19.0 safetensors==0.8.0
      tqdm==4.70.1 hypothesis==6.170.17 pytest==9.0.3 pytest-xdist==3.8.0 execnet==2.1.2 matplotlib==3.11.2 transformers==5.24.0
      nbformat==5.11.1 nbclient==0.11.0 ipykernel==7.4.0 fla-core==0.6.0 einops==0.8.2)
stamp="$VENV/.strata-pins"
want="$(printf '%s\n' "${PINS[@]}")"
if [ ! -x "$VENV/bin/python" ]; then "$PY" -m venv "$VENV"; fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "dev.sh: installing pinned dependencies into $VENV (once)" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PINS[@]}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
    printf '%s' "$want" > "$stamp"
fi
cmd=${1:-demo}; shift || true
case "$cmd" in
    demo) exec "$VENV/bin/strata" demo "$@" ;;
    test)
        # pytest exits 5 when it collected nothing: that is a failure here, not green.
        # Two workers (CI has two cores), one test file per worker at a time (module fixtures
        # stay in one process); a later `-n 0` in the arguments runs it serially.
        set +e; "$VENV/bin/python" -m pytest -n 2 --dist loadfile "$@"; rc=$?; set -e
        if [ "$rc" = 5 ]; then echo "dev.sh: pytest collected no tests" >&2; exit 1; fi
        exit "$rc" ;;
    *) echo "usage: bash dev.sh demo|test [args]" >&2; exit 2 ;;
esac
