#include "driver.h"
#include "naive.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage01::info()); }
