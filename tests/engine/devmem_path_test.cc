// Tests of the devmem payload path (placeholder until written).
#include <gtest/gtest.h>

#include "engine/devmem_path.h"
