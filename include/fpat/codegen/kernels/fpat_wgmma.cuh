// Kernel family "gemm", Hopper backend (sm_90a): C[M,N] = epilogue(A[M,K] * B) with TMA loads,
// wgmma tensor-core MMAs, warp specialization and a persistent grid.
//
//   B is [K, N] row-major, or [N, K] when TRANS_B (nn.Linear's weight layout).
//
// Structure (the published fast Hopper GEMMs, HOPPER-GEMM.md in the project's notes):
//   * One producer warpgroup, of which one thread issues TMA copies of A and B tiles into a
//     STAGES-deep ring of shared-memory stages (128-byte swizzle), and consumer warpgroups that
//     issue wgmma.m64nBNk16 with the accumulators in registers. setmaxnreg moves registers from
//     the producer to the consumers. Two schedules (CUTLASS's names):
//     - cooperative: each of BM / 64 consumers owns 64 rows of every tile (BM = 256: two
//       consumers of 128 rows, two m64 MMAs per k step: each reads a 128-row A half and the
//       shared 128-column B, 20% fewer shared-memory bytes per MMA than 128x256);
//     - ping-pong: two consumers own alternate tiles, all BM rows of each (BM / 64 MMAs per k
//       step). The ring hands out whole tiles in order, so one consumer's MMAs run while the
//       other applies its epilogue: the epilogue's arithmetic costs no tensor-core time.
//   * Each stage has a "full" mbarrier (the producer's expected byte count; TMA completes it)
//     and an "empty" one (one arrival per consumer warp when its MMAs no longer read the stage).
//     Phase bits flip each time the ring wraps.
//   * The grid is persistent: at most one CTA per SM, walking tiles in a grouped order, so the
//     producer loads the next tile while the consumers run the epilogue of the current one.
//   * CLUSTER = 2: two CTAs on neighbouring SMs take the two M-tiles of one B tile; each loads
//     half of B and multicasts it to both, so B comes from L2 once per pair. A stage is then
//     free only when the consumers of both CTAs have released it: they arrive on the "empty"
//     barriers of both.
//   * Ragged M, N, K: TMA zero-fills out-of-range elements of a box (they add nothing to the dot
//     products) and the epilogue's stores are predicated.
//   * The epilogue functor runs on the accumulators in registers, all of a thread's first, then
//     the stores. Cooperative kernels with room for it (Epilogue::kTile) write the results into
//     a BM x BN shared-memory tile that TMA stores (clipping edge tiles), and an [M, N] operand
//     such as a residual arrives in that tile by TMA, loaded by the producer during the main
//     loop; an epilogue that ends by adding it (Epilogue::kAddStaged) rounds the rest first and
//     adds the operand in element pairs, as the unfused add of two stored tensors does.
//     Activation epilogues (Epilogue::kDefer) are applied there by the producer
//     warpgroup's three idle warps while the consumers run the next tile; their [M, N] operand
//     comes to those warps by TMA, a BM x 64 box at a time, into a side buffer behind the
//     tile. Otherwise interior tiles store through a small shared-memory slab per warp, so
//     that each store instruction writes whole 128-byte row segments (a thread's own f16 pairs
//     would write 16 bytes of each of 8 rows); edge tiles store checked pairs from registers.
// Requirements, checked by the host before choosing this backend: A and B 16-byte aligned, K a
// multiple of 8 (and N too unless TRANS_B): TMA's global strides are multiples of 16 bytes.
#pragma once

#include "fpat_common.cuh"

namespace fpat {

/// A wgmma configuration: a BM x BN tile (64-deep k-tiles), cooperative or ping-pong, alone or
/// in clusters of two CTAs sharing B, tiles walked in groups along M or along N.
///
/// A_ROWS < BM (64-row cooperative tiles only, for problems of at most A_ROWS rows: decode):
/// each stage holds an A box of only A_ROWS rows, so that more stages of B fit in shared memory
/// (their loads are bound by latency there). The m64 MMAs still read 64 rows of A: rows A_ROWS
/// and on come from the same stage's B, which the same TMA transaction brought (so nothing is
/// read before it lands), and give accumulator rows below the problem, which no path stores.
template <int BM_, int BN_, int STAGES_, bool PINGPONG_, int CLUSTER_ = 1, bool RASTER_N_ = false,
          int A_ROWS_ = BM_>
struct WgmmaTile {
  static constexpr int BM = BM_, BN = BN_, BK = 64, STAGES = STAGES_, CLUSTER = CLUSTER_;
  static constexpr bool PINGPONG = PINGPONG_, RASTER_N = RASTER_N_;
  static constexpr int CONSUMERS = PINGPONG || BM == 256 ? 2 : BM / 64;
  static constexpr int MI = BM / 64 / (PINGPONG ? 1 : CONSUMERS); // m64 MMAs per consumer, k step
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int A_ROWS = A_ROWS_;
  static constexpr int A_BYTES = A_ROWS * BK * 2, B_BYTES = BN * BK * 2;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static_assert(A_ROWS == BM || (BM == 64 && !PINGPONG && CLUSTER == 1 && A_ROWS % 8 == 0 &&
                                 A_ROWS > 0 && A_ROWS < BM),
                "a short A box: whole 1 KB swizzle atoms, 64-row cooperative tiles alone");
  static_assert(BM * BK * 2 <= STAGE_BYTES, "an MMA's 64 rows of A stay inside their stage");
  static_assert(BN == 64 || BN == 128 || BN == 192 || BN == 256,
                "wgmma tiles are 64, 128, 192 or 256 wide");
  static_assert(BM == 64 || BM == 128 || (BM == 256 && !PINGPONG && CLUSTER == 1),
                "64 or 128 rows, or 256 rows of a cooperative tile without clusters");
  static_assert(MI * BN <= 256, "at most 128 accumulators per thread");
  static_assert(CLUSTER == 1 || (CLUSTER == 2 && BN % 128 == 0),
                "clusters of 2 split B in halves of 64-column boxes");
};

/// Dynamic shared memory of a configuration: the stages, the BM x BN epilogue tile where the
/// epilogue goes through one (TILE), one BM x 64 box of a deferred epilogue's [M, N] operand
/// (SIDE), plus 1 KB to align them to the 1024-byte swizzle atom. Mirrors
/// codegen::gemmSmemBytes, codegen::wgmmaEpilogueTile and codegen::wgmmaSideBox.
template <class T, bool TILE = false, bool SIDE = false> constexpr int wgmmaSmemBytes() {
  return T::STAGES * T::STAGE_BYTES + (TILE ? T::BM * T::BN * 2 : 0) + (SIDE ? T::BM * 128 : 0) +
         1024;
}

namespace sm90 {

__device__ __forceinline__ unsigned smemAddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarInit(uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smemAddr(bar)), "r"(count));
}

__device__ __forceinline__ void mbarExpectTx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smemAddr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smemAddr(bar)) : "memory");
}

/// Spins until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void mbarWait(uint64_t* bar, unsigned parity) {
  const unsigned a = smemAddr(bar);
  unsigned done = 0;
  do {
    asm volatile("{\n.reg .pred p;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(a), "r"(parity)
                 : "memory");
  } while (!done);
}

__device__ __forceinline__ unsigned clusterRank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

/// Every thread of every CTA of the cluster meets here; shared-memory writes before it are
/// visible to the cluster after it.
__device__ __forceinline__ void clusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

/// Arrives on the mbarrier at `bar`'s offset in the shared memory of cluster CTA `cta`.
__device__ __forceinline__ void mbarArriveCluster(uint64_t* bar, unsigned cta) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(smemAddr(bar)), "r"(cta));
  // Release at CTA scope, as CUTLASS's ClusterBarrier: what it orders are this CTA's reads of
  // the stage, complete already (cluster scope measured much slower).
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

/// One TMA box of a 2-D tensor map into shared memory; completes bytes on `bar`.
__device__ __forceinline__ void tmaLoad2d(void* dst, const void* map, int c0, int c1,
                                          uint64_t* bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smemAddr(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smemAddr(bar))
               : "memory");
}

/// The same box into the shared memory of every CTA in `mask`, at the same offset, completing
/// bytes on each one's barrier at `bar`'s offset.
__device__ __forceinline__ void tmaLoad2dMulticast(void* dst, const void* map, int c0, int c1,
                                                   uint64_t* bar, unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smemAddr(dst)),
               "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smemAddr(bar)), "h"(mask)
               : "memory");
}

