/*
 * lkv_client.h: the lazykv C client library (lazykv.v1.Cache incl. Attach/Release, lazykv.v1.Admin
 * Stats/List/Evict/Hold/EvictClass, grpc.health.v1).
 *
 * A client handle (lkv_client_t) owns one gRPC channel to one lazykvd. The handle is
 * thread-safe: any number of threads may make calls on it at once; each call uses its own
 * completion queue (pluck), so calls never wait for one another. Every call is blocking and
 * has a deadline: deadline_ms > 0 is used as given, 0 means the handle's default.
 *
 * Errors: every function returns 0 or a negative LKV_E* code (common/lkv_err.h). A failed call
 * returns the daemon's exact code, which it sends as "lkv-code" trailing metadata (see
 * proto/lkv_status.h and cache.proto); a status without it (an old daemon, a proxy, gRPC core's
 * own refusals) maps to its family's code through the same table (proto/lkv_status.c), e.g.
 * RESOURCE_EXHAUSTED -> LKV_ETOOBIG (gRPC core's message-size limit), UNAVAILABLE ->
 * LKV_EUNAVAIL (unreachable). Messages are never parsed.
 *
 * Errors found locally: LKV_EINVAL (bad arguments), LKV_ETOOBIG (a message over the handle's
 * max_message_bytes), LKV_EPROTO / LKV_ECORRUPT (a malformed reply or an inconsistent Get
 * stream), LKV_ECANCELLED (the caller stopped a Get).
 *
 * After a failed call, lkv_client_last_error() returns the server's status message (or a
 * local message for errors found before anything was sent) and lkv_client_last_status() the
 * gRPC status code; both are per thread and describe the last failed call made by this thread
 * on any handle. A successful call clears them.
 *
 * Wire semantics (block layout, key derivation, durability) are in proto/lazykv/v1/cache.proto;
 * this library passes blocks through unchanged and does not validate indices or sizes, so that
 * the daemon's checks can be exercised; the daemon refuses bad input and changes nothing.
 */
#ifndef LKV_CLIENT_H
#define LKV_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define LKV_KEY_BYTES                  32
#define LKV_CLIENT_DEFAULT_DEADLINE_MS 30000
#define LKV_CLIENT_DEFAULT_MAX_MESSAGE (64u << 20)

typedef struct lkv_client lkv_client_t; /* Opaque, thread-safe. */
typedef struct lkv_put lkv_put_t;       /* Opaque, one Put stream; one thread at a time. */
typedef struct lkv_get lkv_get_t;       /* Opaque, one Get stream; one thread at a time. */

/* Options of lkv_client_create. Zero-initialise, then set what you need. */
typedef struct lkv_client_options {
    size_t max_message_bytes; /* Max message sent and received; 0: 64 MiB. */
    int default_deadline_ms;  /* Deadline of calls made with deadline_ms 0; 0: 30000. */
    const char *bearer_token; /* Sent as "authorization: Bearer <token>"; NULL: none. Copied. */
    int own_connection;       /* 1: this handle opens its own connection; 0: handles of one
                               * process with the same target and options share one (gRPC's
                               * global subchannel pool). */
    /* TLS (all paths borrowed during create; the files are read there). tls_ca_file set: the
     * channel uses TLS and verifies the daemon's certificate against it. tls_cert_file and
     * tls_key_file (both or neither, only with tls_ca_file): the client certificate presented
     * to a daemon that requires one (tls_client_ca_file). tls_server_name: the name checked
     * against the daemon's certificate instead of the target's host (e.g. when connecting by
     * IP to a certificate issued for a DNS name); NULL: the target's host. */
    const char *tls_ca_file;
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_server_name;
} lkv_client_options;

/* Names a document: by key (key != NULL, 32 bytes) or by content (key == NULL: profile and
 * tokens). All pointers are borrowed for the duration of the call. */
