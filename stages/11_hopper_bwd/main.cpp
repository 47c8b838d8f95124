#include "driver.h"
#include "hopper_bwd.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage11::info()); }