/// One TMA box from shared memory to a 2-D tensor (clipped at the tensor's bounds), in the
/// calling thread's bulk async-group.
__device__ __forceinline__ void tmaStore2d(const void* map, const void* src, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smemAddr(src)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ __forceinline__ void bulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/// Waits until this thread's bulk stores have read their shared memory (not until they land).
__device__ __forceinline__ void bulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
/// Waits until this thread's bulk stores are complete.
__device__ __forceinline__ void bulkWait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
/// stmatrix / ldmatrix .x4: four 8 x 8 matrices of 16-bit pairs. Lane 8i + q gives the address
/// of row q of matrix i; a lane's register i holds row lane / 4, columns 2 (lane % 4) and + 1 of
/// matrix i: the layout of wgmma's accumulator pairs, so one instruction moves four pairs.
/// Volatile, so it stays ordered with the barriers and fences around it, but without a memory
/// clobber: the epilogue's operand loads from global memory may still move above it.
__device__ __forceinline__ void stsm4(unsigned addr, unsigned r0, unsigned r1, unsigned r2,
                                      unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3));
}
/// Not volatile, so the compiler schedules the loads: `addr` must depend on orderedZero()
/// taken after the wait that makes the data valid.
__device__ __forceinline__ void ldsm4(unsigned addr, unsigned (&r)[4]) {
  asm("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}
/// Zero, produced where the call stands among the volatile asm statements (barrier waits).
__device__ __forceinline__ unsigned orderedZero() {
  unsigned z;
  asm volatile("mov.u32 %0, 0;\n" : "=r"(z));
  return z;
}
template <bool B> struct Flag { static constexpr bool value = B; };
__device__ __forceinline__ unsigned pairBits(float a, float b) {
  const elem2 x = fromF2(a, b);
  unsigned u;
  memcpy(&u, &x, sizeof u);
  return u;
}
__device__ __forceinline__ float2 bitsPair(unsigned u) {
  elem2 x;
  memcpy(&x, &u, sizeof u);
  return toF2(x);
}
/// Makes this thread's shared-memory writes visible to the TMA engine (the async proxy).
__device__ __forceinline__ void fenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/// Barrier `id` (1...15) among `threads` threads, e.g. one warpgroup.
__device__ __forceinline__ void namedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Arrives on barrier `id` without waiting: the producer's half of a hand-off, whose consumers
/// wait with namedBarrier(id, threads); the shared-memory writes before it are visible to them.
__device__ __forceinline__ void namedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/// wgmma shared-memory matrix descriptor, 128-byte swizzle (PTX ISA "matrix descriptor").
/// K-major tiles: rows of 64 elements (128 bytes); `sbo` = 1024 (8 rows), `lbo` unused.
/// MN-major tiles: `lbo` is the distance between 64-wide MN blocks, `sbo` between 8-row K groups.
__device__ __forceinline__ uint64_t smemDesc(const void* p, unsigned lbo, unsigned sbo) {
  return static_cast<uint64_t>((smemAddr(p) & 0x3FFFF) >> 4) |
         static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/// Keeps the compiler from moving accumulator accesses across wgmma issue and wait.
__device__ __forceinline__ void fenceOperand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}

// wgmma.mma_async m64nNk16, f16 x f16 -> f32, both operands from shared memory. TRANS_B = 1
// reads B as MN-major (a [K, N] row-major tile). d has N / 2 accumulators per thread.

template <int TRANS_B>
__device__ __forceinline__ void wgmma64(float* d, uint64_t descA, uint64_t descB, int scaleD) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." FPAT_MMA_AB "." FPAT_MMA_AB " {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
               "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
                 "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                 "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
                 "+f"(d[31])
               : "l"(descA), "l"(descB), "r"(scaleD), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma128(float* d, uint64_t descA, uint64_t descB, int scaleD) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." FPAT_MMA_AB "." FPAT_MMA_AB " {"
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
               "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
                 "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
                 "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                 "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
                 "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
                 "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
                 "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                 "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
                 "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                 "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(descA), "l"(descB), "r"(scaleD), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma256(float* d, uint64_t descA, uint64_t descB, int scaleD) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." FPAT_MMA_AB "." FPAT_MMA_AB " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, "
      "%127"
      "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),
        "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),
        "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(descA), "l"(descB), "r"(scaleD), "n"(TRANS_B));
}

template <int TRANS_B>
__device__ __forceinline__ void wgmma192(float* d, uint64_t descA, uint64_t descB, int scaleD) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32." FPAT_MMA_AB "." FPAT_MMA_AB " {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, %96, %97, p, 1, 1, 0, %99;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
        "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
        "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]),
        "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
        "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(descA), "l"(descB), "r"(scaleD), "n"(TRANS_B));
}

template <int BN, int TRANS_B>
__device__ __forceinline__ void wgmma(float* d, uint64_t descA, uint64_t descB, int scaleD) {
  if constexpr (BN == 64)
    wgmma64<TRANS_B>(d, descA, descB, scaleD);
  else if constexpr (BN == 128)
    wgmma128<TRANS_B>(d, descA, descB, scaleD);
  else if constexpr (BN == 192)
    wgmma192<TRANS_B>(d, descA, descB, scaleD);
  else
    wgmma256<TRANS_B>(d, descA, descB, scaleD);
}

/// Tile `t` of the persistent schedule in grouped order: consecutive tiles walk down a group
/// of `group` M-tiles before moving to the next N-tile (along N with `alongN`: across a group
/// of N-tiles before the next M-tile), so the A rows and B columns in use stay in L2.
__device__ __forceinline__ void tileCoords(int t, int tilesM, int tilesN, int group, bool alongN,
                                           int& tm, int& tn) {
  if (alongN) {
    tileCoords(t, tilesN, tilesM, group, false, tn, tm);
    return;
  }
  const int perGroup = group * tilesN;
  const int first = (t / perGroup) * group;
  const int size = tilesM - first < group ? tilesM - first : group;
  tm = first + (t % perGroup) % size;
  tn = (t % perGroup) / size;
}

} // namespace sm90

/// K % 8 != 0 (TMA's row strides must be multiples of 16 bytes): copies the rows of A (operand
/// 0, M x K) and, with TRANS_B, of B (operand B_INDEX, N x K) into a.padded[0] and a.padded[1]
/// as rows of K rounded up to 8 elements, the pad zeroed (the tensor maps read only K columns;
/// TMA fills the rest of a box). A block copies a row at a time, each thread 8 elements of it
/// per step: the source rows are only 2-byte aligned, the padded ones 16-byte.
template <bool TRANS_B, int B_INDEX>
__device__ __forceinline__ void padRows(const FpatKernelArgs& a) {
  const int64_t K = a.K, P = (K + 7) / 8 * 8, rows = a.M + (TRANS_B ? a.N : 0);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const bool isA = r < a.M;
    const int64_t row = isA ? r : r - a.M;
    const elem* src = static_cast<const elem*>(a.in[isA ? 0 : B_INDEX]) + row * K;
    Half8* dst = reinterpret_cast<Half8*>(static_cast<elem*>(a.padded[isA ? 0 : 1]) + row * P);
    for (int64_t c = threadIdx.x; c < P / 8; c += blockDim.x) {
      Half8 v;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v.h[e] = 8 * c + e < K ? src[8 * c + e] : fromF(0.0f);
      dst[c] = v;
    }
  }
}

/// A weight B (operand B_INDEX) copied into a.padded[1] as N rows of K rounded up to 8
/// elements, the pad zeroed: transposed from [K, N] (SRC_KN) or re-pitched from [N, K]. The
/// runtime runs it once when the weight is uploaded; one 64 x 64 tile per step of a
/// block-stride loop, through shared memory so that reads and writes both go along rows.
/// FOLD_GAMMA (the deferred norm of norm_gemm): each element times gamma[k] (operand 1) in f32,
/// rounded once, so that the GEMM on raw rows computes x (diag(gamma) W).
/// DUAL (the dual GEMM): operands B_INDEX (Bg) and B_INDEX + 1 (Bu) interleaved into
/// codegen::dualColumns(N) rows: row 16 j + i is Bg's column 8 j + i, row 16 j + 8 + i Bu's.
template <bool SRC_KN, int B_INDEX, bool FOLD_GAMMA = false, bool DUAL = false>
__device__ __forceinline__ void prepareWeightB(const FpatKernelArgs& a) {
  __shared__ elem t[64][65]; // [n][k]; the odd pitch keeps the transposing writes conflict-free
  const int64_t N = a.N, K = a.K, P = (K + 7) / 8 * 8;
  const int64_t rows = DUAL ? 2 * ((N + 7) / 8 * 8) : N; // of the copy
  const int64_t tilesN = (rows + 63) / 64, tiles = tilesN * ((P + 63) / 64);
  elem* dst = static_cast<elem*>(a.padded[1]);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t n0 = tile % tilesN * 64, k0 = tile / tilesN * 64;
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
      const int r = i / 64, c = i % 64; // r along the source's rows, c along them
      const int64_t n = SRC_KN ? n0 + c : n0 + r, k = SRC_KN ? k0 + r : k0 + c;
      const int64_t col = DUAL ? n / 16 * 8 + n % 8 : n; // of the source
      const elem* src = static_cast<const elem*>(a.in[DUAL ? B_INDEX + n / 8 % 2 : B_INDEX]);
      elem v = n < rows && col < N && k < K ? src[SRC_KN ? k * N + col : col * K + k] : fromF(0.0f);
      if (FOLD_GAMMA && k < K)
        v = fromF(toF(v) * ldh(a.in[1], k));
      if (SRC_KN)
        t[c][r] = v;
      else
        t[r][c] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) {
      const int r = i / 64, c = i % 64;
      if (n0 + r < rows && k0 + c < P)
        dst[(n0 + r) * P + k0 + c] = t[r][c];
    }
    __syncthreads();
  }
}

