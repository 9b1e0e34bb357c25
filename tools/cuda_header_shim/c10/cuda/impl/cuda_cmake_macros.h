// The one header a CUDA build of torch generates that its CPU wheel lacks. The compile-only
// check (tools/cuda_compile_check.py) puts this directory last on the include path, so the
// real header wins wherever it exists. Content as generated for shared-library builds.
#pragma once
#define C10_CUDA_BUILD_SHARED_LIBS
