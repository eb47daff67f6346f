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

// All eight tiles at their full 16 rows x 64 bytes, the shape every kernel here starts from.
inline TileConfig full_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}

inline void configure_full_tiles() {
  const TileConfig cfg = full_tiles();
  _tile_loadconfig(&cfg);
}

}  // namespace tide_amx

#endif
