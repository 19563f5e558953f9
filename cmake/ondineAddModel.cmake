# ondine_add_model(<name> MODEL <file.onnx> [TARGETS ISA ...] [DIMS NAME=SIZE ...] [THREADS N] [PASSES P] [EMBED])
#
# Compiles an ONNX model into an artifact at build time (`ondine compile MODEL -o <name>.ondine`, rebuilt when
# the model or the ondine tool changes) and generates <name>.hpp (`ondine header`): class <name> with one typed
# make_<input>(dims...) per input, struct Outputs, and run(); it includes only ondine/ir/typed_tensor.hpp, and
# its implementation <name>.cpp (over ondine/runtime.hpp: light too) is compiled into the static library target
# <name>, which carries the header's folder and links ondine::runtime, the prebuilt runtime (no ONNX or protobuf
# in the program). Without EMBED the class loads the
# artifact from where the build wrote it (the target property ONDINE_ARTIFACT names the file, to install it
# beside the program: install(FILES $<TARGET_PROPERTY:<name>,ONDINE_ARTIFACT> ...)); with EMBED the artifact is
# linked into the program through an assembly file (.incbin, 64-byte aligned; the project needs the ASM
# language enabled). DIMS bind symbolic dims for the packed weights (others: 1); THREADS is the thread count
# they are packed for; PASSES the pipeline (default: the default one). TARGETS: one variant per ISA (native,
# avx2, avx512_core, avx512_core_vnni, avx512_core_bf16, avx512_core_amx), the best the running CPU has chosen
# at load (default: native and avx2, so a program built here also runs on AVX2 machines).
function(ondine_add_model name)
  cmake_parse_arguments(ARG "EMBED" "MODEL;THREADS;PASSES" "DIMS;TARGETS" ${ARGN})
  if(NOT ARG_MODEL)
    message(FATAL_ERROR "ondine_add_model(${name}): MODEL <file.onnx> is required")
  endif()
  if(NOT TARGET ondine::cli)
    message(FATAL_ERROR "ondine_add_model(${name}): the ondine tool (ondine::cli) is not in this Ondine package")
  endif()
  get_filename_component(model "${ARG_MODEL}" ABSOLUTE)
  set(out "${CMAKE_CURRENT_BINARY_DIR}/ondine_models/${name}")
  set(artifact "${out}/${name}.ondine")
  set(header "${out}/${name}.hpp")
  set(compile_args)
  foreach(dim IN LISTS ARG_DIMS)
    list(APPEND compile_args --dim "${dim}")
  endforeach()
  if(ARG_THREADS)
    list(APPEND compile_args --threads "${ARG_THREADS}")
  endif()
  if(ARG_PASSES)
    list(APPEND compile_args --passes "${ARG_PASSES}")
  endif()
  if(ARG_TARGETS)
    list(JOIN ARG_TARGETS "," targets)
    list(APPEND compile_args --target "${targets}")
  endif()
  set(source "${out}/${name}.cpp")
  set(outputs "${artifact}" "${header}" "${source}")
  set(header_args)
  if(ARG_EMBED)
    list(APPEND outputs "${out}/${name}_data.S")
    set(header_args --embed)
  endif()
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND ${CMAKE_COMMAND} -E make_directory "${out}"
    COMMAND ondine::cli compile "${model}" -o "${artifact}" ${compile_args}
    COMMAND ondine::cli header "${artifact}" --name "${name}" -o "${header}" ${header_args}
    DEPENDS "${model}" ondine::cli
    COMMENT "ondine: compiling ${ARG_MODEL} into ${name}.ondine and ${name}.hpp"
    VERBATIM)
  # A static library: the generated NAME.cpp (Model over ondine::runtime) and, with EMBED, the artifact's
  # bytes. Its users include only the light NAME.hpp.
  if(ARG_EMBED)
    add_library(${name} STATIC "${source}" "${out}/${name}_data.S" "${header}")
    set_source_files_properties("${out}/${name}_data.S" PROPERTIES OBJECT_DEPENDS "${artifact}")
  else()
    add_library(${name} STATIC "${source}" "${header}")
  endif()
  target_include_directories(${name} PUBLIC "${out}")
  target_link_libraries(${name} PUBLIC ondine::runtime)
  set_target_properties(${name} PROPERTIES ONDINE_ARTIFACT "${artifact}")
endfunction()
