#include "driver.h"
#include "tensor_core_fwd.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage08::info()); }
