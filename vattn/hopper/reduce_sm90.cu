// vattn's reduce for the Hopper path's bf16 partials (vattn/hopper/reduce.py builds and launches it). A warp merges
// a SLICE-wide slice of one output row (sequence b, query token j, query head hq): its lanes form groups of SLICE / 8
// lanes, each lane 8 values (one 16-byte load a partial), the groups take different pieces, so UNROLL loads a lane
// keep 32 / (SLICE / 8) x UNROLL pieces in flight; the groups merge through shuffles at the end. WARPS warps a CTA:
// a 16x35k call's 1024 rows of 256 are 2048 warps (SLICE 128) in 256 CTAs, where vattn's Triton reduce runs 4096
// one-warp programs that load 16 pieces of a quarter row.
// A sequence of more than long_from pieces (the one long request among short ones, whose pieces fill most of the
// SMs) is merged instead by the CTAs launched before the batch's (grid z < gridDim.z - batch: dispatched first, so
// that their scan of the batch overlaps the rest), each taking one row slice at a time with all its warps: a row's
// own warp walks its lanes' share of ~120 pieces one after the other (long among short lost 5 us to it against
// its uniform twin, benchmarks/NOTES.md P107).
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

#ifndef LONG_UNROLL  // loads in flight a lane on the long sequences' path, where a lane merges few pieces
#define LONG_UNROLL 4
#endif

constexpr int SLICES = HEAD_DIM / SLICE;  // warps a row
constexpr int GROUP = SLICE / 8;           // lanes a piece's slice
constexpr int GROUPS = 32 / GROUP;         // pieces a load instruction
static_assert(HEAD_DIM % SLICE == 0 && GROUP <= 32 && 32 % GROUP == 0, "SLICE: 64, 128 or 256, at most HEAD_DIM");

__device__ __forceinline__ void wait_for_main() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// One lane's running merge (acc: 8 values relative to m, l: their weight) of pieces p_begin, p_begin + step, ...
// before p_end, U loads in flight.
template <int U>
__device__ __forceinline__ void merge_pieces(const __nv_bfloat16* obase, const float* lbase, int64_t sow, int64_t slw,
                                             int p_begin, int p_end, int step, float (&acc)[8], float& m, float& l) {
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = 0.f;
  m = -INFINITY, l = 0.f;
  for (int c = p_begin; c < p_end; c += step * U) {
    float lse[U];
    uint4 o[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {
      const int p = c + i * step;
      if (p < p_end) {
        lse[i] = lbase[p * slw];
        o[i] = *reinterpret_cast<const uint4*>(obase + p * sow);
      } else {
        lse[i] = -INFINITY;
        o[i] = make_uint4(0, 0, 0, 0);
      }
    }
    float mx = m;
#pragma unroll
    for (int i = 0; i < U; ++i) mx = fmaxf(mx, lse[i]);
    const float base = mx == -INFINITY ? 0.f : mx;
    const float alpha = exp2f(m - base);  // 0 while m is -inf
    l *= alpha;
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] *= alpha;
#pragma unroll
    for (int i = 0; i < U; ++i) {
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
}

// Another merge (acc_b, m_b, l_b) folded into (acc, m, l); both relative to their own max.
__device__ __forceinline__ void fold(float (&acc)[8], float& m, float& l, const float* acc_b, float m_b, float l_b) {
  const float mx = fmaxf(m, m_b);
  const float base = mx == -INFINITY ? 0.f : mx;
  const float mine = exp2f(m - base), theirs = exp2f(m_b - base);
  l = l * mine + l_b * theirs;
#pragma unroll
  for (int k = 0; k < 8; ++k) acc[k] = acc[k] * mine + acc_b[k] * theirs;
  m = mx;
}

// The warp's lane groups' merges into one (the lanes of a chunk across groups are GROUP apart), in every group.
__device__ __forceinline__ void merge_groups(float (&acc)[8], float& m, float& l) {
#pragma unroll
  for (int off = GROUP; off < 32; off *= 2) {
    float other[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) other[k] = __shfl_xor_sync(0xffffffffu, acc[k], off);
    const float m_other = __shfl_xor_sync(0xffffffffu, m, off), l_other = __shfl_xor_sync(0xffffffffu, l, off);
    fold(acc, m, l, other, m_other, l_other);
  }
}

__device__ __forceinline__ void store_row(__nv_bfloat16* dst, const float (&acc)[8], float l) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  uint4 res;
  __nv_bfloat162* r = reinterpret_cast<__nv_bfloat162*>(&res);
#pragma unroll
  for (int k = 0; k < 4; ++k) r[k] = __floats2bfloat162_rn(acc[2 * k] * inv, acc[2 * k + 1] * inv);
  *reinterpret_cast<uint4*>(dst) = res;
}

// The long sequences' CTAs (the first gridDim.z - batch z-slabs): the row slices of the sequences of more than
// long_from pieces, numbered sequence by sequence (n_q x num_q_heads x SLICES each), CTA c taking slices c, c + C,
// ...; in each, warp w merges pieces w, w + WARPS, ... (its lane groups every GROUPS-th of those), and warp 0 folds
// the warps' merges from shared memory.
// Every warp scans the batch itself, 32 sequences a step (a lane one), so that no barrier waits on the scan.
// Not inlined: inlined, its registers took the kernel past 64 a thread (3 CTAs an SM instead of 4) or, held to 64,
// made it spill.
__device__ __noinline__ void merge_long_sequences(const __nv_bfloat16* o_part, int64_t sow, int64_t soh,
                                                  int64_t sor, const float* lse_part, int64_t slw, int64_t slh,
                                                  const int* seq_part_start, const int* cu_q, __nv_bfloat16* out,
                                                  int64_t sot, int64_t soh_out, int num_q_heads, int gqa, int pdl,
                                                  int batch, int long_from) {
  __shared__ float folded[WARPS][GROUP][10];  // a warp's merge: acc[8], m, l of each chunk
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = lane / GROUP;
  const int ctas = (gridDim.z - batch) * gridDim.y * gridDim.x;
  int next = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;  // this CTA's next slice
  const int per_seq_token = num_q_heads * SLICES;
  bool waited = false;
#if AFTER_WAIT  // seq_part_start is the main kernel's
  if (pdl) wait_for_main(), waited = true;
#endif
  for (int first = 0, seen = 0; first < batch; first += 32) {
    const int b = first + lane;
    int p0 = 0, n = 0, q0 = 0, n_q = 0;
    if (b < batch) {
      p0 = seq_part_start[b], n = seq_part_start[b + 1] - p0;
      q0 = cu_q[b], n_q = cu_q[b + 1] - q0;
    }
    const int mine = n > long_from ? n_q * per_seq_token : 0;  // this lane's sequence's slices
    int upto = mine;  // inclusive prefix over the lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, upto, o);
      if (lane >= o) upto += u;
    }
    const int total = __shfl_sync(0xffffffffu, upto, 31);
    while (next < seen + total) {  // a slice of this step's sequences: the lane whose range holds it
      const int owner = __ffs(__ballot_sync(0xffffffffu, next - seen < upto && next - seen >= upto - mine)) - 1;
      const int s = next - seen - (__shfl_sync(0xffffffffu, upto, owner) - __shfl_sync(0xffffffffu, mine, owner));
      const int sp0 = __shfl_sync(0xffffffffu, p0, owner), sn = __shfl_sync(0xffffffffu, n, owner);
      const int sq0 = __shfl_sync(0xffffffffu, q0, owner);
      const int j = s / per_seq_token, hq = s % per_seq_token / SLICES;
      const int chunk = (s % SLICES) * GROUP + lane % GROUP;
      const int h = hq / gqa, row = j * gqa + hq % gqa;
      if (pdl && !waited) {
        wait_for_main();
        waited = true;
      }
      float acc[8], m, l;
      merge_pieces<LONG_UNROLL>(o_part + h * soh + row * sor + chunk * 8, lse_part + h * slh + row, sow, slw,
                                sp0 + warp * GROUPS + group, sp0 + sn, WARPS * GROUPS, acc, m, l);
      merge_groups(acc, m, l);
      if (group == 0) {
        float* f = folded[warp][lane];
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = acc[k];
        f[8] = m, f[9] = l;
      }
      __syncthreads();
      if (warp == 0 && group == 0) {
#pragma unroll 1
        for (int w = 1; w < WARPS; ++w) fold(acc, m, l, folded[w][lane], folded[w][lane][8], folded[w][lane][9]);
        store_row(out + (sq0 + j) * sot + hq * soh_out + chunk * 8, acc, l);
      }
      __syncthreads();  // folded is free again
      next += ctas;
    }
    seen += total;
  }
}