typedef struct lkv_docref {
    const uint8_t *key;     /* LKV_KEY_BYTES bytes, or NULL to name by profile + tokens. */
    const char *profile;    /* Profile name (when key is NULL). */
    const uint32_t *tokens; /* n_tokens token ids (when key is NULL). */
    size_t n_tokens;        /* Number of token ids. */
} lkv_docref;

/* Values of lkv_put_reply.durability (the proto's Durability enum). */
enum lkv_wire_durability {
    LKV_WIRE_DURABILITY_UNSPECIFIED = 0,
    LKV_WIRE_DURABILITY_HOT = 1,
    LKV_WIRE_DURABILITY_DURABLE = 2,
};

/* Values of tier fields (the proto's Tier enum). */
enum lkv_wire_tier {
    LKV_WIRE_TIER_UNSPECIFIED = 0,
    LKV_WIRE_TIER_HOT = 1,
    LKV_WIRE_TIER_COLD = 2,
    LKV_WIRE_TIER_ABSENT = 3,
};

/* Reply of a Put. */
typedef struct lkv_put_reply {
    uint8_t key[LKV_KEY_BYTES]; /* The document key. */
    uint64_t n_tokens;          /* Tokens stored. */
    uint32_t n_blocks;          /* Blocks stored. */
    int durability;             /* enum lkv_wire_durability: what the acknowledgement means. */
    int already_present;        /* 1 if the document was cached already (its KV was kept). */
    int tier;                   /* enum lkv_wire_tier: where the document is now. */
} lkv_put_reply;

/* One document's state, as returned by lkv_client_lookup. */
typedef struct lkv_doc_status {
    int present;                /* 1 if cached. */
    int tier;                   /* enum lkv_wire_tier (LKV_WIRE_TIER_ABSENT when not present). */
    uint64_t n_tokens;          /* 0 when absent and unknown. */
    uint32_t n_blocks;          /* Blocks of the document. */
    uint8_t key[LKV_KEY_BYTES]; /* The key (also for absent documents). */
    int miss_cause;             /* The proto's MissCause (0 when present). */
    char profile[64];           /* Profile name when known, else "". */
    uint32_t pins;              /* Pins held now (leases); filled by lkv_client_list only. */
    uint64_t bytes;             /* Block payload bytes; filled by lkv_client_list only. */
    char model_id[128];         /* The profile's weights identity ("" if none); Lookup only. */
} lkv_doc_status;

/* Header of a Get stream: describes the blocks that follow. */
typedef struct lkv_get_header {
    uint8_t key[LKV_KEY_BYTES]; /* The document key. */
    char profile[64];           /* Profile name. */
    uint64_t n_tokens;          /* Tokens of the document. */
    uint32_t n_blocks;          /* Blocks that follow. */
    uint64_t block_bytes;       /* Size of every block. */
    uint32_t block_tokens;      /* Tokens per block. */
    int tier;                   /* enum lkv_wire_tier where the document was found. */
} lkv_get_header;

/* Creates a handle for target ("host:port", any gRPC target string). Connects lazily: an
 * unreachable daemon shows up as LKV_EUNAVAIL on the first call. opt may be NULL (defaults);
 * it and its strings are copied. *out is owned by the caller; free with lkv_client_destroy.
 * Returns 0 or LKV_EINVAL (bad option; message in lkv_client_last_error). */
int lkv_client_create(const char *target, const lkv_client_options *opt, lkv_client_t **out);

/* Destroys c. Every call on c must have returned and every put handle must be finished or
 * aborted. NULL is allowed. */
void lkv_client_destroy(lkv_client_t *c);

/* Message of this thread's last failed call (server status message or a local message);
 * "" after a success. Borrowed: valid until this thread's next call into this library. */
const char *lkv_client_last_error(void);

/* gRPC status code of this thread's last failed call, 0 after a success, -1 if the call failed
 * before reaching gRPC (bad arguments). */
int lkv_client_last_status(void);

/* The delay the daemon asked for with this thread's last failed call (trailing metadata
 * "retry-after-ms": a tenant over its rate_calls or rate_bytes, lkv-code LKV_ERATE), in ms;
 * -1 if it asked for none. */
