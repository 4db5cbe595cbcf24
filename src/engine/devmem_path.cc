#include "engine/devmem_path.h"
