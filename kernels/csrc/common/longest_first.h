// Tasks of uneven cost on the thread pool, longest first, each thread taking the next one
// when it finishes its last.
//
// at::parallel_for hands each thread one contiguous range of equal length. A decode step's
// rows are anything but equal: a few long-context requests beside many short ones, and the
// step builder sorts them by context length, so an equal split gives one thread the long
// rows while the other waits (48 rows of 80 keys then 16 of 1,200 took 1.42x the same rows
// shuffled that way; this way 1.00x: python scripts/bench_cpu_attention.py, last line).
// Longest first with a shared counter ends within about one task of even.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <numeric>
#include <vector>

namespace tide_sched {

// Runs body(task, state) for every task in [0, n), in order of decreasing cost(task) (ties
// in task order); each thread makes one state with make_state() (its scratch buffers) and
// keeps it for all the tasks it runs.
template <class Cost, class MakeState, class Body>
void longest_first(int64_t n, Cost&& cost, MakeState&& make_state, Body&& body) {
  if (n <= 0) return;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::vector<int64_t> costs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) costs[i] = cost(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    auto state = make_state();
    for (int64_t k = next.fetch_add(1, std::memory_order_relaxed); k < n;
         k = next.fetch_add(1, std::memory_order_relaxed))
      body(order[k], state);
  });
}

}  // namespace tide_sched
