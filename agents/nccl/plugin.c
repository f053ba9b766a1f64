/* libnccl-profiler-lightrail.so: NCCL's profiler plugin API used as a phase gate.
 *
 * NCCL loads it with NCCL_PROFILER_PLUGIN=lightrail (or the .so's path) and calls it for every
 * communicator. The plugin turns runs of calls into Lightrail phases (DESIGN.md "Phase
 * protocol") and asks the host agent for admission over the Unix socket LIGHTRAIL_NCCL_SOCKET
 * (default /run/lightrail/nccl.sock), in the frames of lightrail_nccl_wire.h:
 *
 * - A phase is a run of consecutive calls of one kind (all_reduce, send_recv, ...) on one
 *   communicator, in this process (one rank per process, as torchrun runs jobs). The first call
 *   of a run sends ENTER and blocks the calling thread until the agent answers ADMIT; the next
 *   call of another kind or on another communicator first sends RELEASE (fire and forget);
 *   finalizing the communicator releases its held phase.
 * - Where: ABI v5/v6 (NCCL 2.28+) gates at the collective / point-to-point API events
 *   (ncclAllReduce(), ncclSend()... on the enqueuing thread, before the work is queued); v4
 *   (NCCL 2.27) has only task events, which NCCL starts at launch (ncclGroupEnd, or the call's
 *   implicit group): there the wait holds the launch. Calls captured into a CUDA graph are not
 *   gated (a replay never reaches the plugin).
 * - Refusal (timeout, device failure, placement changed, agent gone): the plugin logs a WARN
 *   through NCCL's logger; then, with LIGHTRAIL_NCCL_ON_REFUSAL=exit (the default) it ends the
 *   process with status 1, so that torchrun's elastic agent restarts the job from its
 *   checkpoint (the torch gate raises from the call; NCCL ignores a profiler's return value,
 *   so an error code would let the call go ahead silently); with =continue the call goes
 *   ahead ungated and the error is only logged (startEvent returns ncclSuccess either way).
 * - No agent socket at the first communicator's init: the plugin disables itself for the
 *   process with one log line and never touches the job again.
 *
 * Written for Lightrail; the ABI it implements is declared in nccl_profiler_abi.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "lightrail_nccl_comms.h"
#include "lightrail_nccl_wire.h"
#include "nccl_profiler_abi.h"

#define LR_EXPORT __attribute__((visibility("default")))
#define LR_DEFAULT_SOCKET "/run/lightrail/nccl.sock"
#define LR_DEFAULT_TIMEOUT_S 60.0
#define LR_REPLY_GRACE_S 30.0 /* the agent answers every ENTER within its timeout */

typedef struct lrComm {
  struct lrComm* next; /* g_comms */
  uint32_t id;
  int gated;  /* 0: never gated (no agent, or the agent said UNGATED) */
  int announced; /* INIT sent */
  uint64_t hash;
  int nranks;
  int rank;
  char name[LR_MAX_NAME + 1];
} lrComm;

enum { LR_UNTRIED = 0, LR_CONNECTED = 1, LR_DISABLED = 2, LR_LOST = 3 };
/* LR_DISABLED: no agent at the first init, nothing is gated. LR_LOST: the agent went away
 * after gating began; every later phase is a refusal (exit, or ungated with continue). */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_state = LR_UNTRIED;
static int g_fd = -1;
static int g_open_comms;
static uint32_t g_next_comm_id;
static uint64_t g_seq;
static lrComm* g_comms; /* every communicator not yet finalized */
static lrComm* g_cur;   /* the communicator whose phase this process holds, or NULL */
static int g_cur_kind;
static uint64_t g_cur_seq;
static uint32_t g_timeout_ms;
static int g_exit_on_refusal = 1;
static lrNcclLogger g_log;

static void lr_log(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void lr_log(int level, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g_log != NULL) {
    g_log(level, LR_NCCL_INIT | LR_NCCL_PROFILE, __FILE__, __LINE__, "%s", buf);
  } else {
    fprintf(stderr, "NCCL %s lightrail: %s\n", level == LR_NCCL_LOG_WARN ? "WARN" : "INFO", buf);
  }
}

/* --- little-endian encoding ------------------------------------------------------------- */

