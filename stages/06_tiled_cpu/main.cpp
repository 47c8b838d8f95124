#include "driver.h"
#include "tiled_cpu.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage06::info()); }
