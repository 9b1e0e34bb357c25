#!/usr/bin/env bash
# Build, test and benchmark on a GPU machine in one command, within a time budget.
#   bash tools/gpu_run.sh build sweep tests:par tests:ser bench:training ...
# Stages (each with its own time limit, seconds, after a colon: bench:training@300):
#   build            pip install -e . for the GPU's architecture
#   tests:par        the GPU-safe test files, several pytest workers at once (pytest-xdist)
#   tests:ser        the test files that start processes or take the whole GPU, one at a time
#   tests:FILE,...   the named test files (PYTEST_ARGS adds options, split on spaces; PYTEST_K is one
#                    -k expression, spaces kept; QUIET= names every test)
#   bench:NAME       benchmarks/NAME.py --out $RESULTS (BENCH_ARGS_NAME adds options)
#   doctor           zerocopy doctor
# A test stage that reaches its limit gets SIGINT first, so pytest still names (-rfE) and shows
# the failures so far, then SIGKILL 30 s later. Each stage logs to $RESULTS/<stage>.log; results
# land in $RESULTS, packed into $OUT/gpu-results.tgz when $OUT is set (the GPU host's result
# folder), also after a timeout.
set -uo pipefail
RESULTS=${RESULTS:-gpu-results}
mkdir -p "$RESULTS"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
status=0

# Files whose tests start processes (pipelines, launchers, MPS daemons) or time the machine.
SERIAL="tests/test_launch.py tests/test_pipeline.py tests/test_pipeline_failures.py tests/test_pipeline_gpu.py
tests/test_train.py tests/test_train_data_parallel.py tests/test_train_step.py tests/test_examples.py
tests/test_unified_sharing.py tests/test_reliability_host.py tests/test_checkpoint.py"

pack() {
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-results.tgz" "$RESULTS" 2>/dev/null; fi
}
trap pack EXIT

parallel_files() {
  for f in tests/test_*.py; do
    case " $(echo $SERIAL) " in *" $f "*) ;; *) echo "$f" ;; esac
  done
}

nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv \
  > "$RESULTS/gpu.txt" 2>&1
for spec in "$@"; do
  stage=${spec%@*}
  limit=600
  [ "$spec" != "$stage" ] && limit=${spec##*@}
  log="$RESULTS/$(echo "$stage" | tr ':/,' '___').log"
  start=$(date +%s)
  case "$stage" in
    build) timeout "$limit" python3 -m pip install --no-build-isolation --no-deps -e . > "$log" 2>&1 ;;
    # Workers share the cores: each gets two OpenMP threads and compiles inductor's kernels itself.
    tests:par) OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TORCHINDUCTOR_COMPILE_THREADS=1 \
               timeout -s INT -k 30 "$limit" python3 -m pytest ${QUIET--q} -rfE -p no:cacheprovider -n "${WORKERS:-4}" --dist loadfile \
                 -m "not whole_gpu" ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} $(parallel_files) > "$log" 2>&1 ;;
    tests:ser) timeout -s INT -k 30 "$limit" python3 -m pytest ${QUIET--q} -rfE -p no:cacheprovider ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} $SERIAL \
                 > "$log" 2>&1
               rc1=$?
               timeout 120 python3 -m pytest ${QUIET--q} -rfE -p no:cacheprovider -m whole_gpu $(parallel_files) \
                 >> "$log" 2>&1
               [ $rc1 -eq 0 ] && [ $? -eq 0 ] ;;
    tests:*) timeout -s INT -k 30 "$limit" python3 -m pytest ${QUIET--q} -rfE -p no:cacheprovider ${PYTEST_ARGS:-} ${PYTEST_K:+-k "$PYTEST_K"} \
               $(echo "${stage#tests:}" | tr ',' ' ') > "$log" 2>&1 ;;
    bench:*) name=${stage#bench:}; var="BENCH_ARGS_${name^^}"
             timeout "$limit" python3 "benchmarks/$name.py" --out "$RESULTS" ${!var:-} > "$log" 2>&1 ;;
    doctor) timeout "$limit" zerocopy doctor > "$log" 2>&1 ;;
    *) echo "unknown stage $stage" > "$log"; false ;;
  esac
  rc=$?
  echo "== $stage: exit $rc in $(( $(date +%s) - start )) s"
  tail -n "${TAIL_LINES:-12}" "$log"
  [ $rc -ne 0 ] && status=1
  [ "$stage" = build ] && [ $rc -ne 0 ] && exit 1
  pack
done
exit $status