/// The deferred LayerNorm's column terms, behind the prepared B in a.padded[1]: colsum[n] =
/// sum over k of the prepared (gamma-folded, rounded) B[k][n], and (beta W)[n] = sum over k of
/// beta[k] W[k][n], f32, each padded with zeros to normColumnsPitch(N) entries, a multiple of
/// every tile's width: the epilogue reads a tile's columns without bounds checks.
__device__ __forceinline__ int64_t normColumnsPitch(int64_t n) {
  return (n + 255) / 256 * 256;
}
__device__ __forceinline__ float* normColumns(const FpatKernelArgs& a) {
  return reinterpret_cast<float*>(static_cast<char*>(a.padded[1]) + a.N * ((a.K + 7) / 8 * 8) * 2);
}

/// Writes those column terms from the weight W (operand B_INDEX, [K, N] where SRC_KN, else
/// [N, K]), gamma (operand 1) and beta (operand 2); run once, when the weight is uploaded. One
/// warp per column: its lanes stride k.
template <bool SRC_KN, int B_INDEX>
__device__ __forceinline__ void prepareNormColumns(const FpatKernelArgs& a) {
  const int64_t N = a.N, K = a.K, pitch = normColumnsPitch(N);
  const elem* w = static_cast<const elem*>(a.in[B_INDEX]);
  float* const cols = normColumns(a);
  const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.x / 32; n < pitch;
       n += static_cast<int64_t>(gridDim.x) * warps) {
    float cs = 0.0f, bw = 0.0f;
    if (n < N)
      for (int64_t k = lane; k < K; k += 32) {
        const float v = toF(w[SRC_KN ? k * N + n : n * K + k]);
        cs += toF(fromF(v * ldh(a.in[1], k))); // the element prepareWeightB stored
        bw += ldh(a.in[2], k) * v;
      }
    for (int o = 16; o > 0; o /= 2) {
      cs += __shfl_xor_sync(0xffffffffu, cs, o);
      bw += __shfl_xor_sync(0xffffffffu, bw, o);
    }
    if (lane == 0) {
      cols[n] = cs;
      cols[pitch + n] = bw;
    }
  }
}

/// Whether an Epilogue is the dual GEMM's (Epilogue::kDual, which only those define).
template <class E, class = void> struct DualEpilogue { static constexpr bool value = false; };
template <class E> struct DualEpilogue<E, decltype(void(E::kDual))> {
  static constexpr bool value = E::kDual;
};

