/*
 * lkv_status.h: the one two-way table between lazykv error codes (common/lkv_err.h) and gRPC
 * status codes, shared by the daemon's RPC edge (daemon/lkv_server.c) and the C client and CLI
 * (client/). No other file maps one to the other.
 *
 * The wire contract (proto/lazykv/v1/cache.proto, header comment): every failed call carries,
 * besides its gRPC status, the exact lazykv code in trailing metadata under the key
 * LKV_STATUS_MD_KEY ("lkv-code"), whose value is the code's symbolic name from lkv_err_name(),
 * e.g. "LKV_ENOSPC". A receiver maps (status, lkv-code) back with lkv_status_to_err: the
 * metadata gives the exact code; without it (an old daemon, a proxy, or gRPC core's own
 * refusals such as a message over a size limit) the status alone gives the code that stands
 * for its family (e.g. RESOURCE_EXHAUSTED -> LKV_ETOOBIG, since a lazykv daemon always names
 * its own budget refusals LKV_ENOSPC). Messages are for people and are never parsed.
 */
#ifndef LKV_STATUS_H
#define LKV_STATUS_H

#include <stddef.h>

/* Trailing-metadata key that carries the exact lazykv code of a failed call. */
#define LKV_STATUS_MD_KEY "lkv-code"

/* Returns the grpc_status_code (as int) that the RPC edge sends for rc: 0 (OK) for LKV_OK,
 * GRPC_STATUS_INTERNAL for a code outside lkv_err.h (e.g. an -errno). */
int lkv_status_from_err(int rc);

/* Maps a received status back to an LKV_* code.
 * @param[in] status  the grpc_status_code received.
 * @param[in] code    the received LKV_STATUS_MD_KEY value (borrowed, need not be
 *                    NUL-terminated), or NULL when the call carried none.
 * @param[in] len     bytes of code.
 * Returns 0 for OK (whatever code says). Otherwise the code named by `code` when it is a known
 * LKV_* name that lkv_status_from_err maps to `status` (a mismatch means someone between the
 * daemon and us rewrote the status: the status wins); else the family fallback of status.
 * Never returns 0 for a non-OK status. */
int lkv_status_to_err(int status, const char *code, size_t len);

/* Returns the LKV_STATUS_MD_KEY value to send for rc != 0: a static string, the name of rc
 * (lkv_err_name), or "LKV_EINTERNAL" for a code outside lkv_err.h (matching its status). */
const char *lkv_status_md_value(int rc);

/* Parses an LKV_STATUS_MD_KEY value (borrowed, len bytes, not NUL-terminated): returns the
 * LKV_E* code it names, or 0 if it names none (unknown name, number, empty, NULL). */
int lkv_status_parse_code(const char *code, size_t len);

/* Returns the static name of a grpc_status_code, e.g. "INVALID_ARGUMENT" ("UNKNOWN" if out of
 * range). */
const char *lkv_status_name(int status);

#endif