int64_t lkv_client_last_retry_after_ms(void);

/* grpc.health.v1.Health/Check for service ("" for the whole daemon; NULL means ""). Returns 0
 * if SERVING, LKV_EUNAVAIL if NOT_SERVING or unreachable, LKV_ENOTFOUND for an unknown
 * service, or another mapped error. */
int lkv_client_ping(lkv_client_t *c, const char *service, int deadline_ms);

/* Starts a streaming Put of one document under profile with n_tokens token ids (both
 * borrowed for this call only; copied). n_blocks is the block count announced in the header
 * (0: let the daemon derive it). On success *out is a put handle owned by the caller that
 * must be ended with lkv_put_finish or lkv_put_abort (each frees it). The header is sent
 * with the first block message (or alone by lkv_put_finish). */
int lkv_client_put_begin(lkv_client_t *c, const char *profile, const uint32_t *tokens,
                         size_t n_tokens, uint32_t n_blocks, int deadline_ms, lkv_put_t **out);

/* Residency options of a Put (PutHeader priority, ttl_ms, hold; DESIGN.md 4). Zero: none. */
typedef struct lkv_put_options {
    int priority;    /* -1 evicted first, 0 normal, +1 evicted last. */
    uint64_t ttl_ms; /* Dropped this long after the Put; 0 = never. */
    int hold;        /* 1: never evicted until an Admin Hold releases it. */
} lkv_put_options;

/* Sets the options the header of put p carries (o copied; NULL clears). Only before the first
 * block is sent (LKV_EINVAL after, and for a priority outside -1..1). */
int lkv_put_set_options(lkv_put_t *p, const lkv_put_options *o);

/* Sends n consecutive blocks first_index .. first_index+n-1 in one message; data holds
 * n * block_bytes bytes (borrowed for the call). Blocks are passed through unchecked. Returns
 * 0 when the message is handed to gRPC (not yet accepted by the daemon), or the mapped error
 * of the call if the daemon has already refused the Put (then only finish/abort remain
 * meaningful; they return the same error). LKV_ETOOBIG (nothing sent, the stream stays usable)
 * if the message would exceed the handle's max_message_bytes. */
int lkv_put_blocks(lkv_put_t *p, uint32_t first_index, uint32_t n, const void *data,
                   size_t block_bytes);

/* Sends one block (index, len bytes of data, borrowed). Same as lkv_put_blocks with n = 1. */
int lkv_put_block(lkv_put_t *p, uint32_t index, const void *data, size_t len);

/* Half-closes the stream and waits for the daemon's reply. On 0, *reply (may be NULL) is
 * filled. Always frees p. */
int lkv_put_finish(lkv_put_t *p, lkv_put_reply *reply);

/* Cancels the Put (the daemon discards everything received) and frees p. NULL is allowed. */
void lkv_put_abort(lkv_put_t *p);

/* One-shot Put of a whole document: n_blocks blocks of block_bytes bytes each, contiguous in
 * blocks (borrowed), sent as few messages as the handle's max message size allows. reply may
 * be NULL. */
int lkv_client_put(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n_tokens,
                   const void *blocks, uint32_t n_blocks, size_t block_bytes, int deadline_ms,
                   lkv_put_reply *reply);

/* lkv_client_put with residency options (opt borrowed; NULL: none). */
int lkv_client_put_ex(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n_tokens,
                      const void *blocks, uint32_t n_blocks, size_t block_bytes,
                      const lkv_put_options *opt, int deadline_ms, lkv_put_reply *reply);

/* Looks up n documents (refs borrowed) in one call; out (caller-owned, n entries) receives
 * their states in request order. Absent documents are not an error. */
int lkv_client_lookup(lkv_client_t *c, const lkv_docref *refs, size_t n, int deadline_ms,
                      lkv_doc_status *out);

