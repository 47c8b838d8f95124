#include "driver.h"
#include "three_pass.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage03::info()); }