static uint8_t* put16(uint8_t* p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  return p + 2;
}
static uint8_t* put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 4;
}
static uint8_t* put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
  return p + 8;
}
static uint16_t get16(const uint8_t* p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t* p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t get64(const uint8_t* p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

static uint8_t* put_header(uint8_t* p, uint16_t type, uint32_t length) {
  p = put32(p, LR_MAGIC);
  p = put16(p, LR_VERSION);
  p = put16(p, type);
  return put32(p, length);
}

/* --- the connection (g_mu held) ---------------------------------------------------------- */

static int write_all(const uint8_t* buf, size_t n) {
  while (n > 0) {
    ssize_t k = send(g_fd, buf, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    buf += k;
    n -= (size_t)k;
  }
  return 0;
}

static int read_all(uint8_t* buf, size_t n) {
  while (n > 0) {
    ssize_t k = recv(g_fd, buf, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) errno = ECONNRESET;
    if (k <= 0) return -1;
    buf += k;
    n -= (size_t)k;
  }
  return 0;
}

static void read_config(void) {
  const char* t = getenv("LIGHTRAIL_TIMEOUT_S");
  double timeout_s = LR_DEFAULT_TIMEOUT_S;
  if (t != NULL && *t != '\0') {
    char* end = NULL;
    double v = strtod(t, &end);
    if (end == t || *end != '\0' || !(v > 0.0) || v > 86400.0) {
      lr_log(LR_NCCL_LOG_WARN, "LIGHTRAIL_TIMEOUT_S=%s is not a number of seconds in (0, 86400]; "
             "using %.0f", t, LR_DEFAULT_TIMEOUT_S);
    } else {
      timeout_s = v;
    }
  }
  g_timeout_ms = (uint32_t)(timeout_s * 1000.0);
  const char* r = getenv("LIGHTRAIL_NCCL_ON_REFUSAL");
  if (r == NULL || *r == '\0' || strcmp(r, "exit") == 0) {
    g_exit_on_refusal = 1;
  } else if (strcmp(r, "continue") == 0) {
    g_exit_on_refusal = 0;
  } else {
    lr_log(LR_NCCL_LOG_WARN, "LIGHTRAIL_NCCL_ON_REFUSAL=%s is neither exit nor continue; using exit",
           r);
    g_exit_on_refusal = 1;
  }
}

static void try_connect(void) {
  read_config();
  const char* path = getenv("LIGHTRAIL_NCCL_SOCKET");
  if (path == NULL || *path == '\0') path = LR_DEFAULT_SOCKET;
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof addr);
  addr.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof addr.sun_path) {
    lr_log(LR_NCCL_LOG_WARN, "LIGHTRAIL_NCCL_SOCKET=%s is longer than %zu bytes; phase gating off",
           path, sizeof addr.sun_path - 1);
    g_state = LR_DISABLED;
    return;
  }
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&addr, sizeof addr) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    lr_log(LR_NCCL_LOG_INFO, "no host agent at %s (%s); phase gating off for this process", path,
           strerror(err));
    g_state = LR_DISABLED;
    return;
  }
  double wait_s = g_timeout_ms / 1000.0 + LR_REPLY_GRACE_S;
  struct timeval tv = {.tv_sec = (time_t)wait_s, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  g_fd = fd;
  g_state = LR_CONNECTED;
  lr_log(LR_NCCL_LOG_INFO, "phase gate connected to %s (timeout %.3f s, on refusal: %s)", path,
         g_timeout_ms / 1000.0, g_exit_on_refusal ? "exit" : "continue");
}

static void disconnect(void) {
  if (g_fd >= 0) close(g_fd);
  g_fd = -1;
  g_cur = NULL;
}

/* The agent is gone or answered nonsense: nothing can be admitted any more. */
static void lost(const char* what) {
  int err = errno;
  lr_log(LR_NCCL_LOG_WARN, "host agent connection lost (%s: %s)", what, strerror(err));
  disconnect();
  g_state = LR_LOST;
}

static void refused(const lrComm* c, const char* kind, const char* why) {
  lr_log(LR_NCCL_LOG_WARN, "phase %s on communicator %s (rank %d of %d) not admitted: %s%s",
         kind, c->name[0] ? c->name : "(unnamed)", c->rank, c->nranks, why,
         g_exit_on_refusal ? "; exiting (LIGHTRAIL_NCCL_ON_REFUSAL=exit)"
                           : "; the call goes ahead ungated (LIGHTRAIL_NCCL_ON_REFUSAL=continue)");
  if (g_exit_on_refusal) {
    fflush(NULL);
    _exit(1);
  }
}