/* Called by lkv_client_get once for the header (data == NULL, len == 0, index == UINT32_MAX:
 * a chance to size a buffer from header->n_blocks * header->block_bytes), then once per block in
 * index order. header and data are borrowed for the duration of the callback. Return 0 to
 * continue, anything else to cancel the Get (lkv_client_get then returns LKV_ECANCELLED). */
typedef int (*lkv_get_block_fn)(void *ctx, const lkv_get_header *header, uint32_t index,
                                const void *data, size_t len);

/* Streams one document's blocks to fn (ctx passed through). header (may be NULL) receives the
 * stream header. Returns 0 once every block has been delivered, LKV_ENOTFOUND if the document
 * is not cached, LKV_ECORRUPT if the stream is inconsistent (a block index out of order, a
 * size not block_bytes, fewer blocks than announced), LKV_ETOOBIG if a block is larger than the
 * handle's max_message_bytes, or another mapped error. */
int lkv_client_get(lkv_client_t *c, const lkv_docref *ref, int deadline_ms, lkv_get_header *header,
                   lkv_get_block_fn fn, void *ctx);

/* Pull-style Get: starts the call and reads the stream header into *header (may be NULL).
 * On 0, *out is a get handle owned by the caller, ended with lkv_get_end (one thread at a
 * time). Errors as lkv_client_get (e.g. LKV_ENOTFOUND). */
int lkv_client_get_begin(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                         lkv_get_header *header, lkv_get_t **out);

/* Next block, in index order: on 0 with *data != NULL, *index, *data and *len describe it
 * (*data is borrowed: valid until the next lkv_get_next or lkv_get_end on g). On 0 with
 * *data == NULL, every block was delivered and the daemon ended the stream with OK. Errors as
 * lkv_client_get; after an error every further call returns it again. */
int lkv_get_next(lkv_get_t *g, uint32_t *index, const void **data, size_t *len);

/* Ends the Get (cancelling it if blocks remain) and frees g. NULL is allowed. */
void lkv_get_end(lkv_get_t *g);

/* Gets one document into one buffer: on 0, *data (owned by the caller, free()) holds
 * header->n_blocks * header->block_bytes bytes and *len their count. header must not be NULL. */
int lkv_client_get_buf(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                       lkv_get_header *header, uint8_t **data, size_t *len);

/* Gets one document into the caller's buffer buf (cap bytes, borrowed): on 0, *len =
 * header->n_blocks * header->block_bytes bytes were written, block i at buf + i * block_bytes.
 * Each block is copied once, from the slices gRPC received it in, straight to its place (no
 * gathered copy of a message that came in several slices, no allocation per message), so a
 * caller that reuses one buffer reads at the rate of the transport. LKV_ETOOBIG (nothing
 * written, the call cancelled) if the document does not fit in cap; header (may be NULL)
 * still receives the stream header then, so the caller can size a buffer and retry. Other
 * errors as lkv_client_get; on any error buf may hold some blocks. */
int lkv_client_get_into(lkv_client_t *c, const lkv_docref *ref, int deadline_ms,
                        lkv_get_header *header, void *buf, size_t cap, size_t *len);

/* Deletes a document from every tier. key_out (may be NULL, 32 bytes) receives its key.
 * LKV_ENOTFOUND if it was not cached. */
int lkv_client_delete(lkv_client_t *c, const lkv_docref *ref, int deadline_ms, uint8_t *key_out);

/* lazykv.v1.Admin/Stats: on 0, *info (owned by the caller, free()) is the INFO-style text of
 * the requested sections (section may be NULL: all). */
int lkv_client_stats(lkv_client_t *c, const char *section, int deadline_ms, char **info);

/* One statistic, as in lazykv.v1.StatEntry. */
typedef struct lkv_stat_entry {
    char section[64]; /* e.g. "hot". */
    char key[64];     /* e.g. "bytes_used". */
    double value;     /* Numeric value (0 when text is set). */
    char text[128];   /* Non-numeric value (e.g. a version), else "". */
} lkv_stat_entry;

