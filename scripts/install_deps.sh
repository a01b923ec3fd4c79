#!/usr/bin/env bash
# Installs what specdec needs to build, test and benchmark on Debian/Ubuntu, using only
# Debian packages: compiler, CMake, Ninja, Eigen 3.4, Catch2, Google Benchmark; for the tests
# and example programs only (the library needs Eigen alone): nlohmann-json (the golden data),
# CLI11 (the examples' options), pkg-config (the packaging test), python3 and curl (the
# download script's test runs a local file server and fetches from it); python3-matplotlib and
# fonts-dejavu-core (scripts/trace_report.py draws the trace report's charts) and chromium (the
# report's test loads the page in a headless browser); doxygen (the API reference, the target
# specdec_docs, and its test docs.api_coverage, which checks that every public declaration is
# documented).
# Installs nothing that is already present. Run as root (or with sudo available).
#
# Opt-in: `--fuzz` (or SPECDEC_FUZZ_DEPS=1) also installs clang-14 and its sanitizer and
# libFuzzer runtime (libclang-rt-14-dev), which scripts/fuzz.sh needs.
set -euo pipefail

packages=(g++ cmake ninja-build libeigen3-dev catch2 libbenchmark-dev
          nlohmann-json3-dev libcli11-dev pkg-config python3 curl
          python3-matplotlib fonts-dejavu-core chromium doxygen)
# Installed when the distribution has them, else left out with a note (Ubuntu ships Chromium as
# a snap, not as the deb 'chromium'): the tests that need them skip.
optional=(chromium)
fuzz=${SPECDEC_FUZZ_DEPS:-0}
for arg in "$@"; do
  case "$arg" in
    --fuzz) fuzz=1 ;;
    *) echo "install_deps: unknown argument '$arg' (only --fuzz)" >&2; exit 2 ;;
  esac
done
if [ "$fuzz" = 1 ]; then packages+=(clang-14 libclang-rt-14-dev); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
available=()
for p in "${missing[@]}"; do
  if [[ " ${optional[*]} " == *" $p "* ]] && ! apt-cache show "$p" >/dev/null 2>&1; then
    echo "install_deps: no package '$p' here; the tests that need it will be skipped"
  else
    available+=("$p")
  fi
done
missing=("${available[@]}")
[ ${#missing[@]} -gt 0 ] || exit 0
echo "install_deps: installing ${missing[*]}"
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
