/* The tuner side of libnccl-profiler-lightrail.so (NCCL_TUNER_PLUGIN=lightrail, through the
 * libnccl-tuner-lightrail.so link, or the .so's path): on a gated communicator that spans
 * hosts, all-reduce, reduce-scatter and all-gather run NCCL's Ring algorithm, the pattern
 * Lightrail's planner puts on the rails for these collectives (rings; a tree or CollNet needs
 * links the phase's circuits do not have). NCCL still picks the protocol among Ring's. Other
 * communicators and collectives keep NCCL's own choice.
 *
 * ABI: ncclTunerPlugin_v6 (NCCL 2.30) and _v5 (NCCL 2.28-2.29), as declared in NCCL 2.30.7's
 * src/include/plugin/tuner/tuner_v5.h and tuner_v6.h (written for Lightrail, not copied). v4 and
 * older do not pass the communicator's hash, so the tuner could not tell a gated communicator
 * from another: they are not exported.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "lightrail_nccl_comms.h"
#include "nccl_profiler_abi.h"

#define LR_EXPORT __attribute__((visibility("default")))

/* ncclFunc_t values (nccl_common.h) and algorithm indices (nccl_tuner.h) */
enum { LR_FUNC_ALL_GATHER = 2, LR_FUNC_REDUCE_SCATTER = 3, LR_FUNC_ALL_REDUCE = 4 };
enum { LR_ALGO_RING = 1 };
#define LR_ALGO_PROTO_IGNORE (-1.0f)

typedef struct {
  uint64_t hash;
  size_t nranks;
  size_t nnodes;
} lrTunerComm;

static lrNcclResult lr_tuner_init(void** context, uint64_t comm_id, size_t nranks, size_t nnodes,
                                  lrNcclLogger logfn, void* nvl_domain_info, void* constants) {
  (void)logfn;
  (void)nvl_domain_info;
  (void)constants;
  lrTunerComm* t = calloc(1, sizeof *t);
  if (t == NULL) return lrNcclSystemError;
  t->hash = comm_id;
  t->nranks = nranks;
  t->nnodes = nnodes;
  *context = t;
  return lrNcclSuccess;
}

static lrNcclResult lr_tuner_get_coll_info(void* context, int coll_type, size_t nbytes,
                                           int num_pipe_ops, float** cost_table, int num_algo,
                                           int num_proto, int reg_buff, int* n_channels) {
  (void)nbytes;
  (void)num_pipe_ops;
  (void)reg_buff;
  (void)n_channels;
  const lrTunerComm* t = (const lrTunerComm*)context;
  if (t == NULL || t->nnodes < 2 || num_algo <= LR_ALGO_RING) return lrNcclSuccess;
  if (coll_type != LR_FUNC_ALL_REDUCE && coll_type != LR_FUNC_REDUCE_SCATTER &&
      coll_type != LR_FUNC_ALL_GATHER)
    return lrNcclSuccess;
  if (!lr_comm_gated(t->hash)) return lrNcclSuccess;
  float* table = (float*)cost_table; /* [num_algo][num_proto], row-major */
  int ring_usable = 0;
  for (int p = 0; p < num_proto; p++) {
    if (table[LR_ALGO_RING * num_proto + p] != LR_ALGO_PROTO_IGNORE) ring_usable = 1;
  }
  if (!ring_usable) return lrNcclSuccess; /* NCCL cannot run Ring here: leave its choice */
  for (int a = 0; a < num_algo; a++) {
    if (a == LR_ALGO_RING) continue;
    for (int p = 0; p < num_proto; p++) table[a * num_proto + p] = LR_ALGO_PROTO_IGNORE;
  }
  return lrNcclSuccess;
}

static lrNcclResult lr_tuner_finalize(void* context) {
  free(context);
  return lrNcclSuccess;
}

typedef struct {
  const char* name;
  lrNcclResult (*init)(void** context, uint64_t comm_id, size_t nranks, size_t nnodes,
                       lrNcclLogger logfn, void* nvl_domain_info, void* constants);
  lrNcclResult (*getCollInfo)(void* context, int coll_type, size_t nbytes, int num_pipe_ops,
                              float** cost_table, int num_algo, int num_proto, int reg_buff,
                              int* n_channels);
  lrNcclResult (*finalize)(void* context);
  void* getChunkSize; /* v6 only: NULL, NCCL keeps its chunk size */
} lrTunerV6;

typedef struct {
  const char* name;
  lrNcclResult (*init)(void** context, uint64_t comm_id, size_t nranks, size_t nnodes,
                       lrNcclLogger logfn, void* nvl_domain_info, void* constants);
  lrNcclResult (*getCollInfo)(void* context, int coll_type, size_t nbytes, int num_pipe_ops,
                              float** cost_table, int num_algo, int num_proto, int reg_buff,
                              int* n_channels);
  lrNcclResult (*finalize)(void* context);
} lrTunerV5;

LR_EXPORT lrTunerV6 ncclTunerPlugin_v6 = {"Lightrail", lr_tuner_init, lr_tuner_get_coll_info,
                                          lr_tuner_finalize, NULL};
LR_EXPORT lrTunerV5 ncclTunerPlugin_v5 = {"Lightrail", lr_tuner_init, lr_tuner_get_coll_info,
                                          lr_tuner_finalize};