/// The kernel body; `p` must be the kernel's __grid_constant__ parameter (TMA reads the tensor
/// maps from parameter space). Launch with T::THREADS threads, wgmmaSmemBytes<T>() bytes of
/// dynamic shared memory and at most one CTA per SM (grid: min(tiles, SMs), in whole clusters).
template <class T, bool TRANS_B, class Epilogue>
__device__ __forceinline__ void gemmWgmma(const FpatTmaArgs& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, S = T::STAGES;
  extern __shared__ __align__(1024) unsigned char smemRaw[];
  __shared__ __align__(8) uint64_t full[S], empty[S], order[2], tileFull, tileEmpty, sideFull;
  // Interior tiles store through one 16 x 64 slab of shared memory per consumer warp (padded
  // rows: the pair writes are free of bank conflicts), where the configuration leaves room.
  constexpr int kSlabRows = 16, kSlabPitch = 72;
  constexpr int kSlabs = T::CONSUMERS * 4;
  // Epilogue::kTile (cooperative only; the code generator sets it where the tile fits): the
  // epilogue writes its results into a BM x BN tile of shared memory behind the stages, laid
  // out as TMA's 128-byte-swizzled boxes of 64 columns, and one thread per consumer
  // warpgroup stores its 64 rows with TMA. Operand Epilogue::kStaged ([M, N], e.g. a
  // residual) arrives in the same tile by TMA, loaded by the producer during the tile's main
  // loop, and each result overwrites its operand in place.
  constexpr bool kTile = Epilogue::kTile;
  constexpr bool kPre = kTile && Epilogue::kStaged >= 0;
  static_assert(!kTile || !T::PINGPONG, "the epilogue tile is for the cooperative schedule");
  // Epilogue::kDefer: where the CTA has another tile to compute and the main loop is long
  // enough to hide it, the consumers only write their accumulators into the tile, rounded to
  // the element type as an unfused GEMM would store them, and go on to the next tile; the
  // producer warpgroup's three idle warps apply the epilogue there and store the tile, off
  // the tensor cores' critical path. A CTA's last tile the consumers finish (kPre as above).
  constexpr bool kDefer = kTile && Epilogue::kDefer;
  // kSide: a deferred epilogue's [M, N] operand comes to the helpers by TMA, one BM x 64 box
  // at a time, into a side buffer behind the tile (their own row loads from global memory
  // fell behind the main loop: gemm_silu_mul took 1.7x as long).
  constexpr bool kSide = kDefer && kPre;
  // sm_90 allows 227 KB of shared memory per block; 1 KB each for alignment and barriers.
  constexpr bool kStagedStore =
      !kTile &&
      T::STAGES * T::STAGE_BYTES + 1024 + kSlabs * kSlabRows * kSlabPitch * 2 + 1024 <= 232448;
  __shared__ __align__(16) elem epiSlab[kStagedStore ? kSlabs : 1][kSlabRows * kSlabPitch];
  // Swizzled TMA boxes and wgmma descriptors assume 1024-byte aligned stages.
  unsigned char* smem = smemRaw + ((1024 - (smemAddr(smemRaw) & 1023)) & 1023);
  auto stageA = [&](int s) { return smem + s * T::STAGE_BYTES; };
  auto stageB = [&](int s) { return smem + s * T::STAGE_BYTES + T::A_BYTES; };
  unsigned char* const tileC = smem + S * T::STAGE_BYTES; // kTile: [BN / 64][BM][128 bytes]
  unsigned char* const side = tileC + BM * BN * 2;        // kSide: [BM][128 bytes]

  const FpatKernelArgs& a = p.k;
  // The dual GEMM (Epilogue::kDual) runs over the interleaved copy of its two weights
  // (prepareWeightB with DUAL): N is that copy's columns here, a.N the result's.
  constexpr bool kDual = DualEpilogue<Epilogue>::value;
  static_assert(!kDual || !kTile, "the dual GEMM stores from registers");
  const int M = static_cast<int>(a.M), K = static_cast<int>(a.K);
  const int N = kDual ? static_cast<int>(2 * ((a.N + 7) / 8 * 8)) : static_cast<int>(a.N);
  // A short A box cannot hold more rows: fail the launch rather than compute wrong rows (the
  // code generator never pairs such a configuration with a larger M).
  if (T::A_ROWS < BM && M > T::A_ROWS)
    __trap();
  const int tilesM = (M + BM - 1) / BM, tilesN = (N + BN - 1) / BN, KT = (K + BK - 1) / BK;
  // The schedule hands out units of CL M-tiles sharing one B tile, one per cluster; this CTA
  // computes M-tile CL * um + rank of unit (um, tn). With an odd number of M-tiles the last
  // unit's second tile lies below the matrix: its CTA loads the last real A tile (so that
  // the multicast and barriers run as everywhere) and stores nothing.
  constexpr int CL = T::CLUSTER;
  const int rank = CL > 1 ? static_cast<int>(clusterRank()) : 0;
  const int unitsM = (tilesM + CL - 1) / CL, units = unitsM * tilesN;
  const int unit0 = blockIdx.x / CL, stride = gridDim.x / CL;
  const int wg = threadIdx.x / 128;
  //
  // The last wave split in k (cooperative tiles without clusters, compiled in where the code
  // generator planned it, Epilogue::kSplit, and where the host passed a workspace): when the tiles
  // are not a whole number of waves, the last skTiles tiles are cut into skPieces equal ranges of
  // k-tiles, and the CTAs take those pieces round-robin, piece by piece (all CTAs then walk the
  // same k-tiles at once, so that L2 serves each slice of A and B to several of them: CTAs at as
  // many k offsets as there are CTAs ran 10-35% slower). The last piece of a tile runs its epilogue
  // after adding the others' partial sums, which they left in a workspace slot each (f32, one per
  // consumer warpgroup) with a flag raised; it comes at least a round after them. The plan
  // minimises rounds / pieces plus the partial sums' cost over the remainder of the last wave, or
  // that remainder and the full wave before it; without a plan under 0.9 of a tile the tiles stay
  // whole (codegen::lastWaveSplit makes the same plan on the host). Every CTA is resident.
  constexpr bool kSplitLast = !T::PINGPONG && CL == 1 && Epilogue::kSplit;
  static_assert(!(Epilogue::kSplit && Epilogue::kNormStats),
                "row statistics summed in the main loop need whole tiles (no split in k)");
  const int G = gridDim.x;
  int skTiles = 0, skPieces = 1;
  // (A grid of fewer tiles than SMs, launched on every SM, splits all of them.)
  if (kSplitLast && a.scratch[0] != nullptr && units % G != 0) {
    const int R = units % G;
    // Costs in 1 / (12 den) of a tile; an extra piece's partial sums cost 12 piece (measured:
    // codegen::lastWaveSplit, which this must match).
    const long long den = 59 + 13ll * KT, piece = 150 + KT;
    long long best = 108 * den / 10; // 0.9 of a tile
    for (int extra = 0; extra <= 1; ++extra)
      for (int pieces = 2; pieces <= 4 && pieces <= KT; ++pieces) {
        const int tiles = R + extra * G, rounds = (tiles * pieces + G - 1) / G;
        // Partial-sum slots: one per tile and piece but the last, at most G (the workspace).
        if (tiles > units || tiles * (pieces - 1) > G)
          continue;
        const long long cost =
            12 / pieces * rounds * den + 12 * (pieces - 1) * piece - 12 * extra * den;
        if (cost < best) {
          best = cost;
          skTiles = tiles;
          skPieces = pieces;
        }
      }
  }
  const bool sk = skTiles > 0;
  const int dpTiles = units - skTiles; // whole tiles, a multiple of G
  const int dpCount = unit0 < dpTiles ? (dpTiles - 1 - unit0) / stride + 1 : 0;
  // Whether this CTA runs the last piece of some split tile (its last item then has an
  // epilogue, which waits for the helpers to finish a deferred tile before it).
  const int items = skTiles * skPieces, b = static_cast<int>(blockIdx.x);
  const bool hasLastPiece = b < items && b + (items - 1 - b) / G * G >= items - skTiles;
  // Item w of this CTA's sequence: tile t, k-tiles [k0, k1); false past the last one. Piece
  // p of split tile i is item p * skTiles + i of the round-robin.
  auto work = [&](int w, int& t, int& k0, int& k1) {
    if (w < dpCount) {
      t = unit0 + w * stride;
      k0 = 0;
      k1 = KT;
      return true;
    }
    const int q = blockIdx.x + (w - dpCount) * G;
    if (q >= skTiles * skPieces) // also every CTA without a plan
      return false;
    const int piece = q / skTiles;
    t = dpTiles + q % skTiles;
    k0 = piece * KT / skPieces;
    k1 = (piece + 1) * KT / skPieces;
    return true;
  };
  // Whether the epilogue of unit t is deferred to the helper warps (the same answer in every
  // role): tiles the CTA computes whole with another item after them. 48 k-tiles: their three
  // warps then take well under a main loop per tile; at 32 (K = 2048) they fall behind (GeLU
  // tiles at 77% of cuBLAS's speed, 90% undeferred). With the last wave split, the whole tiles
  // before the pieces when an epilogue follows them (the last piece of a tile), except where
  // the helpers would also load the next tile's operand (kSide), which assumes whole tiles.
  auto deferred = [&](int t) {
    return kDefer && KT >= 48 &&
           (sk ? !kSide && t < dpTiles && (t + stride < dpTiles || hasLastPiece)
               : t + stride < units);
  };
  // The hand-offs between consumers and helpers are named barriers (racecheck follows those,
  // not mbarrier phases, for ordinary shared-memory accesses): kReady, the consumers' rows are
  // in the tile (consumers arrive, helpers wait); kFree, the helpers' stores have read it
  // (helpers arrive, consumers wait). Strict alternation keeps each barrier's phases in step.
  constexpr int kReady = 4, kFree = 5, kHandOff = 128 * T::CONSUMERS + 96;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbarInit(&full[s], 1);
      // Every consumer warp that reads a stage releases it: all consumers (cooperative) or the
      // one that owns the tile (ping-pong). In clusters one thread per consumer warpgroup
      // releases it, in every CTA of the cluster (remote arrivals are costly).
      mbarInit(&empty[s], (T::PINGPONG ? 1 : T::CONSUMERS) * (CL == 1 ? 4 : CL));
    }
    mbarInit(&order[0], 1);
    mbarInit(&order[1], 1);
    // kPre: the producer's operand load completes tileFull; each consumer warpgroup's thread 0
    // arrives on tileEmpty once its previous tile's store has read the tile.
    mbarInit(&tileFull, 1);
    mbarInit(&tileEmpty, T::CONSUMERS);
    mbarInit(&sideFull, 1); // kSide: TMA completes it
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if constexpr (CL > 1)
    clusterSync(); // the peer's barriers are initialised before any multicast or remote arrive

  if (wg == 0) {
    // Producer: one thread issues every copy; the other 127 only give their registers away.
    if constexpr (T::CONSUMERS == 2)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x == 0) {
      int stage = 0, local = 0, tiled = 0, t, k0, k1;
      unsigned phase = 0;
      for (int w = 0; work(w, t, k0, k1); ++w, ++local) {
        // kSide: after a deferred tile the helpers load the operand, once their stores have
        // read the tile (waiting for that here would hold up the ring). Pieces of a split tile but
        // the last have no epilogue.
        const bool preLoad =
            k1 == KT && kPre && !deferred(t) && !(kSide && local > 0 && deferred(t - stride));
        int tm, tn;
        tileCoords(t, unitsM, tilesN, 8 / CL, T::RASTER_N, tm, tn);
        tm = min(tm * CL + rank, tilesM - 1);
        const int opStart = min(k0 + S + 1, k1 - 1);
        constexpr int kOpStep = BN / 64 >= 4 ? 1 : BN / 64; // operand boxes per k-tile
        for (int kt = k0; kt < k1; ++kt) {
          mbarWait(&empty[stage], phase ^ 1); // a fresh barrier passes parity 1 at once
          mbarExpectTx(&full[stage], T::STAGE_BYTES);
          tmaLoad2d(stageA(stage), &p.a, kt * BK, tm * BM, &full[stage]);
          if constexpr (CL > 1) {
            // This CTA's half of B, to both CTAs; the peer sends the other half.
            if constexpr (TRANS_B) {
              tmaLoad2dMulticast(stageB(stage) + rank * (BN / 2) * 128, &p.b, kt * BK,
                                 tn * BN + rank * (BN / 2), &full[stage], 0x3);
            } else {
#pragma unroll
              for (int j = rank * BN / 128; j < (rank + 1) * BN / 128; ++j)
                tmaLoad2dMulticast(stageB(stage) + j * 64 * BK * 2, &p.b, tn * BN + j * 64, kt * BK,
                                   &full[stage], 0x3);
            }
          } else if constexpr (TRANS_B) {
            tmaLoad2d(stageB(stage), &p.b, kt * BK, tn * BN, &full[stage]);
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              tmaLoad2d(stageB(stage) + j * 64 * BK * 2, &p.b, tn * BN + j * 64, kt * BK,
                        &full[stage]);
          }
          if (++stage == S) {
            stage = 0;
            phase ^= 1;
          }
          // The epilogue operand, once the consumers have moved on to this tile (they arrive
          // after its k-tile min(1, k1 - 1), loaded before this one: no deadlock) and the
          // previous tile's stores have read the tile: from k-tile opStart on, k1 - S - 2
          // k-tiles ahead of its use. Tiles of four or more 64-column boxes load one box per
          // k-tile (gemm_residual and gemm_bias_residual about 1% faster at 128x256 than with
          // 64 KB at once); two-box tiles load both at once (128x128 ran 4% slower with a box
          // per k-tile at 512x4096x4096, 20% with boxes 4 k-tiles apart).
          const int q = kt - opStart;
          if (preLoad && q >= 0 && q * kOpStep < BN / 64) {
            if (q == 0) {
              mbarWait(&tileEmpty, (tiled & 1) ^ 1);
              mbarExpectTx(&tileFull, BM * BN * 2);
            }
            const int upto = kt == k1 - 1 ? BN / 64 : min(BN / 64, (q + 1) * kOpStep);
            for (int j = q * kOpStep; j < upto; ++j)
              tmaLoad2d(tileC + j * BM * 128, &p.c, tn * BN + j * 64, tm * BM, &tileFull);
          }
        }
        tiled += k1 == KT; // items that store through the tile (tileEmpty's phases)
      }
    } else if (kDefer && threadIdx.x >= 32) {
      // Helpers: warp h of 1..3 takes tile rows h - 1, h + 2, ... of each 64-column box, a row
      // per warp instruction (lane: columns 2 lane, 2 lane + 1), so that operand loads from
      // global memory are whole 128-byte rows.
      const Epilogue epi;
      const int hw = threadIdx.x / 32 - 1, lane = threadIdx.x % 32;
      // kSide: the operand's box q of tile t into the side buffer (thread 32 issues it once
      // the helpers have read the previous box). The next box is loaded while the current
      // one's stores drain, box 0 of a tile while the consumers still compute it.
      unsigned sidePhase = 0;
      // Box q of tile t's operand into `dst`, completing `bar` (q < 0: every box).
      auto loadOperand = [&](int t, int q, unsigned char* dst, uint64_t* bar) {
        int tm, tn;
        tileCoords(t, unitsM, tilesN, 8 / CL, T::RASTER_N, tm, tn);
        tm = min(tm * CL + rank, tilesM - 1);
        mbarExpectTx(bar, q < 0 ? BM * BN * 2 : BM * 128);
        for (int j = q < 0 ? 0 : q; j < (q < 0 ? BN / 64 : q + 1); ++j)
          tmaLoad2d(dst + (q < 0 ? j * BM * 128 : 0), &p.c, tn * BN + 64 * j, tm * BM, bar);
      };
      if (kSide && threadIdx.x == 32 && deferred(unit0))
        loadOperand(unit0, 0, side, &sideFull);
      for (int t = unit0; t < units; t += stride) {
        if (!deferred(t))
          continue;
        int tm, tn;
        tileCoords(t, unitsM, tilesN, 8 / CL, T::RASTER_N, tm, tn);
        tm = tm * CL + rank;
        namedBarrier(kReady, kHandOff);
        const bool inside = (tm + 1) * BM <= M && (tn + 1) * BN <= N;
#pragma unroll 1
        for (int q = 0; q < BN / 64; ++q) {
          const int col = tn * BN + 64 * q + 2 * lane;
          unsigned char* const box = tileC + q * (BM * 128) + (lane % 4) * 4;
          if constexpr (kSide) {
            mbarWait(&sideFull, sidePhase);
            sidePhase ^= 1;
          }
          // kRows rows at a time: all their loads, then the arithmetic, then the stores (the
          // compiler cannot tell the tile from the operands in memory, so a row's store would
          // order the next row's loads after it; one warp per scheduler then waits out every
          // load and MUFU latency in turn). Measured: 4 rows made deferred GeLU tiles at
          // K = 2048 10% faster, 8 rows slower than 1.
          constexpr int kRows = 4;
#pragma unroll 1
          for (int r0 = hw; r0 < BM; r0 += 3 * kRows) {
            float2 v[kRows], s[kRows];
            bool ok[kRows];
#pragma unroll
            for (int u = 0; u < kRows; ++u) {
              const int r = r0 + 3 * u, at = r * 128 + (((lane / 4) ^ (r % 8)) * 16);
              ok[u] = r < BM && (inside || (tm * BM + r < M && col < N));
              v[u] = s[u] = make_float2(0.0f, 0.0f);
              if (ok[u]) {
                v[u] = toF2(*reinterpret_cast<const elem2*>(box + at));
                if constexpr (kSide)
                  s[u] = toF2(*reinterpret_cast<const elem2*>(side + (lane % 4) * 4 + at));
              }
            }
#pragma unroll
            for (int u = 0; u < kRows; ++u)
              if (ok[u]) {
                if constexpr (kSide && Epilogue::kAddStaged) {
                  // As the consumers do: the operand added to head's rounded pair (the
                  // element type's pairs convert to f32 and back exactly). The helpers keep
                  // exp and division on the MUFU (kFma = false): one warp per scheduler is
                  // bound by its own latency, and the FMA forms' extra instructions cost
                  // gemm_bias_gelu 4096^3 1 point (bench/RESULTS.md, session 20).
                  const float2 h =
                      epi.template head<false>(v[u], tm * BM + r0 + 3 * u, col, a, s[u]);
                  v[u] = bitsPair(addPairBits(pairBits(h.x, h.y), pairBits(s[u].x, s[u].y)));
                } else {
                  v[u] = epi.template pair<false>(v[u], tm * BM + r0 + 3 * u, col, a, s[u]);
                }
              }
#pragma unroll
            for (int u = 0; u < kRows; ++u) {
              const int r = r0 + 3 * u;
              if (ok[u])
                *reinterpret_cast<elem2*>(box + r * 128 + (((lane / 4) ^ (r % 8)) * 16)) =
                    fromF2(v[u].x, v[u].y);
            }
          }
          if constexpr (kSide) {
            namedBarrier(3, 96); // the side buffer is read
            if (threadIdx.x == 32) {
              if (q + 1 < BN / 64)
                loadOperand(t, q + 1, side, &sideFull);
              else if (deferred(t + stride))
                loadOperand(t + stride, 0, side, &sideFull);
            }
          }
        }
        fenceProxyAsync();
        namedBarrier(3, 96);
        if (threadIdx.x == 32) {
          if (tm < tilesM) {
#pragma unroll
            for (int q = 0; q < BN / 64; ++q)
#pragma unroll
              for (int h = 0; h < BM / 64; ++h)
                tmaStore2d(&p.d, tileC + q * (BM * 128) + h * 64 * 128, tn * BN + 64 * q,
                           tm * BM + 64 * h);
            bulkCommit();
          }
          bulkWaitRead();
          // A CTA's last tile, which the consumers finish: its operand into the tile (kPre).
          if (kSide && t + stride < units && !deferred(t + stride))
            loadOperand(t + stride, -1, tileC, &tileFull);
        }
        namedBarrier(3, 96); // the stores have read the tile
        namedBarrierArrive(kFree, kHandOff);
      }
      if (threadIdx.x == 32)
        bulkWait();
    }
  } else {
    if constexpr (T::CONSUMERS == 2)
      asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    constexpr int MI = T::MI;
    const int c = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    float d[MI][BN / 2];
#pragma unroll
    for (int m = 0; m < MI; ++m)
#pragma unroll
      for (int i = 0; i < BN / 2; ++i)
        d[m][i] = 0.0f;
    const Epilogue epi;
    elem* C = static_cast<elem*>(a.out);
    const bool pairs = (N % 2) == 0; // f16 pairs are 4-byte aligned
    // Rows start 16-byte aligned: the slab stores write 16 bytes at a time.
    const bool rows16B = N % 8 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0;
    // Releases a stage (called by lane 0 of each consumer warp once its MMAs are done): to
    // this CTA's producer, and with clusters to the peer's too (its multicast writes the stage
    // here as well). In clusters warp r of the warpgroup arrives on CTA r's barrier: a wgmma
    // is one operation of the whole warpgroup, complete for all its warps once one waited.
    auto release = [&](int s) {
      if constexpr (CL == 1)
        mbarArrive(&empty[s]);
      else if (warp == 0)
        mbarArriveCluster(&empty[s], 0);
      else if (warp == 1)
        mbarArriveCluster(&empty[s], 1);
    };
    int local = 0;          // the item's place in this CTA's sequence
    int tiled = 0;          // items before this one that stored through the tile
    bool handedOff = false; // kDefer: the previous tile was left to the helpers
    int preloaded = 0;      // kPre: tiles (not deferred) whose operand was loaded into the tile
    unsigned orderPhase = 0;
    long long ring = 0; // k-tiles of this CTA's earlier items: the ring holds them in turn
    int t, k0, k1;
    for (int w = 0; work(w, t, k0, k1); ++w, ++local, tiled += k1 == KT) {
      const long long first = ring;
      ring += k1 - k0;
      if (T::PINGPONG && (local & 1) != c)
        continue;
      // Ping-pong: a consumer starts a tile's main loop only once the other has seen every
      // k-tile of the tile before it arrive. Its waits on the ring are then at most one phase
      // ahead of each stage, which parity waits need (two phases ahead looks complete).
      if (T::PINGPONG && local > 0) {
        mbarWait(&order[c], orderPhase);
        orderPhase ^= 1;
      }
      int tm, tn;
      tileCoords(t, unitsM, tilesN, 8 / CL, T::RASTER_N, tm, tn);
      tm = tm * CL + rank; // tm == tilesM: a tile below the matrix, computed and not stored
      int stage = static_cast<int>(first % S);
      unsigned phase = static_cast<unsigned>((first / S) & 1);
      // Rows of the tile this consumer computes: its 64 (cooperative) or all BM (ping-pong).
      const int row0 = T::PINGPONG ? 0 : c * 64 * MI;
      // Epilogue::kNormStats: the deferred norm's row statistics from the A tiles this
      // consumer already has in shared memory. Thread (warp w, lane l) sums its accumulator
      // rows' 16 elements l % 4 of each k-tile (two 16-byte chunks of the 128-byte swizzled
      // row); LayerNorm's sums are of x - x[row][0], a shift near the mean (no cancellation).
      constexpr bool kStats = Epilogue::kNorm != 0 && Epilogue::kNormStats;
      float sx[MI][2], sq[MI][2], shift[MI][2];
#pragma unroll
      for (int m = 0; m < MI; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sx[m][h] = sq[m][h] = shift[m][h] = 0.0f;
      int prev = -1;
      for (int kt = k0; kt < k1; ++kt) {
        mbarWait(&full[stage], phase);
        if (T::PINGPONG && kt == KT - 1 && tid == 0 && t + stride < units)
          mbarArrive(&order[1 - c]); // the other consumer's tile may start
#pragma unroll
        for (int m = 0; m < MI; ++m)
#pragma unroll
          for (int i = 0; i < BN / 2; ++i)
            fenceOperand(d[m][i]);
        wgmmaFence();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
          // K-major B: rows of K, step 32 bytes per 16 k. MN-major B: 16 k rows of 128 bytes
          // per step, 64-wide N blocks BK * 128 bytes apart.
          const uint64_t db = TRANS_B ? smemDesc(stageB(stage) + ks * 32, 16, 1024)
                                      : smemDesc(stageB(stage) + ks * 16 * 128, BK * 128, 1024);
#pragma unroll
          for (int m = 0; m < MI; ++m) {
            const uint64_t da = smemDesc(stageA(stage) + (row0 + m * 64) * 128 + ks * 32, 16, 1024);
            wgmma<BN, TRANS_B ? 0 : 1>(d[m], da, db, kt > k0 || ks > 0);
          }
        }
        wgmmaCommit();
        if constexpr (kStats) {
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = row0 + m * 64 + warp * 16 + lane / 4 + 8 * h;
              const unsigned char* rowA = stageA(stage) + r * 128;
              if (Epilogue::kNorm == 1 && kt == 0)
                shift[m][h] = toF(*reinterpret_cast<const elem*>(rowA + ((r % 8) * 16)));
#pragma unroll
              for (int q = 0; q < 2; ++q) {
                Half8 v;
                v.u =
                    *reinterpret_cast<const uint4*>(rowA + (((2 * (lane % 4) + q) ^ (r % 8)) * 16));
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                  const float x = toF(v.h[e]) - shift[m][h];
                  sx[m][h] += x;
                  sq[m][h] = fmaf(x, x, sq[m][h]);
                }
              }
            }
        }
        // One group stays in flight: the previous k-tile's MMAs are done, release its stage.
        wgmmaWait<1>();
#pragma unroll
        for (int m = 0; m < MI; ++m)
#pragma unroll
          for (int i = 0; i < BN / 2; ++i)
            fenceOperand(d[m][i]);
        if (prev >= 0 && lane == 0)
          release(prev);
        if constexpr (kPre) {
          if (k1 == KT && kt == min(k0 + 1, k1 - 1) && tiled > 0 && tid == 0) {
            bulkWaitRead(); // the previous tile's stores have read the tile
            mbarArrive(&tileEmpty);
          }
        }
        prev = stage;
        if (++stage == S) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmmaWait<0>();
#pragma unroll
      for (int m = 0; m < MI; ++m)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i)
          fenceOperand(d[m][i]);
      if (prev >= 0 && lane == 0)
        release(prev);

      // A split tile's pieces. Slot (split tile i, piece p < last), one part per consumer
      // warpgroup, register-major so that a warp's accesses are whole 128-byte lines; flags
      // are 0 between launches (the last piece resets them).
      if (sk && t >= dpTiles) {
        const int slotSize = MI * (BN / 2) * 128, i = t - dpTiles;
        const int piece = (static_cast<int>(blockIdx.x) + (w - dpCount) * G) / skTiles;
        auto part = [&](int p) { return ((i * (skPieces - 1) + p) * T::CONSUMERS + c); };
        unsigned* const flags = static_cast<unsigned*>(a.scratch[1]);
        if (k1 < KT) { // not the last piece: partial sums out, then the flag
          float* const slot = static_cast<float*>(a.scratch[0]) + part(piece) * slotSize;
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int r = 0; r < BN / 2; ++r)
              __stcg(slot + (m * (BN / 2) + r) * 128 + tid, d[m][r]);
          __threadfence();
          namedBarrier(1 + c, 128);
          if (tid == 0)
            asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flags + part(piece)), "r"(1u)
                         : "memory");
          continue;
        }
        // The last piece: the others' partial sums in.
        for (int p = 0; p < skPieces - 1; ++p) {
          if (tid == 0) {
            unsigned* const flag = flags + part(p);
            unsigned seen = 0;
            do {
              asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n"
                           : "=r"(seen)
                           : "l"(flag)
                           : "memory");
            } while (seen == 0);
            *flag = 0; // for the next launch
          }
          namedBarrier(1 + c, 128);
          const float* const slot = static_cast<const float*>(a.scratch[0]) + part(p) * slotSize;
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int r = 0; r < BN / 2; ++r)
              d[m][r] += __ldcg(slot + (m * (BN / 2) + r) * 128 + tid);
        }
      }

      // The deferred norm (Epilogue::kNorm: 1 layernorm, 2 rmsnorm): the main loop ran on the
      // raw rows of x with gamma folded into B, so each accumulator becomes rstd[row] * (acc -
      // mean[row] colsum[col]) + (beta W)[col], or rstd[row] * acc, before any epilogue (the
      // helpers of a deferred tile then see the normalised GEMM, as rounded as the unfused
      // one's). The statistics come from the launch before, which this kernel overlaps.
      if constexpr (Epilogue::kNorm != 0) {
        float rs[MI][2], mr[MI][2];
        if constexpr (kStats) {
          // The four lanes of a row hold its sums over K rounded up to whole k-tiles, whose
          // columns past K were TMA's zeros: each added -shift and shift^2.
          const float pad = static_cast<float>(KT * BK - K), n = static_cast<float>(K);
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              float s1 = sx[m][h], s2 = sq[m][h];
#pragma unroll
              for (int o = 1; o < 4; o *= 2) {
                s1 += __shfl_xor_sync(0xffffffffu, s1, o);
                s2 += __shfl_xor_sync(0xffffffffu, s2, o);
              }
              const float c0 = shift[m][h];
              s1 += pad * c0;
              s2 -= pad * c0 * c0;
              const float d = s1 / n;
              const float var = Epilogue::kNorm == 1 ? fmaxf(s2 / n - d * d, 0.0f) : s2 / n;
              rs[m][h] = rsqrtf(var + a.eps);
              mr[m][h] = Epilogue::kNorm == 1 ? (c0 + d) * rs[m][h] : 0.0f;
            }
        } else {
          waitPriorGrid();
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int row = min(tm * BM + row0 + m * 64 + warp * 16 + lane / 4 + 8 * h, M - 1);
              rs[m][h] = static_cast<const float*>(a.rowStats[1])[row];
              mr[m][h] = Epilogue::kNorm == 1
                             ? static_cast<const float*>(a.rowStats[0])[row] * rs[m][h]
                             : 0.0f;
            }
        }
        // This thread's columns of the tile: pairs 8 apart (their offsets fold into immediates).
        const float* const cols =
            Epilogue::kNorm == 1 ? normColumns(a) + tn * BN + 2 * (lane % 4) : nullptr;
        const int64_t pitch = normColumnsPitch(N);
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          float2 cs = make_float2(0.0f, 0.0f), bw = cs;
          if constexpr (Epilogue::kNorm == 1) {
            cs = *reinterpret_cast<const float2*>(cols + 8 * j);
            bw = *reinterpret_cast<const float2*>(cols + pitch + 8 * j);
          }
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              float& x0 = d[m][4 * j + 2 * h];
              float& x1 = d[m][4 * j + 2 * h + 1];
              x0 = fmaf(x0, rs[m][h], fmaf(-mr[m][h], cs.x, bw.x));
              x1 = fmaf(x1, rs[m][h], fmaf(-mr[m][h], cs.y, bw.y));
            }
        }
      }

      // The dual GEMM's epilogue: the tile's 8-column blocks 2j and 2j + 1 are acc's and acc2's
      // columns 8j .. 8j + 7 of the result's tile of BN / 2 columns, held by the same thread in
      // registers 8j + 2h (+1) and 8j + 4 + 2h (+1). The results go to registers 4j + 2h (+1),
      // which earlier steps have read: the rest of the store is a GEMM's of BN / 2 columns.
      if constexpr (kDual) {
        constexpr int OW = BN / 2;
        const int64_t NO = a.N;
        const bool pairsO = NO % 2 == 0;
        const bool inside = (tm + 1) * BM <= M && (tn + 1) * OW <= NO && pairsO;
#pragma unroll
        for (int m = 0; m < MI; ++m) {
          const int64_t rowBase =
              static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16 + lane / 4;
          const int64_t colBase = static_cast<int64_t>(tn) * OW + 2 * (lane % 4);
#pragma unroll
          for (int j = 0; j < OW / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float2 gv = make_float2(d[m][8 * j + 2 * h], d[m][8 * j + 2 * h + 1]);
              const float2 uv = make_float2(d[m][8 * j + 4 + 2 * h], d[m][8 * j + 5 + 2 * h]);
              float2 r;
              if (inside) {
                r = epi.dual(gv, uv, rowBase + 8 * h, colBase + 8 * j, a);
              } else {
                // Edge tiles: coordinates clamped into the result (loads in bounds, results
                // outside dropped by the checked stores below).
                const int64_t row = min(rowBase + 8 * h, static_cast<int64_t>(M - 1));
                const int64_t col = min(colBase + 8 * j, pairsO ? NO - 2 : NO - 1);
                if (pairsO) {
                  r = epi.dual(gv, uv, row, col, a);
                } else {
                  r.x = epi.dual1(gv.x, uv.x, row, col, a);
                  r.y = epi.dual1(gv.y, uv.y, row, min(col + 1, NO - 1), a);
                }
              }
              d[m][4 * j + 2 * h] = r.x;
              d[m][4 * j + 2 * h + 1] = r.y;
            }
          if (inside) {
            if constexpr (kStagedStore) {
              if (NO % 8 == 0 && reinterpret_cast<uintptr_t>(C) % 16 == 0) {
                // Through the warp's slab, 64 columns at a time (32 where the result's tile is
                // not a multiple of 64: BN = 192, 64), stored as whole rows.
                constexpr int W = OW % 64 == 0 ? 64 : 32;
                static_assert(OW % W == 0, "the slab passes cover the result's tile");
                elem* slab = epiSlab[c * 4 + warp];
                const int64_t row0g = static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16;
#pragma unroll
                for (int q = 0; q < OW / W; ++q) {
#pragma unroll
                  for (int jj = 0; jj < W / 8; ++jj)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                      const int j = (W / 8) * q + jj;
                      *reinterpret_cast<elem2*>(slab + (lane / 4 + 8 * h) * kSlabPitch + 8 * jj +
                                                2 * (lane % 4)) =
                          fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
                    }
                  __syncwarp();
#pragma unroll
                  for (int i = lane; i < 16 * (W / 8); i += 32) {
                    const int r = i / (W / 8), chunk = i % (W / 8);
                    *reinterpret_cast<uint4*>(C + (row0g + r) * NO + tn * OW + W * q + 8 * chunk) =
                        *reinterpret_cast<const uint4*>(slab + r * kSlabPitch + 8 * chunk);
                  }
                  __syncwarp();
                }
                continue;
              }
            }
#pragma unroll
            for (int j = 0; j < OW / 8; ++j)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                *reinterpret_cast<elem2*>(C + (rowBase + 8 * h) * NO + colBase + 8 * j) =
                    fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
            continue;
          }
#pragma unroll
          for (int j = 0; j < OW / 8; ++j) {
            const int64_t col = colBase + 8 * j;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t row = rowBase + 8 * h;
              if (row < M && col < NO) {
                elem* out = C + row * NO + col;
                if (pairsO) {
                  *reinterpret_cast<elem2*>(out) =
                      fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
                } else {
                  out[0] = fromF(d[m][4 * j + 2 * h]);
                  if (col + 1 < NO)
                    out[1] = fromF(d[m][4 * j + 2 * h + 1]);
                }
              }
            }
          }
        }
        continue;
      }

      // Epilogue. Accumulator layout of m64nN: thread (warp w, lane l) holds rows
      // 16w + l/4 (+8) and columns 8j + 2(l%4) (+1), register 4j + 2*(row half) + column.
      if constexpr (kTile) {
        // The helpers' stores of the previous tile have read the tile.
        const bool prevHanded = handedOff;
        if (kDefer && prevHanded)
          namedBarrier(kFree, kHandOff);
        const bool handOff = deferred(t);
        handedOff = handOff;
        // (Deferred tiles come first in a CTA's sequence: a consumer-stored tile before one
        // handed off happens only if that changes, and then its stores must have read the tile.)
        if (handOff && !prevHanded && local > 0) {
          if (tid == 0)
            bulkWaitRead();
          namedBarrier(1 + c, 128);
        }
        // Pair (j, h) of a thread: 64-column box j / 8, tile row r + 8h, 16-byte chunk j % 8
        // swizzled with the row's low three bits. Matrices j, j + 1 (h = 0, 1) go by one
        // stmatrix / ldmatrix: lane 8i + q gives row q of pair column j + i / 2, half i % 2,
        // in chunk ((j % 8) + i / 2) ^ q = (j % 8) ^ (i / 2 ^ q) (j even), one of four
        // addresses per lane plus an immediate.
        const int mrow = row0 + warp * 16 + (lane / 8 % 2) * 8 + lane % 8;
        const int chunk = (lane / 16) ^ (lane % 8);
        unsigned quad[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          quad[k] = smemAddr(tileC) + mrow * 128 + (((2 * k) ^ chunk) * 16);
        auto quadAt = [&](int m, int j) {
          return quad[(j % 8) / 2] + (j / 8) * (BM * 128) + m * 64 * 128;
        };
        // Each quad is stored as soon as it is computed: its accumulators die there (storing
        // after all the loads left the operands' registers live alongside the 128
        // accumulators, and gemm_silu_mul spilled).
        auto store = [&](int m, int j) {
          stsm4(quadAt(m, j), pairBits(d[m][4 * j], d[m][4 * j + 1]),
                pairBits(d[m][4 * j + 2], d[m][4 * j + 3]),
                pairBits(d[m][4 * j + 4], d[m][4 * j + 5]),
                pairBits(d[m][4 * j + 6], d[m][4 * j + 7]));
        };
        if (handOff) {
#pragma unroll
          for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int j = 0; j < BN / 8; j += 2)
              store(m, j);
        } else {
          // The operand is in the tile (kPre), or the tile is free once this warpgroup's
          // previous stores have read it.
          if constexpr (kPre) {
            mbarWait(&tileFull, preloaded & 1);
            ++preloaded;
          } else {
            if (tid == 0)
              bulkWaitRead();
            namedBarrier(1 + c, 128);
          }
          // The operand's reads may be scheduled freely, but only after the wait above.
          const unsigned after = orderedZero();
          // 64-bit bases: operand addresses then fold the pair offsets into immediates.
          const int r = row0 + warp * 16 + lane / 4;
          const int64_t rowBase = static_cast<int64_t>(tm) * BM + r,
                        colBase = static_cast<int64_t>(tn) * BN + 2 * (lane % 4);
          auto apply = [&](int m, int j, int h, float2 s) {
            const float2 v = epi.pair(make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]),
                                      rowBase + m * 64 + 8 * h, colBase + 8 * j, a, s);
            d[m][4 * j + 2 * h] = v.x;
            d[m][4 * j + 2 * h + 1] = v.y;
          };
          // Tiles inside the problem run without bounds checks, in one branch-free block (a
          // check per pair measured 3-11% slower: each pair's loads and math became a block
          // of its own); TMA clips the stores of edge tiles (N is even here, so a pair is
          // inside or outside as a whole). The operand's out-of-bounds pairs are TMA's zeros.
          auto applyAll = [&](auto checked) {
#pragma unroll
            for (int m = 0; m < MI; ++m)
#pragma unroll
              for (int j = 0; j < BN / 8; j += 2) {
                unsigned s[4] = {0, 0, 0, 0};
                if constexpr (kPre)
                  ldsm4(quadAt(m, j) + after, s);
                if constexpr (kPre && Epilogue::kAddStaged) {
                  // The rest of the epilogue in f32, rounded, then the operand added in pairs
                  // (0.3-0.6% faster gemm_residual than adding it in f32, session 19). Pairs
                  // outside the problem keep their accumulators (TMA clips their stores).
                  unsigned o[4];
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    const int jj = j + i / 2, h = i % 2;
                    const float2 acc = make_float2(d[m][4 * jj + 2 * h], d[m][4 * jj + 2 * h + 1]);
                    o[i] = pairBits(acc.x, acc.y);
                    if (!decltype(checked)::value ||
                        (rowBase + m * 64 + 8 * h < M && colBase + 8 * jj < N)) {
                      const float2 r = epi.head(acc, rowBase + m * 64 + 8 * h, colBase + 8 * jj, a,
                                                bitsPair(s[i]));
                      o[i] = addPairBits(pairBits(r.x, r.y), s[i]);
                    }
                  }
                  stsm4(quadAt(m, j), o[0], o[1], o[2], o[3]);
                } else {
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    const int jj = j + i / 2, h = i % 2;
                    if (!decltype(checked)::value ||
                        (rowBase + m * 64 + 8 * h < M && colBase + 8 * jj < N))
                      apply(m, jj, h, kPre ? bitsPair(s[i]) : make_float2(0.0f, 0.0f));
                  }
                  store(m, j);
                }
              }
          };
          if ((tm + 1) * BM <= M && (tn + 1) * BN <= N)
            applyAll(Flag<false>{});
          else
            applyAll(Flag<true>{});
        }
        if (handOff) {
          namedBarrierArrive(kReady, kHandOff);
          continue;
        }
        fenceProxyAsync();
        namedBarrier(1 + c, 128);
        if (tid == 0 && tm < tilesM) {
          // 64 x 64 boxes: each consumer's rows of each 64-column box.
#pragma unroll
          for (int q = 0; q < BN / 64; ++q)
#pragma unroll
            for (int m = 0; m < MI; ++m)
              tmaStore2d(&p.d, tileC + q * (BM * 128) + (row0 + 64 * m) * 128, tn * BN + 64 * q,
                         tm * BM + row0 + 64 * m);
          bulkCommit();
        }
        continue;
      }
      // Tiles inside the problem (all of them but the last row and column of tiles) run the
      // epilogue on column pairs (its operands load as 4-byte pairs) and store without bounds
      // checks; edge tiles check every element.
      const bool inside = (tm + 1) * BM <= M && (tn + 1) * BN <= N && pairs;
