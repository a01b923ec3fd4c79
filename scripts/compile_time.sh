#!/usr/bin/env bash
# Measures what including specdec costs at compile time: the CPU time (user + sys) of compiling
# a TU that includes only <Eigen/Core>; one that adds the standard headers that specdec's headers
# include; one that adds <immintrin.h> as well (the floor of the design: everything it includes,
# no line of specdec); one that includes only <specdec/speculative_decode.hpp> (the decoding loop,
# verification and sampling); one that includes only <specdec/specdec.hpp>; one that includes it
# through a precompiled header (GCC only: what a build that precompiles it pays per TU); and one
# that also instantiates the decoding loops once. The last three again in compiled mode
# (SPECDEC_COMPILED: the hot core only declared, compiled once in src/specdec_core.cpp), whose
# own one-time cost is printed too. Prints the median of each and the ratios to the Eigen-only TU.
#
#   scripts/compile_time.sh [--max-ratio R] [--no-use] [--no-pch] [--include-dir DIR] [COMPILER [REPEATS]]
#
# COMPILER defaults to ${CXX:-c++}, REPEATS to 5. --max-ratio R: exit 1 when specdec/Eigen
# exceeds R. --include-dir DIR (or SPECDEC_INCLUDE_DIR): the specdec headers to measure
# (default: the checkout's include/). EIGEN_INCLUDE_DIR (default /usr/include/eigen3) and
# EXTRA_CXXFLAGS are honoured.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

max_ratio=""
with_use=1
with_pch=1
include_dir="${SPECDEC_INCLUDE_DIR:-${root}/include}"
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --max-ratio) max_ratio="${2:?--max-ratio needs a value}"; shift 2 ;;
    --max-ratio=*) max_ratio="${1#*=}"; shift ;;
    --include-dir) include_dir="${2:?--include-dir needs a directory}"; shift 2 ;;
    --include-dir=*) include_dir="${1#*=}"; shift ;;
    --no-use) with_use=0; shift ;;
    --no-pch) with_pch=0; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compile_time: unknown option $1" >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
cxx="${positional[0]:-${CXX:-c++}}"
repeats="${positional[1]:-5}"
eigen_dir="${EIGEN_INCLUDE_DIR:-/usr/include/eigen3}"
if ! [[ "${repeats}" =~ ^[1-9][0-9]*$ ]]; then
  echo "compile_time: REPEATS must be a positive integer, got '${repeats}'" >&2; exit 2