/* lazykv.v1.Admin/Stats, structured: on 0, *entries (owned by the caller, free()) holds *n
 * entries of the requested section (NULL: all), in the daemon's order. */
int lkv_client_stats_entries(lkv_client_t *c, const char *section, int deadline_ms,
                             lkv_stat_entry **entries, size_t *n);

/* Filter and paging of lkv_client_list. Zero-initialise, then set what you need. */
typedef struct lkv_list_filter {
    const char *profile;      /* Only documents of this profile; NULL or "": all. Borrowed. */
    int tier;                 /* enum lkv_wire_tier: only this tier; 0 (UNSPECIFIED): all. */
    uint32_t limit;           /* Documents per page, 1..10000; 0: the daemon's default (1000). */
    const uint8_t *after_key; /* NULL: first page; else resume after this key (32 bytes). */
} lkv_list_filter;

/* lazykv.v1.Admin/List: one page of cached documents in increasing key order (admin role).
 * f may be NULL (all documents, default page). On 0, *docs (owned by the caller, free(); NULL
 * when *n is 0) holds *n entries with present, tier, n_tokens, n_blocks, key, profile, pins and
 * bytes set; *more is 1 if documents remain, and then next_key (32 bytes, caller's buffer; may
 * be NULL) receives the after_key of the next page. Errors: LKV_EINVAL (limit above 10000,
 * unknown profile), or another mapped error. */
int lkv_client_list(lkv_client_t *c, const lkv_list_filter *f, int deadline_ms,
                    lkv_doc_status **docs, size_t *n, uint8_t *next_key, int *more);

/* lazykv.v1.Admin/Evict: moves the document with key (32 bytes, borrowed) out of the hot tier
 * now (it stays cold). LKV_ENOTFOUND if it is not cached or not hot; LKV_EINVAL if it is pinned
 * or being read (FAILED_PRECONDITION). */
int lkv_client_evict(lkv_client_t *c, const uint8_t *key, int deadline_ms);

/* lazykv.v1.Admin/Hold: holds (on = 1) or releases (on = 0) the document with store key (32
 * bytes, borrowed), or, with key NULL, every document of tenant and/or profile (names; NULL or
 * "" = any; at least one). *docs (may be NULL) gets the documents the hold covers. Errors:
 * LKV_EINVAL (no target, both a key and a class, unknown tenant or profile), LKV_ENOTFOUND
 * (unknown key, or no such class hold to release), LKV_ENOSPC (the document cannot be made
 * hot, or 16 class holds), LKV_EPERM without the admin role. */
int lkv_client_hold(lkv_client_t *c, const uint8_t *key, const char *tenant, const char *profile,
                    int on, int deadline_ms, uint64_t *docs);

/* lazykv.v1.Admin/EvictClass: evicts every document of tenant and/or profile (names; NULL or
 * "" = any; at least one) from the hot tier, or with purge from both tiers. Writes the counts
 * (both may be NULL). Errors as lkv_client_hold (no LKV_ENOTFOUND, LKV_ENOSPC). */
int lkv_client_evict_class(lkv_client_t *c, const char *tenant, const char *profile, int purge,
                           int deadline_ms, uint64_t *evicted_hot, uint64_t *dropped_cold);

#define LKV_LEASE_ID_BYTES 16

#define LKV_CLIENT_MAX_REGIONS 64

/* One region of the arena (the proto's ArenaRegion): the pages of one profile. Page i of the
 * region is at arena byte base_offset + i * page_bytes (DESIGN.md 4, the arena contract). */
typedef struct lkv_arena_region {
    char profile[64];     /* The profile whose documents live here. */
    uint64_t base_offset; /* Byte offset of page 0 (a multiple of 2 MiB). */
    uint64_t page_bytes;  /* Bytes of one page (block_bytes rounded up to 256). */
    uint32_t n_pages;     /* Pages of the region. */
} lkv_arena_region;

