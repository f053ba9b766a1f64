/* The part of NCCL's profiler plugin ABI this plugin uses, written for Lightrail from the
 * layouts of NCCL 2.30.7's src/include/plugin/nccl_profiler.h and profiler/profiler_v4.h,
 * profiler_v5.h, profiler_v6.h (NCCL's ABI versions: v4 = NCCL 2.27, v5 = 2.28, v6 = 2.29+).
 * Only the descriptor members read here are declared; their offsets are NCCL's (the union
 * starts after type, parentObj and rank in every version). NCCL's descriptors are larger:
 * nothing here allocates one, the plugin only reads through NCCL's pointer.
 */
#ifndef LIGHTRAIL_NCCL_PROFILER_ABI_H_
#define LIGHTRAIL_NCCL_PROFILER_ABI_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { lrNcclSuccess = 0, lrNcclSystemError = 2, lrNcclInternalError = 3,
               lrNcclInvalidArgument = 4 } lrNcclResult;

/* ncclDebugLogLevel / ncclDebugLogSubSys values used here */
enum { LR_NCCL_LOG_WARN = 2, LR_NCCL_LOG_INFO = 3 };
enum { LR_NCCL_INIT = 1, LR_NCCL_COLL = 2, LR_NCCL_P2P = 4, LR_NCCL_PROFILE = 16384 };

typedef void (*lrNcclLogger)(int level, unsigned long flags, const char* file, int line,
                             const char* fmt, ...);

/* event type bits (the activation mask and descriptor type) */
enum {
  LR_PROFILE_COLL = 1 << 1,      /* v4: collective task, at launch */
  LR_PROFILE_P2P = 1 << 2,       /* v4: point-to-point task, at launch */
  LR_PROFILE_COLL_API = 1 << 9,  /* v5+: ncclAllReduce() etc., on the calling thread */
  LR_PROFILE_P2P_API = 1 << 10,  /* v5+: ncclSend()/ncclRecv(), on the calling thread */
};

/* v5 and v6: the same prefix; v6 only adds union members (CE events, never enabled here) */
typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      int root;
      void* stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char* func;
      size_t count;
      const char* datatype;
      void* stream;
      bool graphCaptured;
    } p2pApi;
  };
} lrEventDescrV5;

typedef struct {
  uint8_t type;
  void* parentObj;
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func;
      const void* sendBuff;
      void* recvBuff;
      size_t count;
      int root;
      const char* datatype;
    } coll;
    struct {
      const char* func;
      void* buff;
      const char* datatype;
      size_t count;
      int peer;
    } p2p;
  };
} lrEventDescrV4;

typedef int lrEventState; /* ncclProfilerEventState_t: an enum (int) */

typedef struct {
  const char* name;
  lrNcclResult (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName,
                       int nNodes, int nranks, int rank, lrNcclLogger logfn);
  lrNcclResult (*startEvent)(void* context, void** eHandle, lrEventDescrV5* eDescr);
  lrNcclResult (*stopEvent)(void* eHandle);
  lrNcclResult (*recordEventState)(void* eHandle, lrEventState eState, void* eStateArgs);
  lrNcclResult (*finalize)(void* context);
} lrProfilerV5; /* ncclProfiler_v5_t and ncclProfiler_v6_t (same members and signatures) */

typedef struct {
  const char* name;
  lrNcclResult (*init)(void** context, int* eActivationMask, const char* commName,
                       uint64_t commHash, int nNodes, int nranks, int rank, lrNcclLogger logfn);
  lrNcclResult (*startEvent)(void* context, void** eHandle, lrEventDescrV4* eDescr);
  lrNcclResult (*stopEvent)(void* eHandle);
  lrNcclResult (*recordEventState)(void* eHandle, lrEventState eState, void* eStateArgs);
  lrNcclResult (*finalize)(void* context);
} lrProfilerV4; /* ncclProfiler_v4_t */

#endif
