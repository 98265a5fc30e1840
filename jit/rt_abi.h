/* rt_abi.h -- the contract between generated code and the runtime: helper signatures and the
 * status codes a trace function returns. Plain C so it reads the same from both sides. */
#ifndef DYNAMO_RT_ABI_H
#define DYNAMO_RT_ABI_H
#include <stdint.h>

#define DYNAMO_RT_OK 0
#define DYNAMO_RT_INT_DIV_BY_ZERO 1  /* integer floor division by zero (ATen raises) */
#define DYNAMO_RT_EXTERN_FAILED 2    /* the extern call failed; message in the call context */
#define DYNAMO_RT_SIDE_EXIT 3        /* a guard (side exit) failed: exit id and live values in the context */
#define DYNAMO_RT_INDEX_OUT_OF_RANGE 4  /* an index op's index is outside its dim (ATen raises IndexError) */

/* A fused kernel: computes indices [begin, end) of its outermost loop. */
typedef int32_t (*dynamo_rt_kernel_fn)(void **slots, int64_t begin, int64_t end);

#ifdef __cplusplus
extern "C" {
#endif
/* Runs kernel over [0, n) in chunks of at least grain, on the context's threads. */
int32_t dynamo_rt_parallel_for(void *ctx, dynamo_rt_kernel_fn kernel, void **slots, int64_t n,
                               int64_t grain);
/* Fills a kernel's slot table: table[i] = (char *)slots[desc[2i]] + desc[2i + 1], i < n (a
 * scalar input's slot holds its 8 bytes, with offset 0); desc[2i] == -1 stores the number
 * desc[2i + 1] itself (a size the kernel reads, lower_cpu.h size_params). */
void dynamo_rt_fill_table(void **table, void **slots, const int64_t *desc, int64_t n);
/* Runs extern step `index` of the current entry through LibTorch's dispatcher. */
int32_t dynamo_rt_extern(void *ctx, void **slots, int32_t index);
/* Code compiled with DYNAMO_PROFILE only: plan step `step` starts now (-1: the trace function
 * returns); the time since the previous mark is added to the previous step's total. */
void dynamo_rt_profile(void *ctx, int32_t step);
#ifdef __cplusplus
}
#endif
#endif
