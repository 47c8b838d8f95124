// The main() of every stage test program. A GPU stage's tests (compiled with FA_GPU_TEST)
// run only their "cpu" test suite when no GPU is present, then exit with CTest's skip
// code 77, so CI skips them cleanly. doctest's implementation is doctest_impl.cpp's.
#include <doctest/doctest.h>

#include <cstdio>

#include "stage_list.h"

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
#ifdef FA_GPU_TEST
  if (!fa::gpu_available()) {
    // Without a GPU only the test suite "cpu" runs (index math that needs no device);
    // then the program reports itself skipped.
    ctx.addFilter("test-suite", "cpu");
    const int rc = ctx.run();
    std::printf("GPU tests skipped: no GPU on this machine\n");
    return rc != 0 ? rc : 77;
  }
#endif
  return ctx.run();
}
