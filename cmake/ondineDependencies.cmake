# Finds Ondine's dependencies (Debian 12 packages; scripts/install-deps.sh installs them).
# Protobuf must come before ONNX: ONNX's targets link protobuf::libprotobuf.
find_package(Protobuf REQUIRED)
find_package(ONNX CONFIG REQUIRED)
find_package(dnnl CONFIG REQUIRED)
# oneDNN is built on OpenMP here; the runtime sets the thread count with omp_set_num_threads.
find_package(OpenMP REQUIRED COMPONENTS CXX)
# KissFFT (libkissfft-dev, BSD): optional. Found, the compiled DFT and STFT run on it (ONDINE_HAVE_KISSFFT,
# lower/detail/signal.hpp); without it they run their reference kernel (the double-precision DFT).
option(ONDINE_KISSFFT "Use KissFFT for compiled DFT/STFT when it is installed" ON)
if(ONDINE_KISSFFT)
  find_package(kissfft CONFIG QUIET COMPONENTS SHARED)  # Debian ships the shared library only
endif()
if(TARGET kissfft::kissfft-float)
  set(ONDINE_HAVE_KISSFFT ON)
else()
  set(ONDINE_HAVE_KISSFFT OFF)
endif()
message(STATUS "ondine: KissFFT for compiled DFT/STFT: ${ONDINE_HAVE_KISSFFT}")