/* How a co-located process maps the hot arena (the proto's ArenaInfo). */
typedef struct lkv_lease_arena {
    char backend[16];     /* "host" or "cuda". */
    char shm_name[256];   /* host: shm_open name; else "". */
    uint64_t arena_bytes; /* Bytes of the whole allocation (map [0, arena_bytes)). */
    int cuda_device;      /* cuda: device ordinal; -1 on host. */
    uint8_t cuda_ipc[64]; /* cuda: cudaIpcMemHandle_t of the base (cudaIpcOpenMemHandle). */
    int has_cuda_ipc;     /* 1 if cuda_ipc is set. */
    uint32_t n_regions;   /* Entries of regions (one per profile, at most 64 shown). */
    lkv_arena_region regions[LKV_CLIENT_MAX_REGIONS];
} lkv_lease_arena;

/* One attached document (the proto's AttachedDoc with its BlockLayout). */
typedef struct lkv_attached_doc {
    uint8_t key[LKV_KEY_BYTES]; /* The document key. */
    char profile[64];           /* Profile name. */
    uint64_t n_tokens;          /* Tokens of the document. */
    uint32_t n_layers;          /* Layout: layers. */
    uint32_t n_kv_heads;        /* Layout: KV heads. */
    uint32_t head_dim;          /* Layout: head dimension. */
    char dtype[8];              /* Layout: "f32", "f16", "bf16". */
    uint32_t block_tokens;      /* Layout: tokens per block. */
    uint64_t block_bytes;       /* Layout: bytes per block. */
    uint32_t n_pages;           /* Blocks of the document = entries of pages. */
    uint32_t *pages;            /* Page of block 0..n_pages-1 within the region; owned by the
                                 * lkv_lease (or lkv_reservation). */
    uint32_t region;            /* Its region (index into lkv_lease_arena.regions). */
    uint64_t region_base;       /* That region's base_offset. */
    uint64_t page_bytes;        /* That region's page_bytes. */
    char model_id[128];         /* The profile's weights identity ("" if none or unknown). */
    int attached;               /* 1: pinned, pages valid. 0 (present mode only): not pinned. */
    int present;                /* Not attached: 1 cached but no hot room, 0 not cached. */
    int tier;                   /* enum lkv_wire_tier: HOT when attached, else COLD/ABSENT. */
} lkv_attached_doc;

/* Address of block i of d in an arena mapped at arena_base (host mapping, or the pointer
 * cudaIpcOpenMemHandle gave): arena_base + d->region_base + d->pages[i] * d->page_bytes. NULL
 * for i >= d->n_pages. The kernels take (arena_base + region_base, page_bytes) per launch. */
void *lkv_block_addr(void *arena_base, const lkv_attached_doc *d, uint32_t i);

/* A lease, as returned by lkv_client_attach. Free with lkv_lease_free. */
typedef struct lkv_lease {
    int live;                       /* 1: a lease was made or renewed (id is valid). */
    uint8_t id[LKV_LEASE_ID_BYTES]; /* Pass to renew or release. */
    uint64_t expires_unix_ms;       /* When the lease ends unless renewed. */
    uint32_t ttl_ms;                /* TTL granted. */
    uint32_t lease_docs;            /* Documents now in the lease. */
    lkv_lease_arena arena;          /* Arena mapping. */
    size_t n_docs;                  /* Entries of docs (one per requested document). */
    lkv_attached_doc *docs;         /* Owned; in request order. */
} lkv_lease;

/* lazykv.v1.Cache/Attach (worker role): pins the n documents of refs (borrowed) in the hot tier
 * under a new lease (lease_id NULL) or the lease lease_id (16 bytes, borrowed; renews it), for
 * ttl_ms milliseconds. On 0, *out is filled (owned by the caller; lkv_lease_free). On error *out
 * is zeroed. LKV_ENOTFOUND: a document is not cached or the lease is unknown (nothing pinned);
 * LKV_ENOSPC: cannot be made hot or too many leases; LKV_EINVAL: bad request. */
