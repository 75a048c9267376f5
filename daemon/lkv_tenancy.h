/*
 * lkv_tenancy.h: the daemon's live view of its tenants (DESIGN.md 6; issue 13): the current
 * tenant table (daemon/lkv_auth.h), swapped whole on reload; one stable slot per tenant name
 * with the per-tenant state the services index (wire keys, lookup counters, names); the
 * admission hook of the RPC engine (tokens, the plaintext rule, request rates); byte rates and
 * capacity quotas; and the per-tenant statistics in the registry.
 *
 * Slots. Slot 0 is the default tenant (anonymous loopback callers); each configured tenant gets
 * the next free slot the first time its name appears (at start or on a reload) and keeps it for
 * the life of the process, also when a reload removes and re-adds it, so the services' arrays
 * (indexed by slot, LKV_TENANCY_SLOTS entries, allocated once) never move and counters survive
 * reloads. lkv_tenant.t_slot carries the slot inside every tenant of every table.
 *
 * Reload (lkv_tenancy_reload, SIGHUP): a new table is built from the re-read config and
 * published with one atomic store; calls admitted before keep the tenant pointer of the table
 * they were admitted with (the old tables stay allocated until lkv_tenancy_destroy: a few KiB
 * per reload). What changes live: tokens, roles, new and removed tenants, quotas and rates,
 * loopback_roles, auth_key and allow_plaintext_tokens. What cannot, refused with a log line
 * naming it (the whole reload is refused then, nothing changes): a tenant's salt (its
 * documents are keyed with it), and enabling or disabling tenants altogether (the wire-key
 * isolation is chosen at start).
 *
 * Admission (lkv_tenancy_admit, the lkv_server_opts.admit hook, ctx = the tenancy):
 *   1. a call that carries a bearer token over a plaintext connection from a non-loopback peer
 *      is refused (UNAUTHENTICATED, saying why) unless allow_plaintext_tokens is set: the token
 *      would have crossed the network in clear text;
 *   2. the token and the method's role are checked (lkv_auth_check);
 *   3. the tenant's request rate (rate_calls, a token bucket holding one second's worth) is
 *      charged one call; when empty the call is refused with LKV_ERATE (RESOURCE_EXHAUSTED),
 *      a message naming the limit and the delay, and trailing metadata "retry-after-ms: N"
 *      (lkv_rpc_set_retry_after). Health calls are never rate limited.
 *
 * Capacity quotas (max_hot_bytes, max_cold_bytes, max_docs; the store's per-salt usage,
 * lkv_store_usage_get): checked before the store sees a Put (lkv_tenancy_check_put), so the
 * global eviction policy never evicts another tenant's documents for a tenant over its quota.
 * A put that would take the tenant over a quota first makes room among that tenant's own
 * documents, least recently used first (read by a Get or Attach, else created): over
 * max_hot_bytes it demotes them to the cold tier (persisted ones first, which costs no write);
 * over max_cold_bytes or max_docs it deletes them. Held documents (Admin Hold, Put hold) are
 * never among them. If it still cannot fit (the document alone is larger than the quota, or
 * the tenant's documents are all pinned, held or being written) it is refused with LKV_EQUOTA
 * (RESOURCE_EXHAUSTED), the message naming the quota, its value and the need. Hot usage counts
 * arena pages (n_blocks x page_bytes), cold usage block payload, in both durability modes
 * (write-back persists too). Known cost: this runs on the Put's polling thread; demoting a document
 * the writer has not persisted yet, and deleting from RocksDB, do I/O there (rare: persisted
 * documents are demoted first, and RocksDB deletes are unsynced).
 *
 * Thread safety: admit, the index and charge functions run on any thread; reload and destroy
 * on the main thread only.
 */
#ifndef LKV_TENANCY_H
#define LKV_TENANCY_H

#include <stdint.h>

#include "lkv_auth.h"
#include "lkv_cache_svc.h"
#include "lkv_config.h"
#include "lkv_server.h"
#include "lkv_stats.h"
#include "lkv_store.h"
#include "lkv_wirekey.h"

#define LKV_TENANCY_SLOTS (2 * LKV_CONFIG_MAX_TENANTS + 1)

typedef struct lkv_tenancy lkv_tenancy; /* Opaque. */