#pragma unroll
      for (int m = 0; m < MI; ++m) {
        const int64_t rowBase =
            static_cast<int64_t>(tm) * BM + row0 + m * 64 + warp * 16 + lane / 4;
        const int64_t colBase = static_cast<int64_t>(tn) * BN + 2 * (lane % 4);
        if (inside) {
          // First the epilogue of every accumulator pair, then the stores: C may alias an
          // operand as far as the compiler knows, so interleaving them would order each
          // operand load after the previous store and expose its latency 2 * BN / 8 times.
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float2 r =
                  epi.pair(make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]),
                           rowBase + 8 * h, colBase + 8 * j, a, make_float2(0.0f, 0.0f));
              d[m][4 * j + 2 * h] = r.x;
              d[m][4 * j + 2 * h + 1] = r.y;
            }
          if constexpr (kStagedStore) {
            if (rows16B) {
              // Through the warp's shared-memory slab, 64 columns at a time: each thread
              // writes its pairs, then the warp stores whole 128-byte row segments.
              elem* slab = epiSlab[c * 4 + warp];
              const int64_t row0g = tm * BM + row0 + m * 64 + warp * 16;
#pragma unroll
              for (int q = 0; q < BN / 64; ++q) {
#pragma unroll
                for (int jj = 0; jj < 8; ++jj)
#pragma unroll
                  for (int h = 0; h < 2; ++h) {
                    const int j = 8 * q + jj;
                    *reinterpret_cast<elem2*>(slab + (lane / 4 + 8 * h) * kSlabPitch + 8 * jj +
                                              2 * (lane % 4)) =
                        fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
                  }
                __syncwarp();
#pragma unroll
                for (int pass = 0; pass < 4; ++pass) {
                  const int r = 4 * pass + lane / 8, chunk = lane % 8;
                  *reinterpret_cast<uint4*>(C + (row0g + r) * N + tn * BN + 64 * q + 8 * chunk) =
                      *reinterpret_cast<const uint4*>(slab + r * kSlabPitch + 8 * chunk);
                }
                __syncwarp();
              }
              continue;
            }
          }
