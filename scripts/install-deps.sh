#!/usr/bin/env bash
# Installs Ondine's dependencies from Debian 12's packages (run as root, or it uses sudo).
# Does nothing when they are all installed already, so repeated runs are fast.
set -euo pipefail

packages=(
  build-essential cmake          # toolchain
  libdnnl-dev                    # oneDNN 2.6: the kernels Ondine lowers to
  ocl-icd-opencl-dev             # only a recommends of libdnnl-dev, but its CMake config requires OpenCL
  libprotobuf-dev protobuf-compiler libonnx-dev  # ONNX's generated protobuf classes
  catch2                         # unit tests (Catch2 2.13)
  libcli11-dev nlohmann-json3-dev  # the command-line tool and its JSON reports
  libkissfft-dev                 # KissFFT (BSD): compiled DFT/STFT (optional: without it they run the reference DFT)
  libflatbuffers-dev libxxhash-dev  # compiled-model artifacts: FlatBuffers schema and verifier, XXH3 checksums
  flatbuffers-compiler           # the test that the committed generated schema header is current
  libonnx-testdata               # the ONNX backend conformance cases
  python3-onnx python3-numpy     # scripts/make_models.py (example models, built locally)
  pybind11-dev python3-dev python3-pytest  # the Python module (python/) and its CTest test
  python3-distributed            # Dask: examples/python/dask_batch.py and its CTest test (python_dask)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
