// SPDX-License-Identifier: Apache-2.0
// ondine/config.hpp - how Ondine is built into a program: header-only, or over its prebuilt libraries.
//
// Header-only (the default; CMake target ondine::ondine): every function is defined in the headers.
// Over the libraries (ONDINE_SEPARATE_COMPILATION, which the CMake targets ondine::runtime and ondine::compiled
// give to whatever links them): the four largest tables are declared in the headers and defined once in a
// library, so that a file including ondine/ondine.hpp parses declarations instead of thousands of kernels:
//   core: shape inference (infer_table), the reference kernels (reference::kernel_table) and the built-in passes
//         (pass_registry), defined in ondine::runtime, whose src/runtime.cpp defines ONDINE_IMPLEMENT_CORE;
//   onnx: the ONNX import and export (load_model, save_model, ...), defined in ondine::compiled, whose
//         src/compiled.cpp defines ONDINE_IMPLEMENT_ONNX.
// A function is declared the same way in every file of a program, so all of them must agree: define
// ONDINE_SEPARATE_COMPILATION in every file or in none (the CMake targets do that).
#pragma once

#if defined(ONDINE_SEPARATE_COMPILATION)
#define ONDINE_CORE_FUNC
#define ONDINE_ONNX_FUNC
#if defined(ONDINE_IMPLEMENT_CORE)
#define ONDINE_CORE_DECLARATIONS_ONLY 0
#else
#define ONDINE_CORE_DECLARATIONS_ONLY 1
#endif
#if defined(ONDINE_IMPLEMENT_ONNX)
#define ONDINE_ONNX_DECLARATIONS_ONLY 0
#else
#define ONDINE_ONNX_DECLARATIONS_ONLY 1
#endif
#else
#define ONDINE_CORE_FUNC inline
#define ONDINE_ONNX_FUNC inline
#define ONDINE_CORE_DECLARATIONS_ONLY 0
#define ONDINE_ONNX_DECLARATIONS_ONLY 0
#endif