#pragma unroll
          for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              *reinterpret_cast<elem2*>(C + (rowBase + 8 * h) * N + colBase + 8 * j) =
                  fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
          continue;
        }
        // Edge tiles: the epilogue of every element first, at coordinates clamped into the
        // problem (their loads are in bounds and branch-free, so they are all in flight at
        // once; results outside are dropped), then the checked stores. A check around each
        // element's epilogue ordered its operand loads after the previous element's store:
        // ping-pong gemm_residual ran 2x as long at 2047x5120x1024.
        const int64_t lastRow = M - 1, lastPair = pairs ? N - 2 : N - 1;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t row = min(rowBase + 8 * h, lastRow);
            const int64_t col = min(colBase + 8 * j, lastPair);
            float2 v = make_float2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
            if (pairs) {
              v = epi.pair(v, row, col, a, make_float2(0.0f, 0.0f));
            } else {
              v.x = epi(v.x, row, col, a);
              v.y = epi(v.y, row, min(col + 1, static_cast<int64_t>(N - 1)), a);
            }
            d[m][4 * j + 2 * h] = v.x;
            d[m][4 * j + 2 * h + 1] = v.y;
          }
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int64_t col = colBase + 8 * j;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t row = rowBase + 8 * h;
            if (row < M && col < N) {
              elem* out = C + row * N + col;
              if (pairs) {
                *reinterpret_cast<elem2*>(out) =
                    fromF2(d[m][4 * j + 2 * h], d[m][4 * j + 2 * h + 1]);
              } else {
                out[0] = fromF(d[m][4 * j + 2 * h]);
                if (col + 1 < N)
                  out[1] = fromF(d[m][4 * j + 2 * h + 1]);
              }
            }
          }
        }
      }
    }
    if constexpr (kTile) {
      if (tid == 0)
        bulkWait(); // the last tile's stores complete before the CTA leaves
    }
  }
  if constexpr (CL > 1)
    clusterSync(); // no CTA leaves while the peer may still write its stages or barriers
#else
  (void)p;
  __trap(); // compiled without sm_90a: the host never launches this
#endif
}

} // namespace fpat
