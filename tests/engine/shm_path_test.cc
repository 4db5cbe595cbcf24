// Tests of the shm payload path (placeholder until written).
#include <gtest/gtest.h>

#include "engine/shm_path.h"
