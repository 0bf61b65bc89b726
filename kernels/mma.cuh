// Warp-level PTX wrappers shared by the attention kernels: the bf16 and f16 tensor-core
// products (mma.sync m16n8k16, fp32 accumulation), their fragment loads from shared memory
// (ldmatrix) and transpose (movmatrix), and the 16-byte global -> shared copies that feed them
// (cp.async, grouped). Fragment layouts: PTX ISA, "Matrix Fragments for mma.m16n8k16".
// Header-only, device code (sm_80 and up); include from .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvfleet::kernels {

// d += a b: a is the row-major 16x16 A fragment, (b0, b1) the col-major 16x8 B fragment.
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The same on f16 operands (the fp8 decode kernel widens e4m3 to f16).
__device__ __forceinline__ void MmaF16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The transpose of an 8x8 b16 matrix held in the fragment layout (lane t: row t / 4, elements
// 2 (t % 4) and 2 (t % 4) + 1): a C fragment's rows become a B fragment's columns.
__device__ __forceinline__ uint32_t MovTrans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// Four 8x8 b16 matrices, row-major in shared memory, lanes 8j..8j+7 addressing the rows of
// matrix j: lane t receives row t / 4, elements 2 (t % 4) and 2 (t % 4) + 1 of each. With
// rows as tokens (n) and columns as head dims (k), that is the col-major B fragment.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// The same, transposed: lane t receives rows 2 (t % 4) and 2 (t % 4) + 1 of column t / 4.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Two floats as the bf16 pair of one A-fragment register (lo in the low half).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two floats as an f16 pair (lo in the low half).
__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Copies 16 bytes global -> shared without registers; zero-fills when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

// Closes the group of the cp.async copies issued since the last commit.
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kN committed groups are still in flight (this thread's copies only:
// a barrier must follow before other threads read them).
template <int kN>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN));
}

}  // namespace kvfleet::kernels
