// SPDX-License-Identifier: Apache-2.0
// ondine/model_impl.hpp - Model (ondine/model.hpp) header-only: include this in exactly one source file of the
// program, and ondine/model.hpp everywhere else; or link ondine::compiled / ondine::runtime, which compiled it.
#pragma once

#include "ondine/impl/model_compile.hpp"
#include "ondine/impl/model_runtime.hpp"
