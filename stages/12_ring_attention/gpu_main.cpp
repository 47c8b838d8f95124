#include "driver.h"
#include "ring_gpu.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage12::gpu_info()); }
