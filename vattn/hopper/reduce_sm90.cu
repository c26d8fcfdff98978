// vattn's reduce for the Hopper path's bf16 partials (vattn/hopper/reduce.py builds and launches it). A warp merges
// a SLICE-wide slice of one output row (sequence b, query token j, query head hq): its lanes form groups of SLICE / 8
// lanes, each lane 8 values (one 16-byte load a partial), the groups take different pieces, so UNROLL loads a lane
// keep 32 / (SLICE / 8) x UNROLL pieces in flight; the groups merge through shuffles at the end. WARPS warps a CTA:
// a 16x35k call's 1024 rows of 256 are 2048 warps (SLICE 128) in 256 CTAs, where vattn's Triton reduce runs 4096
// one-warp programs that load 16 pieces of a quarter row.
// Its indices (the plan's seq_part_start, cu_seqlens_q) are read before griddepcontrol.wait: the plan ended before
// the main kernel started; with AFTER_WAIT seq_part_start is read after it (a main kernel that plans itself writes it).
#include <cuda_bf16.h>
#include <stdint.h>

#ifndef HEAD_DIM
#define HEAD_DIM 256
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef UNROLL
#define UNROLL 8
#endif
#ifndef SLICE
#define SLICE 64
#endif
#ifndef TRIGGER  // 1: let the next kernel launch (a programmatic dependent: the next call's plan) at the start
#define TRIGGER 0
#endif
#ifndef AFTER_WAIT  // 1: seq_part_start read after the wait (the main kernel wrote it: IN_KERNEL_PLAN)
#define AFTER_WAIT 0
#endif

constexpr int SLICES = HEAD_DIM / SLICE;  // warps a row
constexpr int GROUP = SLICE / 8;           // lanes a piece's slice
constexpr int GROUPS = 32 / GROUP;         // pieces a load instruction
static_assert(HEAD_DIM % SLICE == 0 && GROUP <= 32 && 32 % GROUP == 0, "SLICE: 64, 128 or 256, at most HEAD_DIM");

__device__ __forceinline__ void wait_for_main() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    vattn_reduce_sm90(const __nv_bfloat16* o_part, int64_t sow, int64_t soh, int64_t sor, const float* lse_part,
                      int64_t slw, int64_t slh, const int* seq_part_start, const int* cu_q, __nv_bfloat16* out,
                      int64_t sot, int64_t soh_out, int num_q_heads, int gqa, int pdl) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int task = blockIdx.x * WARPS + warp, hq = task / SLICES;
  const int group = lane / GROUP, chunk = (task % SLICES) * GROUP + lane % GROUP;
  const int j = blockIdx.y, b = blockIdx.z;
  const int q0 = cu_q[b], n_q = cu_q[b + 1] - q0;
  if (TRIGGER) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#if AFTER_WAIT
  if (pdl && ((hq < num_q_heads && j < n_q) || (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0))
    wait_for_main();
  const int p_first = seq_part_start[b], p_last = seq_part_start[b + 1];
  const bool merge = hq < num_q_heads && j < n_q && p_last - p_first != 1;
#else
  const int p_first = seq_part_start[b], p_last = seq_part_start[b + 1];
  // one-piece sequences: the main kernel wrote their rows (skip_whole); a sequence of none (no KV) gets zeros
  const bool merge = hq < num_q_heads && j < n_q && p_last - p_first != 1;
  if (pdl && (merge || (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0))
    wait_for_main();  // the first thread always waits, so that the grid cannot end before the main kernel
#endif
  if (!merge) return;  // a whole warp: merge does not depend on the lane
  const int h = hq / gqa, row = j * gqa + hq % gqa;
  const __nv_bfloat16* obase = o_part + h * soh + row * sor + chunk * 8;
  const float* lbase = lse_part + h * slh + row;
  float acc[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = 0.f;
  float m = -INFINITY, l = 0.f;
  for (int c = p_first + group; c < p_last; c += GROUPS * UNROLL) {
    float lse[UNROLL];
    uint4 o[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const int p = c + i * GROUPS;
      if (p < p_last) {
        lse[i] = lbase[p * slw];
        o[i] = *reinterpret_cast<const uint4*>(obase + p * sow);
      } else {
        lse[i] = -INFINITY;
        o[i] = make_uint4(0, 0, 0, 0);
      }
    }
    float mx = m;
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) mx = fmaxf(mx, lse[i]);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float alpha = exp2f(m - base);  // 0 while m is -inf
    l *= alpha;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] *= alpha;
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const float w = exp2f(lse[i] - base);
      if (w > 0.f) {  // a neutral partial (lse -inf) weighs nothing, whatever its O holds
        const __nv_bfloat162* v = reinterpret_cast<const __nv_bfloat162*>(&o[i]);
        l += w;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = __bfloat1622float2(v[k]);
          acc[2 * k] = fmaf(w, f.x, acc[2 * k]);
          acc[2 * k + 1] = fmaf(w, f.y, acc[2 * k + 1]);
        }
      }
    }
    m = mx;
  }
  // the groups' merges into one: the lanes of a chunk across groups are GROUP apart
#pragma unroll
  for (int off = GROUP; off < 32; off *= 2) {
    const float m_other = __shfl_xor_sync(0xffffffffu, m, off);
    const float mx = fmaxf(m, m_other);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float mine = exp2f(m - base), theirs = exp2f(m_other - base);
    l = l * mine + __shfl_xor_sync(0xffffffffu, l, off) * theirs;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = acc[k] * mine + __shfl_xor_sync(0xffffffffu, acc[k], off) * theirs;
    m = mx;
  }
  if (group != 0) return;
  const float inv = l > 0.f ? 1.f / l : 0.f;
  uint4 res;
  __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
  for (int k = 0; k < 4; ++k) r[k] = __floats2bfloat162_rn(acc[2 * k] * inv, acc[2 * k + 1] * inv);
  *reinterpret_cast<uint4*>(out + (q0 + j) * sot + hq * soh_out + chunk * 8) = res;
}