static int send_init(lrComm* c) {
  size_t name_len = strlen(c->name);
  uint8_t buf[LR_HEADER_BYTES + 26 + LR_MAX_NAME];
  uint8_t* p = put_header(buf, LR_INIT, (uint32_t)(26 + name_len));
  p = put32(p, c->id);
  p = put32(p, (uint32_t)c->nranks);
  p = put32(p, (uint32_t)c->rank);
  p = put32(p, (uint32_t)getpid());
  p = put64(p, c->hash);
  p = put16(p, (uint16_t)name_len);
  memcpy(p, c->name, name_len);
  p += name_len;
  return write_all(buf, (size_t)(p - buf));
}

static void release_current(void) {
  if (g_cur == NULL) return;
  uint8_t buf[LR_HEADER_BYTES + 16];
  uint8_t* p = put_header(buf, LR_RELEASE, 16);
  p = put32(p, g_cur->id);
  *p++ = (uint8_t)g_cur_kind;
  *p++ = 0;
  *p++ = 0;
  *p++ = 0;
  put64(p, g_cur_seq);
  g_cur = NULL;
  if (write_all(buf, sizeof buf) != 0) lost("sending RELEASE");
}

static const char* kind_name(int kind) {
  switch (kind) {
    case LR_ALL_REDUCE: return "all_reduce";
    case LR_REDUCE_SCATTER: return "reduce_scatter";
    case LR_ALL_GATHER: return "all_gather";
    case LR_ALL_TO_ALL: return "all_to_all";
    case LR_SEND_RECV: return "send_recv";
    case LR_BROADCAST: return "broadcast";
    default: return "?";
  }
}

static const char* status_name(uint32_t status) {
  switch (status) {
    case LR_STATUS_DEADLINE_EXCEEDED: return "deadline_exceeded";
    case LR_STATUS_UNKNOWN_JOB: return "unknown_job";
    case LR_STATUS_INVALID_RANK: return "invalid_rank";
    case LR_STATUS_INVALID_PHASE: return "invalid_phase";
    case LR_STATUS_RANK_BUSY: return "rank_busy";
    case LR_STATUS_DEVICE_FAILURE: return "device_failure";
    case LR_STATUS_PLACEMENT_CHANGED: return "placement_changed";
    case LR_STATUS_NOT_LEADER: return "not_leader";
    case LR_STATUS_CANCELLED: return "cancelled";
    case LR_STATUS_BAD_REQUEST: return "bad_request";
    case LR_STATUS_SWITCH_MAINTENANCE: return "switch_maintenance";
    default: return "unknown_status";
  }
}

/* ENTER and wait for ADMIT. g_mu held; g_state is LR_CONNECTED. */
static void enter(lrComm* c, int kind, uint64_t nbytes) {
  uint64_t seq = ++g_seq;
  uint8_t buf[LR_HEADER_BYTES + 28];
  uint8_t* p = put_header(buf, LR_ENTER, 28);
  p = put32(p, c->id);
  *p++ = (uint8_t)kind;
  *p++ = 0;
  *p++ = 0;
  *p++ = 0;
  p = put64(p, seq);
  p = put64(p, nbytes);
  put32(p, g_timeout_ms);
  if (write_all(buf, sizeof buf) != 0) {
    lost("sending ENTER");
    refused(c, kind_name(kind), "the host agent is gone");
    return;
  }
  uint8_t head[LR_HEADER_BYTES];
  if (read_all(head, sizeof head) != 0) {
    lost("waiting for ADMIT");
    refused(c, kind_name(kind), "no answer from the host agent");
    return;
  }
  uint32_t length = get32(head + 8);
  if (get32(head) != LR_MAGIC || get16(head + 4) != LR_VERSION || get16(head + 6) != LR_ADMIT ||
      length < 20 || length > LR_MAX_PAYLOAD) {
    errno = EPROTO;
    lost("the agent's answer is not an ADMIT frame");
    refused(c, kind_name(kind), "bad answer from the host agent");
    return;
  }
  static uint8_t body[LR_MAX_PAYLOAD];
  if (read_all(body, length) != 0) {
    lost("reading ADMIT");
    refused(c, kind_name(kind), "no answer from the host agent");
    return;
  }
  uint64_t got_seq = get64(body);
  uint32_t status = get32(body + 8);
  uint16_t msg_len = get16(body + 18);
  if (got_seq != seq || (size_t)20 + msg_len > length) {
    errno = EPROTO;
    lost("ADMIT for another phase");
    refused(c, kind_name(kind), "bad answer from the host agent");
    return;
  }
  if (status == LR_OK) {
    g_cur = c;
    g_cur_kind = kind;
    g_cur_seq = seq;
    return;
  }
  char why[512];
  snprintf(why, sizeof why, "%s: %.*s", status_name(status), (int)msg_len, (const char*)body + 20);
  if (status == LR_STATUS_UNGATED) {
    c->gated = 0;
    lr_log(LR_NCCL_LOG_INFO, "communicator %s (hash %016llx) is not gated: %.*s",
           c->name[0] ? c->name : "(unnamed)", (unsigned long long)c->hash, (int)msg_len,
           (const char*)body + 20);
    return;
  }
  refused(c, kind_name(kind), why);
}

