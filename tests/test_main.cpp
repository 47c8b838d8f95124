// The main() of every stage test program. A GPU stage's tests (compiled with FA_GPU_TEST)
// exit with CTest's skip code 77 when no GPU is present, so CI skips them cleanly.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "stage_list.h"

int main(int argc, char** argv) {
#ifdef FA_GPU_TEST
  if (!fa::gpu_available()) {
    std::printf("skipped: no GPU on this machine\n");
    return 77;
  }
#endif
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
