#!/usr/bin/env bash
# Runs each test file on its own with a time limit, appending to $RESULTS/tests-by-file.log,
# so one slow or hanging file cannot hide the others' results.
RESULTS=${RESULTS:-gpu-results}; mkdir -p "$RESULTS"
log="$RESULTS/tests-by-file.log"; : > "$log"
for f in ${TEST_FILES:-tests/test_*.py}; do
  start=$(date +%s)
  timeout "${FILE_TIMEOUT:-90}" python3 -m pytest -q --tb=short -p no:cacheprovider --timeout "${TEST_TIMEOUT:-60}" "$f" > "$RESULTS/last.log" 2>&1
  rc=$?
  { echo "=== $f rc=$rc $(( $(date +%s) - start ))s"; grep -E "^(FAILED|ERROR)|passed|failed|Timeout|^E  " "$RESULTS/last.log" | grep -v torchelastic | head -${LINES_PER_FILE:-25}; } >> "$log"
  tail -1 "$RESULTS/last.log" | sed "s|^|$f: |"
done
if [ -n "${OUT:-}" ]; then cp "$log" "$OUT/"; fi
