#!/usr/bin/env bash
# Build, test and benchmark on a GPU machine in one go.
#   bash tools/gpu_run.sh build tests bench:gather_bandwidth bench:traversal ...
# Each stage logs to $RESULTS/<stage>.log; benchmark results land in $RESULTS. Everything is
# packed into $OUT/gpu-results.tgz when $OUT is set (the GPU host's result folder).
set -uo pipefail
RESULTS=${RESULTS:-gpu-results}
mkdir -p "$RESULTS"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
status=0

pack() {
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-results.tgz" "$RESULTS"; fi
}
trap pack EXIT

nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv > "$RESULTS/gpu.txt" 2>&1
for stage in "$@"; do
  log="$RESULTS/${stage//:/_}.log"
  start=$(date +%s)
  case "$stage" in
    build) python3 -m pip install --no-build-isolation --no-deps -e . > "$log" 2>&1 ;;
    tests) python3 -m pytest -q -rs -p no:cacheprovider ${PYTEST_ARGS:-tests} > "$log" 2>&1 ;;
    doctor) zerocopy doctor > "$log" 2>&1 ;;
    bench:*) name=${stage#bench:}; python3 "benchmarks/$name.py" --out "$RESULTS" ${BENCH_ARGS:-} > "$log" 2>&1 ;;
    *) echo "unknown stage $stage" > "$log"; false ;;
  esac
  rc=$?
  echo "== $stage: exit $rc in $(( $(date +%s) - start )) s"
  tail -n "${TAIL_LINES:-15}" "$log"
  [ $rc -ne 0 ] && status=1
  [ "$stage" = build ] && [ $rc -ne 0 ] && exit 1
done
exit $status
