# Finds Ondine's dependencies (Debian 12 packages; scripts/install-deps.sh installs them).
# Protobuf must come before ONNX: ONNX's targets link protobuf::libprotobuf.
find_package(Protobuf REQUIRED)
find_package(ONNX CONFIG REQUIRED)
find_package(dnnl CONFIG REQUIRED)
# oneDNN is built on OpenMP here; the runtime sets the thread count with omp_set_num_threads.
find_package(OpenMP REQUIRED COMPONENTS CXX)
