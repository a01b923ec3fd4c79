#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz/ with AddressSanitizer and
# UndefinedBehaviorSanitizer and runs them one after another.
#
#   bash scripts/fuzz.sh [SECONDS] [HARNESS...]   fuzz each harness for SECONDS (default 60)
#   bash scripts/fuzz.sh --smoke [HARNESS...]     run each harness over its seed corpus only (CI)
#
# HARNESS: sampling_fuzz, verify_fuzz, decode_fuzz, batch_fuzz, tokenizer_fuzz, checkpoint_fuzz,
# profile_fuzz (default: all). Needs clang++-14 with its libFuzzer runtime: `bash scripts/install_deps.sh --fuzz`
# (SPECDEC_FUZZ_CXX=... picks another clang). Binaries, logs and findings go to build/fuzz/ (the
# smoke run's unoptimized binaries to build/fuzz/smoke/); each harness
# fuzzes a copy of its seed corpus in build/fuzz/corpus/<harness>/ (kept between runs, so a
# later run starts from what an earlier one found; the seeds in the tree never change). A
# finding (crash, sanitizer report, failed invariant, timeout, out of memory) leaves its input
# in build/fuzz/findings/<harness>/; reproduce with build/fuzz/<harness> <that file>.
# Exit status: 0 when no harness found anything.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
out="$root/build/fuzz"

all=(sampling_fuzz verify_fuzz decode_fuzz batch_fuzz tokenizer_fuzz checkpoint_fuzz profile_fuzz)
smoke=0
seconds=60
harnesses=()
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    ''|*[!0-9]*)
      found=0
      for h in "${all[@]}"; do [ "$h" = "$arg" ] || [ "$h" = "${arg}_fuzz" ] && { harnesses+=("$h"); found=1; }; done
      [ $found -eq 1 ] || { echo "fuzz.sh: unknown argument '$arg' (see --help)" >&2; exit 2; } ;;
    *) seconds=$arg ;;
  esac
done
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all[@]}")

cxx=${SPECDEC_FUZZ_CXX:-clang++-14}
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz.sh: $cxx not found; install it with: bash scripts/install_deps.sh --fuzz" >&2
  exit 2
fi

# The largest input each harness takes: the checkpoint, tokenizer and profile harnesses read whole files.
max_len() {
  case "$1" in
    tokenizer_fuzz|checkpoint_fuzz|profile_fuzz) echo 8192 ;;
    *) echo 2048 ;;
  esac
}

# The smoke run (each seed once) builds binaries of its own, unoptimized and with line tables
# only: its builds take about a third of the time, and the seeds run in a second either way.
if [ $smoke -eq 1 ]; then
  bin_dir="$out/smoke" opt=(-O0 -gline-tables-only)
else
  bin_dir="$out" opt=(-O1 -g)
fi
flags=(-std=c++20 "${opt[@]}" -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=all -I include -I examples -isystem /usr/include/eigen3)

mkdir -p "$out" "$bin_dir"
# Builds SPECDEC_FUZZ_JOBS harnesses at a time (default: the machine's processors).
jobs=${SPECDEC_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
pids=()
for h in "${harnesses[@]}"; do
  bin="$bin_dir/$h"
  # Rebuild when the harness or anything it includes is newer than the binary.
  if [ ! -x "$bin" ] || [ -n "$(find tests/fuzz/"$h".cpp tests/fuzz/fuzz_common.hpp include examples/llama2 \
        -newer "$bin" -name '*.[hc]pp' -print -quit)" ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 1; done
    echo "fuzz.sh: building $h"
    { "$cxx" "${flags[@]}" "tests/fuzz/$h.cpp" -o "$bin.tmp" && mv -f "$bin.tmp" "$bin"; } &
    pids+=($!)
  fi
done
build_failed=0
for pid in "${pids[@]}"; do wait "$pid" || build_failed=1; done
if [ $build_failed -ne 0 ]; then
  echo "fuzz.sh: a harness failed to build (its compiler messages are above)" >&2
  exit 2
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

summary=()
failed=0
total=0
for h in "${harnesses[@]}"; do
  bin="$bin_dir/$h"
  seeds="tests/fuzz/corpus/$h"
  corpus="$out/corpus/$h"
  findings="$out/findings/$h"
  log="$out/logs/$h.log"
  mkdir -p "$corpus" "$findings" "$out/logs"
  cp -f "$seeds"/* "$corpus"/
  start=$(date +%s)
  status=0
  rate=
  if [ $smoke -eq 1 ]; then
    # Each seed once, nothing else.
    "$bin" -artifact_prefix="$findings/" "$seeds"/* >"$log" 2>&1 || status=$?
    execs=$(grep -c '^Executed ' "$log" || true)
  else
    echo "fuzz.sh: $h for ${seconds}s (log: ${log#"$root"/})"
    "$bin" -max_total_time="$seconds" -max_len="$(max_len "$h")" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  fi
  elapsed=$(( $(date +%s) - start ))
  total=$(( total + ${execs:-0} ))
  if [ $status -eq 0 ]; then
    result="no finding"
  else
    failed=1
    # (A seed that fails in the smoke run is named in the log, not written as a test unit.)
    artifact=$(grep -o 'Test unit written to .*' "$log" | tail -1 | sed 's/Test unit written to //' || true)
    result="FINDING (exit $status): ${artifact:-see $log}"
    grep -m1 -E 'INVARIANT VIOLATED|ERROR: (AddressSanitizer|libFuzzer)|runtime error|deadly signal' "$log" >&2 || true
  fi
  summary+=("$(printf '%-16s %11s executions %6ss %8s  %s' "$h" "${execs:-?}" "$elapsed" \
    "${rate:+$rate/s}" "$result")")
done

echo
echo "fuzz.sh summary ($([ $smoke -eq 1 ] && echo 'smoke: seed corpus only' || echo "${seconds}s per harness")):"
printf '  %s\n' "${summary[@]}"
echo "  total: $total executions"
exit $failed
