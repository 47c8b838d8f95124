#include "driver.h"
#include "two_pass_online.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage04::info()); }