/* One call of `kind` moving `nbytes` on communicator `c`, from the enqueuing thread. */
static void gate(lrComm* c, int kind, uint64_t nbytes) {
  pthread_mutex_lock(&g_mu);
  if (c->gated && !(g_cur == c && g_cur_kind == kind)) {
    if (g_state == LR_CONNECTED) release_current();
    if (g_state == LR_CONNECTED) {
      enter(c, kind, nbytes);
    } else if (g_state == LR_LOST && g_exit_on_refusal) {
      refused(c, kind_name(kind), "the host agent connection was lost");
    } /* LR_LOST with continue: said once, in lost() */
  }
  pthread_mutex_unlock(&g_mu);
}

int lr_comm_gated(uint64_t comm_hash) {
  int gated = 0;
  pthread_mutex_lock(&g_mu);
  for (const lrComm* c = g_comms; c != NULL; c = c->next) {
    if (c->hash == comm_hash) gated = c->gated && (g_state == LR_CONNECTED);
  }
  pthread_mutex_unlock(&g_mu);
  return gated;
}

/* --- NCCL names -------------------------------------------------------------------------- */

/* The Lightrail collective of an NCCL function name (ncclFuncToString), 0: not gated. */
static int kind_of(const char* func) {
  if (func == NULL) return 0;
  if (strcmp(func, "AllReduce") == 0 || strcmp(func, "Reduce") == 0) return LR_ALL_REDUCE;
  if (strcmp(func, "ReduceScatter") == 0) return LR_REDUCE_SCATTER;
  if (strcmp(func, "AllGather") == 0) return LR_ALL_GATHER;
  if (strcmp(func, "AlltoAll") == 0 || strcmp(func, "Gather") == 0 ||
      strcmp(func, "Scatter") == 0)
    return LR_ALL_TO_ALL;
  if (strcmp(func, "Send") == 0 || strcmp(func, "Recv") == 0 || strcmp(func, "SendRecv") == 0)
    return LR_SEND_RECV;
  if (strcmp(func, "Broadcast") == 0) return LR_BROADCAST;
  return 0;
}

/* Bytes per element of an NCCL datatype name (ncclDatatypeToString), 0: unknown. */
static uint64_t dtype_bytes(const char* dt) {
  if (dt == NULL) return 0;
  if (strcmp(dt, "ncclInt8") == 0 || strcmp(dt, "ncclUint8") == 0 ||
      strcmp(dt, "ncclFloat8e4m3") == 0 || strcmp(dt, "ncclFloat8e5m2") == 0)
    return 1;
  if (strcmp(dt, "ncclFloat16") == 0 || strcmp(dt, "ncclBfloat16") == 0) return 2;
  if (strcmp(dt, "ncclInt32") == 0 || strcmp(dt, "ncclUint32") == 0 ||
      strcmp(dt, "ncclFloat32") == 0)
    return 4;
  if (strcmp(dt, "ncclInt64") == 0 || strcmp(dt, "ncclUint64") == 0 ||
      strcmp(dt, "ncclFloat64") == 0)
    return 8;
  return 0;
}

static void on_call(void* context, const char* func, size_t count, const char* datatype) {
  lrComm* c = (lrComm*)context;
  if (c == NULL || !c->gated) return;
  int kind = kind_of(func);
  if (kind == 0) return;
  gate(c, kind, (uint64_t)count * dtype_bytes(datatype));
}

/* --- the plugin API ---------------------------------------------------------------------- */