// at most 64 registers a thread: 4 CTAs of 8 warps an SM
extern "C" __global__ void __launch_bounds__(WARPS * 32, 2048 / (WARPS * 32) / 2)
    vattn_reduce_sm90(const __nv_bfloat16* o_part, int64_t sow, int64_t soh, int64_t sor, const float* lse_part,
                      int64_t slw, int64_t slh, const int* seq_part_start, const int* cu_q, __nv_bfloat16* out,
                      int64_t sot, int64_t soh_out, int num_q_heads, int gqa, int pdl, int batch, int long_from) {
  if (TRIGGER) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int long_z = gridDim.z - batch;
  if ((int)blockIdx.z < long_z) {
    merge_long_sequences(o_part, sow, soh, sor, lse_part, slw, slh, seq_part_start, cu_q, out, sot, soh_out,
                         num_q_heads, gqa, pdl, batch, long_from);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int task = blockIdx.x * WARPS + warp, hq = task / SLICES;
  const int group = lane / GROUP, chunk = (task % SLICES) * GROUP + lane % GROUP;
  const int j = blockIdx.y, b = blockIdx.z - long_z;
  const int q0 = cu_q[b], n_q = cu_q[b + 1] - q0;
  const bool first = (blockIdx.x | blockIdx.y | b | threadIdx.x) == 0;
#if AFTER_WAIT
  if (pdl && ((hq < num_q_heads && j < n_q) || first)) wait_for_main();
#endif
  const int p_first = seq_part_start[b], p_last = seq_part_start[b + 1];
  // one-piece sequences: the main kernel wrote their rows (skip_whole); a sequence of none (no KV) gets zeros;
  // a long one is the long sequences' CTAs'
  const int n = p_last - p_first;
  const bool merge = hq < num_q_heads && j < n_q && n != 1 && n <= long_from;
#if !AFTER_WAIT
  if (pdl && (merge || first))
    wait_for_main();  // the first thread always waits, so that the grid cannot end before the main kernel
#endif
  if (!merge) return;  // a whole warp: merge does not depend on the lane
  const int h = hq / gqa, row = j * gqa + hq % gqa;
  float acc[8], m, l;
  merge_pieces<UNROLL>(o_part + h * soh + row * sor + chunk * 8, lse_part + h * slh + row, sow, slw, p_first + group,
                       p_last, GROUPS, acc, m, l);
  merge_groups(acc, m, l);
  if (group == 0) store_row(out + (q0 + j) * sot + hq * soh_out + chunk * 8, acc, l);
}