fi
if [ -n "${max_ratio}" ] && ! [[ "${max_ratio}" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "compile_time: --max-ratio must be a positive number, got '${max_ratio}'" >&2; exit 2
fi
[ -f "${include_dir}/specdec/specdec.hpp" ] || {
  echo "compile_time: no specdec/specdec.hpp in ${include_dir}" >&2; exit 2; }
[ -f "${eigen_dir}/Eigen/Core" ] || { echo "compile_time: no Eigen/Core in ${eigen_dir}" >&2; exit 2; }
include_dir="$(cd "${include_dir}" && pwd)"  # relative to the caller's directory
cd "${root}"

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

printf '#include <Eigen/Core>\n' > "${tmp}/eigen.cpp"
printf '#include <specdec/specdec.hpp>\n' > "${tmp}/specdec.cpp"
printf '#include <Eigen/Core>\n#include <specdec/speculative_decode.hpp>\n' > "${tmp}/core.cpp"
# The floor: Eigen/Core with every standard and intrinsics header that specdec's headers include,
# and no line of specdec (what the design costs before its own code).
# (The headers that specdec.hpp reaches, as the compiler lists them.)
mapfile -t specdec_headers < <("${cxx}" -std=c++20 -I "${include_dir}" -I "${eigen_dir}" -H -fsyntax-only \
  "${tmp}/specdec.cpp" 2>&1 | sed -n 's/^\.* //p' | grep -F "${include_dir}/specdec/" | sort -u)
{
  printf '#include <Eigen/Core>\n'
  grep -hoE '^#include <[a-z_]+(\.h)?>' "${include_dir}/specdec/specdec.hpp" "${specdec_headers[@]}" | sort -u
} > "${tmp}/floor.cpp"
grep -v '<immintrin.h>' "${tmp}/floor.cpp" > "${tmp}/floor_std.cpp"
# One call of each decoding loop with a trivial model (uniform logits), for the instantiation cost.
cat > "${tmp}/use.cpp" <<'EOF'
#include <specdec/specdec.hpp>
#include <random>
namespace {
struct flat_model {
    std::ptrdiff_t vocab_size() const { return 8; }
    Eigen::VectorXf next_logits(std::span<const specdec::token_id>) const { return Eigen::VectorXf::Zero(8); }
};
}  // namespace
std::size_t use() {
    flat_model draft, target;
    const std::vector<specdec::token_id> prompt{1, 2};
    std::mt19937_64 rng(1);
    const auto a = specdec::speculative_decode(draft, target, prompt, {}, rng);
    const auto b = specdec::autoregressive_decode(target, prompt, {}, rng);
    return a.tokens.size() + b.tokens.size();
}
EOF
# Compiled mode: the same TUs with SPECDEC_COMPILED defined first.
for tu in core specdec use; do
  { printf '#define SPECDEC_COMPILED 1\n'; cat "${tmp}/${tu}.cpp"; } > "${tmp}/${tu}_compiled.cpp"
done
cp "${root}/src/specdec_core.cpp" "${tmp}/library.cpp"

flags=(-std=c++20 -O2 -I "${include_dir}" -I "${eigen_dir}" ${EXTRA_CXXFLAGS:-})

# Prints the CPU seconds (user + sys, compiler subprocesses included) of one compilation.
cpu_seconds() {
  local TIMEFORMAT='%3U %3S' t
  t="$({ time "${cxx}" "${flags[@]}" -c "$1" -o /dev/null 2>"${tmp}/err" >/dev/null; } 2>&1)" || {
    echo "compile_time: ${cxx} failed on $(basename "$1"):" >&2; cat "${tmp}/err" >&2; exit 1; }
  awk '{ printf "%.3f\n", $1 + $2 }' <<<"${t}"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The precompiled header: built once (its cost is printed, not part of the medians); the TU then
# includes it as a build that precompiles <specdec/specdec.hpp> would. GCC's .gch only.
if [ "${with_pch}" -eq 1 ] && "${cxx}" --version | head -n 1 | grep -qi clang; then with_pch=0; fi
if [ "${with_pch}" -eq 1 ]; then
  mkdir -p "${tmp}/pch"
  printf '#include <specdec/specdec.hpp>\n' > "${tmp}/pch/specdec_all.hpp"
  printf '#include "specdec_all.hpp"\n' > "${tmp}/pch_use.cpp"
  pch_build="$( { TIMEFORMAT='%3U %3S'; time "${cxx}" "${flags[@]}" -x c++-header "${tmp}/pch/specdec_all.hpp" \
      -o "${tmp}/pch/specdec_all.hpp.gch" 2>"${tmp}/err" >/dev/null; } 2>&1)" || {
    echo "compile_time: ${cxx} failed to precompile specdec.hpp:" >&2; cat "${tmp}/err" >&2; exit 1; }
  pch_build="$(awk '{ printf "%.3f", $1 + $2 }' <<<"${pch_build}")"
  flags+=(-I "${tmp}/pch" -Winvalid-pch)
  # GCC marks a precompiled header it used with '!' in its -H listing.
  listing="$("${cxx}" "${flags[@]}" -H -fsyntax-only "${tmp}/pch_use.cpp" 2>&1 || true)"
  grep -q '^! .*specdec_all\.hpp\.gch' <<<"${listing}" || {
    echo "compile_time: ${cxx} did not use the precompiled header" >&2; exit 1; }
fi

tus=(eigen floor_std floor core specdec)
[ "${with_pch}" -eq 1 ] && tus+=(pch_use)
[ "${with_use}" -eq 1 ] && tus+=(use)
tus+=(core_compiled specdec_compiled)
[ "${with_use}" -eq 1 ] && tus+=(use_compiled library)
declare -A samples med
for tu in "${tus[@]}"; do samples[${tu}]=""; done
# Interleave the TUs so that drifting machine load affects them alike.
for ((i = 0; i < repeats; i++)); do
  for tu in "${tus[@]}"; do samples[${tu}]+="$(cpu_seconds "${tmp}/${tu}.cpp") "; done
done
for tu in "${tus[@]}"; do med[${tu}]="$(tr ' ' '\n' <<<"${samples[${tu}]}" | grep . | median)"; done

declare -A label=([eigen]="<Eigen/Core> only" [floor_std]="+ the std headers"
                  [floor]="+ <immintrin.h> (the floor)"
                  [core]="<specdec/speculative_decode.hpp>"
                  [specdec]="<specdec/specdec.hpp> only"
                  [pch_use]="specdec.hpp, precompiled"
                  [use]="specdec.hpp + decode calls"
                  [core_compiled]="compiled mode: speculative_decode.hpp"
                  [specdec_compiled]="compiled mode: specdec.hpp only"
                  [use_compiled]="compiled mode: + decode calls"
                  [library]="compiled mode: specdec_core.cpp (once)")
echo "compiler: ${cxx} ($("${cxx}" --version | head -n 1)); ${repeats} runs, CPU s (user+sys)"
echo "headers:  ${include_dir}"
printf '%-40s %8s %8s  %s\n' "TU" "median" "ratio" "runs"
for tu in "${tus[@]}"; do
  ratio="$(awk -v x="${med[${tu}]}" -v e="${med[eigen]}" 'BEGIN { printf "%.2f", x / e }')"
  printf '%-40s %8.3f %8s  %s\n' "${label[${tu}]}" "${med[${tu}]}" "${ratio}" "${samples[${tu}]% }"
done
[ "${with_pch}" -eq 1 ] && echo "(building the precompiled header, once: ${pch_build} s)"

if [ -n "${max_ratio}" ]; then
  if awk -v s="${med[specdec]}" -v e="${med[eigen]}" -v r="${max_ratio}" 'BEGIN { exit !(s > r * e) }'; then
    echo "FAIL: specdec.hpp / Eigen/Core exceeds ${max_ratio}" >&2
    exit 1
  fi
  echo "OK: specdec.hpp / Eigen/Core within ${max_ratio}"
fi
