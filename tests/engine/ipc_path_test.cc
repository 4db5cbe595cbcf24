// Tests of the ipc payload path (placeholder until written).
#include <gtest/gtest.h>

#include "engine/ipc_path.h"
