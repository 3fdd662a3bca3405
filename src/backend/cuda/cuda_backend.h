/* cuda_backend.h — the CUDA backend's public entry points (plain C; the C side never sees a
 * template). Everything here exists only in builds with LM_HAVE_CUDA; callers guard their use
 * with #ifdef LM_HAVE_CUDA.
 *
 * The backend keeps weights device-resident (uploaded once by prepare_weight; MLX affine
 * codes stay packed, bf16 stays bf16), K/V caches and workspaces in device memory, and runs
 * every op of backend.h on one CUDA stream. Activations are f32 with LM_PRECISION_F32 (the
 * parity path) and bf16 with LM_PRECISION_FAST (fp32 accumulation everywhere).
 * Decode steps of up to 8 tokens are captured once as a CUDA graph (a plan keyed by the
 * issuer, the batch shape and every cache's signature) and replayed; see cuda_plan.c.
 * Thread-safety: one backend is used by one thread at a time. */
#ifndef LM_BACKEND_CUDA_BACKEND_H
#define LM_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices usable by this process (0 when there is no driver or no GPU). */
int lm_cuda_device_count(void);

/* Creates a CUDA backend on `device`. LM_ERR_DEVICE (with the call and file:line) when the
 * device cannot be used; LM_ERR_NOMEM with the sizes when its workspace does not fit. */
lm_status lm_backend_cuda_create(lm_precision prec, int device, lm_backend **out);

/* Device memory this backend holds, by purpose, in bytes. */
typedef struct lm_cuda_mem {
  int64_t weights;   /* prepared weights */
  int64_t kv;        /* K/V cache buffers (recognized at begin_step) */
  int64_t workspace; /* forward workspaces, step buffers and the backend's own scratch */
  int64_t free_bytes, total_bytes; /* the device's, from cudaMemGetInfo */
} lm_cuda_mem;
lm_status lm_cuda_mem_get(lm_backend *be, lm_cuda_mem *out);
/* One line: "device NAME: weights X MiB, KV Y MiB, workspace Z MiB; free F of T MiB". */
void lm_cuda_mem_report(lm_backend *be, char *buf, size_t n);

/* Plans (captured decode graphs): enable/disable (on by default) and counters. `uses` counts
 * steps that replayed a plan, `builds` captures made. */
void lm_cuda_set_plans(lm_backend *be, int on);
void lm_cuda_plan_stats(lm_backend *be, int64_t *uses, int64_t *builds);
/* Why the last capture was refused and its step ran eagerly ("" when none was). */
const char *lm_cuda_plan_error(lm_backend *be);

/* Measured device bandwidth in GB/s (1e9 bytes/s): a streaming read of a 2 GiB buffer
 * (bytes read) and a device-to-device copy (bytes read + written); medians of 7 passes.
 * 0 on failure (the message is set). */
double lm_cuda_read_bandwidth_gbs(lm_backend *be);
double lm_cuda_copy_bandwidth_gbs(lm_backend *be);

/* Environment, read once by lm_backend_cuda_create (a backend keeps what it read; later
 * changes to the environment reach only backends created after them):
 * LUMEN_CUDA_PROFILE=1 times every op on the device (steps run eagerly, one
 * synchronization per op) and prints the per-op totals to stderr when the backend is freed.
 * LUMEN_CUDA_PROFILE_STEP=k opens the profiler range (cudaProfilerStart/Stop) around the k-th
 * decode step of the backend (one token per sequence) only, so `ncu --profile-from-start off` times
 * one real, graph-replayed step (tools/gpu/profile.sh). For side-by-side runs:
 * LUMEN_CUDA_GEMV=cores keeps 4-bit decode products on the CUDA-core GEMV instead of the
 * tensor-core one; LUMEN_CUDA_PDL=0 launches kernels without programmatic dependent launch;
 * LUMEN_CUDA_UNFUSE, a list of names, takes fused forms apart: glu_pair runs an MLP's gate and up
 * projections as two launches and a GeGLU instead of one launch, q_norm runs the q norm as its own
 * kernel before the decode attention instead of inside it. */

#ifdef __cplusplus
}
#endif

#endif
