// doctest's implementation (DOCTEST_CONFIG_IMPLEMENT: seconds to compile), compiled once
// (the object library fa_doctest, tests/CMakeLists.txt) and linked into every test program.
// A program's main() is test_main.cpp's (fa_test_main, fa_test_main_gpu) or its own.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
