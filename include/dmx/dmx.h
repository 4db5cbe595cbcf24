// dmx — device memory exchange. Include this one header for the whole public API.
#pragma once

#include "dmx/cluster.h"
#include "dmx/context.h"
#include "dmx/endpoint.h"
#include "dmx/log.h"
#include "dmx/memory.h"
#include "dmx/metrics.h"
#include "dmx/options.h"
#include "dmx/request.h"
#include "dmx/status.h"
#include "dmx/version.h"
