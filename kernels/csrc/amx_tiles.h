// AMX tiles, what every kernel that runs on them needs: the process's permission to use
// the tile state, and the layout of the configuration _tile_loadconfig reads. Defines
// TIDE_AMX_TILES where the build targets AMX (-march=native on Sapphire Rapids and later).
#pragma once

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#define TIDE_AMX_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace tide_amx {

// Linux hands a process the AMX tile state only on request (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); oneDNN asks too, asking twice is harmless.
inline bool tiles_granted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
}

// Palette 1: per tile, the bytes of a row and the number of rows.
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace tide_amx

#endif
