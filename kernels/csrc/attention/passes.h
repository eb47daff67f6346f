// Attention on bf16 pairs, part 4: which pass runs here. AMX tiles where the CPU has them
// and Linux granted the tile state, else AVX-512 BF16 dot products where the build has
// them; neither: the ops that use a pass refuse (the engine then takes SDPA).
#pragma once

#include <atomic>

#include "attention/pass_amx.h"
#include "attention/pass_avx512_bf16.h"

namespace tide_attn {

// Set by tide::attention_pass_prefer_vector (tests and benchmarks): run the AVX-512 BF16
// pass even where tiles are available.
inline std::atomic<bool>& prefer_vector() {
  static std::atomic<bool> flag{false};
  return flag;
}

inline bool use_tiles() { return tiles_supported() && !prefer_vector().load(); }

inline const char* pass_isa() {
  if (use_tiles()) return "amx";
#if defined(TIDE_BF16_PAIRS)
  return "avx512_bf16";
#else
  return "";
#endif
}

#if defined(TIDE_BF16_PAIRS)
// Calls f with the pass for this CPU and head_dim D (a multiple of 32).
template <class F>
void with_pass(int64_t D, F&& f) {
#if defined(TIDE_AMX)
  if (use_tiles()) {
    switch (D) {
      case 32: f(AmxPass<2>{}); return;
      case 64: f(AmxPass<4>{}); return;
      default: f(AmxPass<0>{}); return;
    }
  }
#endif
  (void)D;
  f(Avx512Bf16Pass{});
}
#endif

}  // namespace tide_attn
