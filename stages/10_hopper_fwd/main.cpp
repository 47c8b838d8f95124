#include "driver.h"
#include "hopper_fwd.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage10::info()); }
