# Sourced by the README's commands: makes sure the Debian packages fpat builds with are there.
# As root it installs what is missing with apt-get; otherwise it lists what to install.
FPAT_PACKAGES="cmake g++ make antlr4 libantlr4-runtime-dev libboost-graph-dev libboost-test-dev \
nlohmann-json3-dev libcli11-dev graphviz clang libclang-rt-14-dev libopenblas0-pthread \
libonnx-dev libprotobuf-dev protobuf-compiler python3-onnx"

fpat_missing_packages() {
  missing=""
  for p in $FPAT_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing="$missing $p"
  done
  echo "$missing"
}

fpat_install_deps() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "fpat: not a Debian/Ubuntu system; install the equivalents of:" >&2
    echo "  $FPAT_PACKAGES" >&2
    return 0
  fi
  missing=$(fpat_missing_packages)
  [ -z "$missing" ] && return 0
  if [ "$(id -u)" = 0 ]; then
    echo "fpat: installing:$missing"
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
        >/dev/null || { echo "fpat: apt-get failed" >&2; return 1; }
  else
    echo "fpat: these Debian packages are missing; install them as root and run again:" >&2
    echo "  sudo apt-get install$missing" >&2
    return 1
  fi
  if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "fpat: note: no CUDA toolkit (nvcc) found; GPU code generation will be unavailable"
  fi
}

fpat_build() {
  build_dir=${FPAT_BUILD_DIR:-build}
  cmake -S "$FPAT_ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$build_dir" -j "$(nproc)"
}
