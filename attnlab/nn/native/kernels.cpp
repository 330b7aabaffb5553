// The one translation unit the native library is compiled from. Parsing torch's headers takes
// most of a build (about 12 s of each source's 13 s on a 2-core EPYC), so the sources are
// included here and built together: one parse instead of one per source.
#include "weight_only.cpp"
#include "band.cpp"
