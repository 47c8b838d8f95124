#include "driver.h"
#include "smem_cuda.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage07::info()); }
