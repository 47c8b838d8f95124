#include "driver.h"
#include "ring_attention.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage12::info()); }