/* Builds the tenancy from a validated config c (borrowed for the call): the tenant table, the
 * slots, the wire-key secret (loaded from c->data_dir when tenants exist) and the per-tenant
 * stats in stats (borrowed until destroy; may be NULL). store (borrowed until destroy; may be
 * NULL: no capacity quotas) is used for the tenants' usage. *out is owned by the caller.
 * Returns 0, LKV_ECONFIG (err) for a bad table, LKV_EIO if the secret cannot be loaded. */
int lkv_tenancy_create(const lkv_config *c, lkv_stats *stats, lkv_store *store, lkv_tenancy **out,
                       char *err, size_t errlen);

/* Applies a re-read, validated config (see the file comment). Logs one line per change and
 * one per option that needs a restart (compared with the config given at create or the last
 * reload). Returns 0 (applied), or LKV_ECONFIG with err naming what cannot change live (then
 * nothing changed). Main thread only. */
int lkv_tenancy_reload(lkv_tenancy *t, const lkv_config *c, char *err, size_t errlen);

/* Counts a reload refused before it reached lkv_tenancy_reload (the config did not parse or
 * validate), for the reload statistics (lazykv_config_reloads_total{result="refused"},
 * lazykv_config_last_reload_successful). lkv_tenancy_reload counts its own outcomes. */
void lkv_tenancy_reload_refused(lkv_tenancy *t);

/* Frees everything (after the server stopped: no call may hold a tenant any more). NULL ok. */
void lkv_tenancy_destroy(lkv_tenancy *t);

/* The admission hook (lkv_admit_fn; ctx = the tenancy). */
int lkv_tenancy_admit(void *ctx, lkv_rpc *rpc);

/* Authenticates and authorises a request that needs the roles in need, by the admission rules
 * above minus the rates: authz is the request's Authorization value (NUL-terminated, borrowed)
 * or NULL when absent; loopback says the peer is on loopback; secure says the transport is TLS
 * (a token from a non-loopback peer over plain text is refused unless allow_plaintext_tokens).
 * Used by lkv_tenancy_admit and by transports other than gRPC (the metrics endpoint). Returns 0
 * with *out (may be NULL) set to the tenant (borrowed, valid until destroy), or LKV_EUNAUTH /
 * LKV_EPERM with err (never the token). Thread-safe. */
int lkv_tenancy_check(const lkv_tenancy *t, const char *authz, int loopback, int secure,
                      uint32_t need, const lkv_tenant **out, char *err, size_t errlen);

/* Wires the services: salt_of, index_of/index_ctx, n_tenants, wire, lookups, check_put of the
 * cache service, and the admin service's tenant fields. svc pointers borrowed. */
void lkv_tenancy_wire_cache(lkv_tenancy *t, lkv_cache_svc *cache);

/* The slot of a principal (a tenant of any of t's tables), 0 for NULL. */
int lkv_tenancy_index(const void *ctx, const void *principal);

/* The per-slot arrays (LKV_TENANCY_SLOTS entries, borrowed until destroy). Names are NULL for
 * unused slots; a reload may name new slots while other threads read: read only the first
 * lkv_tenancy_named(t) entries (an acquire load; the names below it never change). */
int lkv_tenancy_named(const void *t);
lkv_tenant_lookups *lkv_tenancy_lookups(lkv_tenancy *t);
const char **lkv_tenancy_names(lkv_tenancy *t);

/* 1 if tenants are isolated (configured at start). */
int lkv_tenancy_isolated(const lkv_tenancy *t);

/* Configured tenants in the current table. */
int lkv_tenancy_count(const lkv_tenancy *t);

/* The current tenant table (borrowed: valid until lkv_tenancy_destroy, also after later
 * reloads; a reload publishes a new one). */
const lkv_auth *lkv_tenancy_auth(const lkv_tenancy *t);

/* Charges n Put payload bytes to the caller's rate_bytes bucket. Returns 0, or LKV_ERATE with
 * the message and retry-after-ms set on rpc (return it from the callback). */
int lkv_tenancy_charge_bytes(void *ctx, lkv_rpc *rpc, uint64_t n);

/* Checks the caller's capacity quotas for a Put of tokens[0..n_tokens) of profile (borrowed),
 * making room among the tenant's own documents first (see the file comment). A document
 * already stored, an unknown profile or an empty token list pass (the store decides). Returns
 * 0, or LKV_EQUOTA with the message set on rpc. */
int lkv_tenancy_check_put(void *ctx, lkv_rpc *rpc, const char *profile, const uint32_t *tokens,
                          uint32_t n_tokens);

#endif
