// tessera-worker: the worker as shipped, with the default seams.
#include "worker/worker_program.h"

int main(int argc, char** argv) { return tessera::worker::RunWorker(argc, argv, {}); }