int lkv_client_attach(lkv_client_t *c, const lkv_docref *refs, size_t n, const uint8_t *lease_id,
                      uint32_t ttl_ms, int deadline_ms, lkv_lease *out);

/* Attach in ATTACH_MODE_PRESENT (the RAG request): pins what is present and reports the rest, so
 * an eviction between Lookup and Attach costs one miss, not a failed request. As
 * lkv_client_attach, except: a document that is not cached or cannot be made hot is not an error
 * (its entry has attached 0, n_pages 0, present/tier saying why); when nothing could be pinned
 * and lease_id is NULL, no lease is made (out->live 0; nothing to release). */
int lkv_client_attach_present(lkv_client_t *c, const lkv_docref *refs, size_t n,
                              const uint8_t *lease_id, uint32_t ttl_ms, int deadline_ms,
                              lkv_lease *out);

/* Frees what *l owns and zeroes it. NULL is allowed. */
void lkv_lease_free(lkv_lease *l);

/* lazykv.v1.Cache/Release: ends the lease lease_id (16 bytes, borrowed). released (may be
 * NULL) receives the number of documents unpinned. LKV_ENOTFOUND if unknown or expired. */
int lkv_client_release(lkv_client_t *c, const uint8_t *lease_id, int deadline_ms,
                       uint32_t *released);

/* ---- Put in place (worker role; cache.proto "Put in place") ------------------------------- */

/* A mapping of the host arena (shared memory), read-write: a worker that may reserve is
 * trusted with all of it (daemon/README.md, security notes). */
typedef struct lkv_arena_map {
    void *base;     /* Mapping of [0, bytes), or NULL when not mapped. */
    size_t bytes;   /* Its length. */
    char name[256]; /* The shm object mapped. */
} lkv_arena_map;

/* Maps the host arena a (from an Attach or Reserve reply) read-write into *m (zero it first):
 * 0, LKV_ENOTSUP for a cuda arena (open a->cuda_ipc with cudaIpcOpenMemHandle instead), LKV_EIO
 * if shm_open or mmap fails. Mapping again the same object is a no-op. */
int lkv_arena_map_open(const lkv_lease_arena *a, lkv_arena_map *m);
/* Unmaps (m may be zeroed or NULL). */
void lkv_arena_map_close(lkv_arena_map *m);

/* A reservation, as returned by lkv_client_reserve. Free with lkv_reservation_free. */
typedef struct lkv_reservation {
    uint8_t lease_id[LKV_LEASE_ID_BYTES]; /* The lease (pass to commit, abort, release). */
    uint64_t expires_unix_ms;             /* When the lease ends unless renewed. */
    uint32_t ttl_ms;                      /* TTL granted. */
    uint32_t lease_docs;                  /* Documents in the lease. */
    int already_present;                  /* 1: cached already: attached, NOT reserved (read). */
    int waited;                           /* 1: the call waited for another worker. */
    lkv_lease_arena arena;                /* Arena mapping. */
    lkv_attached_doc doc;                 /* key, layout, pages, region. */
    void **addrs; /* With a map: doc.n_pages block addresses in it (owned), else NULL. */
} lkv_reservation;

/* lazykv.v1.Cache/Reserve (worker role): reserves arena pages for the document tokens[0..n) of
 * profile (borrowed) under a new lease (lease_id NULL) or lease_id (16 bytes; renewed), for
 * ttl_ms. wait: if another worker is computing it, wait (within deadline_ms) for its commit
 * (then out->already_present) or abort (then this caller reserves it). map (may be NULL): the
 * host arena mapping to compute out->addrs in (mapped here on first use). Errors: LKV_EINPROGRESS
 * (ABORTED: being computed by another worker and wait is 0), LKV_EEXIST, LKV_ENOSPC,
 * LKV_ENOTFOUND (lease), LKV_EINVAL / LKV_EPROFILE (bad request), LKV_ETIMEDOUT, or another
 * mapped error; *out is zeroed then. On 0 *out is the caller's (lkv_reservation_free). */
