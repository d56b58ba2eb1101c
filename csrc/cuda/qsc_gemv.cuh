/* Decode GEMV (one activation column): the per-lane math shared by the device kernel k_gemv (qsc_fast.cuh) and its
 * host emulation (qsc_fast_host.cuh).
 *
 * k_matmul<1> maps one warp to one output row and lets lane l take the row's units l, l + 32, l + 64, ... (a unit =
 * a piece of a block, Unit<TYPE> in the type's room in qsc_types.cuh), loading a unit and dotting it before the next
 * load: each lane has one weight load (8-16 bytes) in flight, so a warp waits one DRAM round trip per 32 units. An
 * 8B Q4_K row of 4096 is 128 units, four round trips; k_matmul<1> (56 registers, 36 resident warps per SM) keeps about 18 KB in
 * flight per SM, where an H100 needs roughly bandwidth x latency / SMs = 3.35 TB/s x ~0.7 us / 132 = 18 KB to
 * stream at full speed, so it is on the edge at best and below it for the 8-byte loads of Q4_0 / Q5_0 / Q6_K.
 * Here a lane issues the loads of GEMV_BATCH = 4 units before the first dot (80 registers, no spills, 24 resident
 * warps: 48 KB of 16-byte loads in flight per SM), and an 8B row needs one round trip instead of four. Expected
 * from that arithmetic, not yet measured. The units, their order of accumulation and the
 * butterfly reduction are k_matmul<1>'s, so the result is the same float for float (tests/test_cuda_gemv.py checks
 * GEMV_BATCH 4 against 1 on the host). */
#pragma once

#include "qsc_common.cuh"
#include "qsc_mma.cuh" /* MmaArgs: the segments of a launch of up to three matrices */

constexpr int GEMV_BATCH = 4, GEMV_WARPS = 4;

/* k_gemv's grid on the host (qsc_fast_host.cuh): GEMV_WARPS rows per block, each row's 32 lanes with their
 * GEMV_BATCH loads, the butterfly sum, the bias; args as given to launch_gemv (ncols 1, blk0 laid out here). */
void emu_gemv(MmaArgs args);

/* Lane `lane`'s partial sum of row `row` x activation column 0 of a, BATCH units' loads at a time. */
template <int TYPE, int BATCH> HD float gemv_lane(const QW &w, int64_t row, const Act &a, int lane) {
    using U = Unit<TYPE>;
    const int nu = w.nb * U::NU;
    float acc = 0.0f;
    for (int t0 = lane; t0 < nu; t0 += 32 * BATCH) {
        U u[BATCH];
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int t = t0 + 32 * i;
            if (t < nu) u[i].load(w, row * w.nb + t / U::NU, t % U::NU);
        }
#pragma unroll
        for (int i = 0; i < BATCH; ++i) {
            const int t = t0 + 32 * i;
            if (t < nu) acc += u[i].dot(a, 0, t / U::NU);
        }
    }
    return acc;
}

/* The types k_gemv decodes (GEMV 1 in qsc_types.cuh's list; others keep k_matmul). */
static inline bool gemv_type_ok(int type) { return type_desc(type).gemv; }

/* A lane's partial for any type of gemv_type_ok (0 for others); the switch is warp-uniform. */
template <int BATCH> HD float gemv_lane_any(const QW &w, int64_t row, const Act &a, int lane) {
    switch (w.type) {
#define QSC_GEMV_CASE(T) case T: return gemv_lane<T, BATCH>(w, row, a, lane);
        QSC_FOR_GEMV_TYPES(QSC_GEMV_CASE)
#undef QSC_GEMV_CASE
    default: return 0.0f;
    }
}
