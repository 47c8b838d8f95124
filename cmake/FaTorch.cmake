# Finds the PyTorch that `python3` imports and defines the imported target fa::torch (its
# headers, libc10, libtorch_cpu and libtorch, plus libc10_cuda when the build has CUDA and
# torch was built with it). Sets FA_TORCH_FOUND, FA_TORCH_VERSION and FA_TORCH_CUDA.
#
# Why not find_package(Torch): its CUDA part configures nvcc for every architecture torch
# ships (it adds its own -gencode flags and looks for its own toolkit layout and cuDNN), which
# is not what the stages are compiled with. The op needs only torch's headers and four
# libraries, which torch itself reports (torch.utils.cpp_extension does the same).

set(FA_TORCH_FOUND OFF)
set(FA_TORCH_CUDA OFF)
find_package(Python3 COMPONENTS Interpreter QUIET)
if(NOT Python3_Interpreter_FOUND)
  return()
endif()
# The query imports torch (2 s, on every configure: scripts/test.sh configures on every call).
# Its answer is kept in the cache with the torch it came from (the interpreter, and the path
# and text of torch/version.py, found without importing torch) and asked again when they change.
execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import importlib.util, os; s = importlib.util.find_spec('torch'); print(os.path.join(os.path.dirname(s.origin), 'version.py') if s and s.origin else '')"
  OUTPUT_VARIABLE _fa_torch_version_py ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
set(_fa_torch_key "")
if(_fa_torch_version_py AND EXISTS "${_fa_torch_version_py}")
  file(READ "${_fa_torch_version_py}" _fa_torch_key)
  string(SHA256 _fa_torch_key "${Python3_EXECUTABLE} ${_fa_torch_version_py} ${_fa_torch_key}")
endif()
if(_fa_torch_key AND _fa_torch_key STREQUAL "${FA_TORCH_QUERY_KEY}")
  set(_fa_torch_lines "${FA_TORCH_QUERY}")
else()
  execute_process(
    COMMAND "${Python3_EXECUTABLE}" -c
      "import os, torch, torch.utils.cpp_extension as e; print(torch.__version__); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(','.join(e.include_paths())); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(int(torch.version.cuda is not None))"
    OUTPUT_VARIABLE _fa_torch_out ERROR_QUIET RESULT_VARIABLE _fa_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _fa_torch_rc EQUAL 0)
    unset(FA_TORCH_QUERY_KEY CACHE)
    message(STATUS "PyTorch op: not built (python3 cannot import torch)")
    return()
  endif()
  string(REPLACE "\n" ";" _fa_torch_lines "${_fa_torch_out}")
  set(FA_TORCH_QUERY_KEY "${_fa_torch_key}" CACHE INTERNAL "the torch FA_TORCH_QUERY came from")
  set(FA_TORCH_QUERY "${_fa_torch_lines}" CACHE INTERNAL "torch's version, library folder, include paths, ABI, CUDA")
endif()
list(GET _fa_torch_lines 0 FA_TORCH_VERSION)
list(GET _fa_torch_lines 1 _fa_torch_libdir)
list(GET _fa_torch_lines 2 _fa_torch_includes)
list(GET _fa_torch_lines 3 _fa_torch_abi)
list(GET _fa_torch_lines 4 _fa_torch_has_cuda)
string(REPLACE "," ";" _fa_torch_includes "${_fa_torch_includes}")

add_library(fa_torch_deps INTERFACE)
add_library(fa::torch ALIAS fa_torch_deps)
target_include_directories(fa_torch_deps SYSTEM INTERFACE ${_fa_torch_includes})
target_compile_definitions(fa_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${_fa_torch_abi})
set(_fa_torch_libs c10 torch_cpu torch)
if(FA_HAVE_CUDA AND _fa_torch_has_cuda)
  list(APPEND _fa_torch_libs c10_cuda)
  target_link_libraries(fa_torch_deps INTERFACE CUDA::cudart)
  target_compile_definitions(fa_torch_deps INTERFACE FA_TORCH_CUDA=1)
  set(FA_TORCH_CUDA ON)
endif()
foreach(lib IN LISTS _fa_torch_libs)
  set(path "${_fa_torch_libdir}/lib${lib}.so")
  if(NOT EXISTS "${path}")
    message(STATUS "PyTorch op: not built (${path} is missing)")
    return()
  endif()
  target_link_libraries(fa_torch_deps INTERFACE "${path}")
endforeach()
set(FA_TORCH_LIBDIR "${_fa_torch_libdir}")
set(FA_TORCH_FOUND ON)
message(STATUS "PyTorch op: torch ${FA_TORCH_VERSION} (CUDA kernels: ${FA_TORCH_CUDA})")
