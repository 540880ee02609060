// mma.h - the SIMT emulator's stand-in for the CUDA toolkit header (see Simt.h).
#include "../Simt.h"
