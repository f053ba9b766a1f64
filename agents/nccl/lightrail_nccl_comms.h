/* What the profiler side of libnccl-profiler-lightrail.so tells its tuner side (tuner.c). */
#ifndef LIGHTRAIL_NCCL_COMMS_H_
#define LIGHTRAIL_NCCL_COMMS_H_

#include <stdint.h>

/* 1 when this process's communicator with NCCL comm hash `comm_hash` is gated (announced to a
 * host agent and not answered "not gated"), 0 otherwise (unknown, ungated, no agent). */
int lr_comm_gated(uint64_t comm_hash);

#endif