static lrNcclResult lr_init(void** context, uint64_t comm_hash, int* mask, int wanted,
                            const char* comm_name, int nranks, int rank, lrNcclLogger logfn) {
  lrComm* c = calloc(1, sizeof *c);
  if (c == NULL) return lrNcclSystemError;
  pthread_mutex_lock(&g_mu);
  if (g_log == NULL) g_log = logfn;
  if (g_state == LR_UNTRIED) try_connect();
  c->id = ++g_next_comm_id;
  c->hash = comm_hash;
  c->nranks = nranks;
  c->rank = rank;
  if (comm_name != NULL) snprintf(c->name, sizeof c->name, "%s", comm_name);
  if (g_state == LR_CONNECTED) {
    if (send_init(c) == 0) {
      c->announced = 1;
    } else {
      lost("sending INIT");
    }
  }
  if (g_state == LR_CONNECTED || g_state == LR_LOST) {
    c->gated = 1; /* LR_LOST: its phases are refusals */
    *mask |= wanted;
  }
  g_open_comms++;
  c->next = g_comms;
  g_comms = c;
  pthread_mutex_unlock(&g_mu);
  *context = c;
  return lrNcclSuccess;
}

static lrNcclResult lr_init_v5(void** context, uint64_t comm_id, int* mask, const char* comm_name,
                               int n_nodes, int nranks, int rank, lrNcclLogger logfn) {
  (void)n_nodes;
  return lr_init(context, comm_id, mask, LR_PROFILE_COLL_API | LR_PROFILE_P2P_API, comm_name,
                 nranks, rank, logfn);
}

static lrNcclResult lr_init_v4(void** context, int* mask, const char* comm_name,
                               uint64_t comm_hash, int n_nodes, int nranks, int rank,
                               lrNcclLogger logfn) {
  (void)n_nodes;
  return lr_init(context, comm_hash, mask, LR_PROFILE_COLL | LR_PROFILE_P2P, comm_name, nranks,
                 rank, logfn);
}

static lrNcclResult lr_start_v5(void* context, void** handle, lrEventDescrV5* d) {
  *handle = NULL; /* no stop or child events are needed */
  if (d->type == LR_PROFILE_COLL_API) {
    if (!d->collApi.graphCaptured)
      on_call(context, d->collApi.func, d->collApi.count, d->collApi.datatype);
  } else if (d->type == LR_PROFILE_P2P_API) {
    if (!d->p2pApi.graphCaptured)
      on_call(context, d->p2pApi.func, d->p2pApi.count, d->p2pApi.datatype);
  }
  return lrNcclSuccess;
}

static lrNcclResult lr_start_v4(void* context, void** handle, lrEventDescrV4* d) {
  *handle = NULL;
  if (d->type == LR_PROFILE_COLL) {
    on_call(context, d->coll.func, d->coll.count, d->coll.datatype);
  } else if (d->type == LR_PROFILE_P2P) {
    on_call(context, d->p2p.func, d->p2p.count, d->p2p.datatype);
  }
  return lrNcclSuccess;
}

static lrNcclResult lr_stop(void* handle) {
  (void)handle;
  return lrNcclSuccess;
}

static lrNcclResult lr_record(void* handle, lrEventState state, void* args) {
  (void)handle;
  (void)state;
  (void)args;
  return lrNcclSuccess;
}

static lrNcclResult lr_finalize(void* context) {
  lrComm* c = (lrComm*)context;
  if (c == NULL) return lrNcclSuccess;
  pthread_mutex_lock(&g_mu);
  if (g_cur == c) release_current();
  for (lrComm** p = &g_comms; *p != NULL; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  if (g_state == LR_CONNECTED && c->announced) {
    uint8_t buf[LR_HEADER_BYTES + 4];
    put32(put_header(buf, LR_FINI, 4), c->id);
    if (write_all(buf, sizeof buf) != 0) lost("sending FINI");
  }
  if (--g_open_comms == 0 && (g_state == LR_CONNECTED || g_state == LR_LOST)) {
    disconnect(); /* the next communicator connects again */
    g_state = LR_UNTRIED;
  }
  pthread_mutex_unlock(&g_mu);
  free(c);
  return lrNcclSuccess;
}

LR_EXPORT lrProfilerV5 ncclProfiler_v6 = {"Lightrail", lr_init_v5, lr_start_v5, lr_stop,
                                          lr_record, lr_finalize};
LR_EXPORT lrProfilerV5 ncclProfiler_v5 = {"Lightrail", lr_init_v5, lr_start_v5, lr_stop,
                                          lr_record, lr_finalize};
LR_EXPORT lrProfilerV4 ncclProfiler_v4 = {"Lightrail", lr_init_v4, lr_start_v4, lr_stop,
                                          lr_record, lr_finalize};
