/* The Lightrail NCCL endpoint's wire format: the one definition of the frames that the NCCL
 * profiler plugin (plugin.c) and the framework side (lightrail.agents.nccl.registration) send
 * to the host agent's NCCL socket, and that the agent (lightrail.agents.host.nccl_endpoint,
 * decoded by lightrail.agents.nccl.wire) answers. The Python codec mirrors this file; a test
 * checks the constants of both agree.
 *
 * Transport: a Unix stream socket (env LIGHTRAIL_NCCL_SOCKET, default /run/lightrail/nccl.sock).
 * The plugin opens ONE connection per process (at its first communicator); the framework side
 * opens one per REGISTER.
 *
 * Every frame: a 12-byte header, then `length` payload bytes. All integers little-endian,
 * no implicit padding (the pad fields are explicit and must be zero).
 *
 *   header   u32 magic (LR_MAGIC) | u16 version (LR_VERSION) | u16 type | u32 length
 *
 * Payloads, by type (-> to the agent, <- from the agent):
 *   -> INIT      u32 comm_id | u32 nranks | u32 rank | u32 pid | u64 comm_hash
 *                | u16 name_len | name (UTF-8, no NUL)                          (26 + name_len)
 *                comm_id: the plugin's own number of the communicator in this process
 *                (1, 2, ...); nranks/rank: NCCL's communicator size and rank in it. No answer.
 *   -> ENTER     u32 comm_id | u8 kind | u8[3] pad | u64 seq | u64 nbytes
 *                | u32 timeout_ms                                                        (28)
 *                The first call of a phase (a run of calls of one kind on one communicator).
 *                seq: the phase's number in this process (1, 2, ...). The agent answers ADMIT
 *                with the same seq; the plugin's enqueuing thread blocks until it arrives.
 *   -> RELEASE   u32 comm_id | u8 kind | u8[3] pad | u64 seq                             (16)
 *                The phase `seq` is over. No answer.
 *   -> FINI      u32 comm_id                                                              (4)
 *                The communicator was finalized (after the RELEASE of its held phase). No answer.
 *   -> REGISTER  u64 comm_hash | u32 rank | u32 nranks | u8 gated | u8 pad | u16 job_len
 *                | u16 name_len | u32 ranks[nranks] | job_id | comm_name  (22 + 4 nranks + ...)
 *                The framework side: the communicator named comm_name (or, with an empty name,
 *                the one whose NCCL comm hash is comm_hash) belongs to job job_id and its rank i
 *                is global rank ranks[i]; rank: the caller's global rank (one of ranks).
 *                gated 0: the communicator stays inside one host and is never gated.
 *                The agent answers REGISTERED.
 *   <- ADMIT     u64 seq | u32 status | u32 steps | u8 noop | u8 pad | u16 msg_len | message
 *                                                                           (20 + msg_len)
 *   <- REGISTERED u32 status | u16 msg_len | message                             (6 + msg_len)
 *
 * status: LR_OK, or why (LR_STATUS_*). LR_STATUS_UNGATED answers an ENTER of a communicator
 * that is registered as never gated, or that no registration names: the plugin stops gating
 * that communicator (it is not under Lightrail), which is not a refusal.
 * A frame the agent cannot decode closes the connection (the agent logs the field and value).
 */
#ifndef LIGHTRAIL_NCCL_WIRE_H_
#define LIGHTRAIL_NCCL_WIRE_H_

#define LR_MAGIC 0x434E524Cu /* the bytes "LRNC" */
#define LR_VERSION 1
#define LR_HEADER_BYTES 12
#define LR_MAX_PAYLOAD 65536
#define LR_MAX_NAME 1024

/* frame types */
#define LR_INIT 1
#define LR_ENTER 2
#define LR_RELEASE 3
#define LR_FINI 4
#define LR_REGISTER 5
#define LR_ADMIT 16
#define LR_REGISTERED 17

/* collective kinds (lightrail.controller.domain.model.Collective) */
#define LR_ALL_REDUCE 1
#define LR_REDUCE_SCATTER 2
#define LR_ALL_GATHER 3
#define LR_ALL_TO_ALL 4
#define LR_SEND_RECV 5
#define LR_BROADCAST 6

/* status (lightrail.controller.domain.errors.ErrorCode, plus the endpoint's own) */
#define LR_OK 0
#define LR_STATUS_DEADLINE_EXCEEDED 1
#define LR_STATUS_UNKNOWN_JOB 2
#define LR_STATUS_INVALID_RANK 3
#define LR_STATUS_INVALID_PHASE 4
#define LR_STATUS_RANK_BUSY 5
#define LR_STATUS_DEVICE_FAILURE 6
#define LR_STATUS_PLACEMENT_CHANGED 7
#define LR_STATUS_NOT_LEADER 8
#define LR_STATUS_CANCELLED 9
#define LR_STATUS_UNGATED 10
#define LR_STATUS_BAD_REQUEST 11
#define LR_STATUS_SWITCH_MAINTENANCE 12

#endif
