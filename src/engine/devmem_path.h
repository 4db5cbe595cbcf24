// The devmem payload path (placeholder until written): see payload_path.h.
#pragma once

#include "engine/payload_path.h"
