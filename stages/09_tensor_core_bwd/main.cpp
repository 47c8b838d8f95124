#include "driver.h"
#include "tensor_core_bwd.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage09::info()); }
