#include "driver.h"
#include "safe_softmax.h"

int main(int argc, char** argv) { return fa::run_stage_cli(argc, argv, fa::stage02::info()); }
