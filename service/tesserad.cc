// tesserad: the control plane as shipped, with the default seams.
#include "service/tesserad_program.h"

int main(int argc, char** argv) { return tessera::service::RunTesserad(argc, argv, {}); }