int lkv_client_reserve(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n,
                       const uint8_t *lease_id, uint32_t ttl_ms, int wait, lkv_arena_map *map,
                       int deadline_ms, lkv_reservation *out);

/* Flags of lkv_client_reserve_ex. */
#define LKV_RESERVE_WAIT 1 /* As wait above. */
#define LKV_RESERVE_SCRATCH                                                                        \
    2 /* Room never committed (ReserveRequest.scratch: a copy's                                    \
       * placeholder; passes the daemon's hot admission door). */

/* lkv_client_reserve with flags (LKV_RESERVE_*). Also LKV_EADMIT: the daemon's hot admission
 * door declined the new document (compute it in your own pages). */
int lkv_client_reserve_ex(lkv_client_t *c, const char *profile, const uint32_t *tokens, size_t n,
                          const uint8_t *lease_id, uint32_t ttl_ms, int flags, lkv_arena_map *map,
                          int deadline_ms, lkv_reservation *out);

/* Frees what *r owns and zeroes it. NULL is allowed. */
void lkv_reservation_free(lkv_reservation *r);

/* lazykv.v1.Cache/Commit: makes the document key (32 bytes), written into the reserved pages,
 * visible; it stays pinned under lease_id. out (may be NULL; the caller frees out->pages with
 * free()) describes it; *already_present (may be NULL) is 1 if a Put's copy was kept (other
 * pages). LKV_EINVAL: the daemon's check failed (a non-zero tail; lkv_client_last_error says
 * where): nothing visible, the reservation is still open. LKV_ENOTFOUND: no such reservation. */
int lkv_client_commit(lkv_client_t *c, const uint8_t *lease_id, const uint8_t *key, int deadline_ms,
                      lkv_attached_doc *out, int *already_present);

/* lazykv.v1.Cache/Abort: gives the reservation's pages back. LKV_ENOTFOUND if none. */
int lkv_client_abort(lkv_client_t *c, const uint8_t *lease_id, const uint8_t *key, int deadline_ms);

/* ---- Cluster (lazykv.v1.Cache/Cluster) ---- */

/* One member as the answering daemon sees it (the proto's ClusterMember). */
typedef struct lkv_cluster_member {
    char id[128];
    char addr[128];
    char version[32];
    char state[16];     /* "up", "down", "joining". */
    uint64_t hot_bytes; /* Rendezvous weight. */
    int self;           /* 1 for the member that answered. */
    double share;       /* Expected share of the key space. */
    uint64_t hot_used_bytes, cold_used_bytes, hot_docs, cold_docs; /* Self only. */
} lkv_cluster_member;

typedef struct lkv_cluster_profile {
    char name[64];
    uint8_t fingerprint[32];
} lkv_cluster_profile;

/* The proto's ClusterResponse. Free with lkv_cluster_info_free. */
typedef struct lkv_cluster_info {
    char mode[16]; /* "none", "etcd", "static", "dns". */
    uint64_t epoch;
    int etcd_up;
    size_t n_members;
    lkv_cluster_member *members; /* Owned. */
    size_t n_profiles;
    lkv_cluster_profile *profiles; /* Owned. */
} lkv_cluster_info;

/* lazykv.v1.Cache/Cluster (data role): on 0, *out is filled (caller frees with
 * lkv_cluster_info_free); on error it is zeroed. */
int lkv_client_cluster(lkv_client_t *c, int deadline_ms, lkv_cluster_info *out);

/* Frees what *i owns and zeroes it. NULL allowed. */
void lkv_cluster_info_free(lkv_cluster_info *i);

/* Formats a 32-byte key as 64 lowercase hex characters plus NUL into out (65 bytes). */
void lkv_key_to_hex(const uint8_t *key, char *out);

/* Parses 64 hex characters into key (32 bytes); 0 or LKV_EINVAL. */
int lkv_key_from_hex(const char *hex, uint8_t *key);

#endif
