#pragma once
/// \file
/// Library version. CMake reads the version from this header (single source of truth).

#define SPECDEC_VERSION_MAJOR 0  ///< major version
#define SPECDEC_VERSION_MINOR 1  ///< minor version
#define SPECDEC_VERSION_PATCH 0  ///< patch version

/// Version as one integer: major * 10000 + minor * 100 + patch.
#define SPECDEC_VERSION (SPECDEC_VERSION_MAJOR * 10000 + SPECDEC_VERSION_MINOR * 100 + SPECDEC_VERSION_PATCH)
