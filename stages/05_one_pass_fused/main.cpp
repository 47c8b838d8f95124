#include "driver.h"
#include "one_pass_fused.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage05::info()); }
