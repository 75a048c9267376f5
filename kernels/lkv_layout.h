/*
 * lkv_layout.h: the block layout and the 64-bit block reference. THE contract between the wire
 * (Put/Get payloads), the hot arena, the cold tier, the CLI's KV files and the kernels
 * (DESIGN.md section 3). Defined once, here; everything else includes this header.
 *
 * Block: B tokens (1..64, default 16) of one document, all layers, K and V, laid out
 *
 *     [layer][K then V][kv_head][token][head_dim]      in the profile's element type
 *
 * so one (layer, K|V, kv_head) slab of a block is contiguous: B x head_dim elements. Byte offset
 * of element (l, kv, h, t, d) in a block:
 *
 *     ((((l * 2 + kv) * n_kv_heads + h) * B + t) * head_dim + d) * elem_size
 *
 * Keys are stored rotated at document-local positions (token t of block b of a document is at
 * local position b * B + t). The last block of a document may be partial: its unused token
 * slots are zero and never attended. Values are stored as computed. All multi-byte elements are
 * little-endian (the only byte order lazykv runs on).
 *
 * Block reference (one uint64 per block, built per prompt; the only metadata the decode kernel
 * reads):
 *
 *     bits  0..23  page index within the region   (16M pages per region)
 *     bits 24..45  document start in this prompt  (positions 0..4,194,303)
 *     bits 46..57  block index within document    (documents up to 4096 blocks)
 *     bits 58..63  valid tokens in block minus 1  (1..64 tokens)
 *
 * The arena contract (DESIGN.md 4; proto/lazykv/v1/cache.proto): the hot arena is one
 * allocation carved into one region per model profile; region r starts at base_offset(r) (a
 * multiple of 2 MiB) and has pages of page_bytes(r) = lkv_block_bytes of its profile rounded up
 * to a multiple of 256 B. The page index of a reference is an index within the region of the
 * document's profile, so block bytes start at
 *
 *     arena_base + base_offset + page * page_bytes       (lkv_ref_block_addr)
 *
 * A prompt's documents are all of one profile: the kernels take one (region base pointer =
 * arena_base + base_offset, page stride = page_bytes) pair per launch (lkv_attn.h: arena and
 * page_bytes), so a reference never names its region.
 *
 * This header is plain C with static inline helpers, usable from C and CUDA alike.
 */
#ifndef LKV_LAYOUT_H
#define LKV_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define LKV_HD __host__ __device__
#else
#define LKV_HD
#endif

/* Element types of stored KV. Values are part of the wire format: never renumber. */
enum lkv_dtype {
    LKV_DTYPE_F32 = 0,
    LKV_DTYPE_F16 = 1,
    LKV_DTYPE_BF16 = 2,
};

/* Returns the size in bytes of one element of dtype, or 0 for an unknown dtype. */
static inline LKV_HD size_t lkv_dtype_size(int dtype)
{
    return dtype == LKV_DTYPE_F32 ? 4 : (dtype == LKV_DTYPE_F16 || dtype == LKV_DTYPE_BF16) ? 2 : 0;
}

/* Position encodings. Values are part of the wire format: never renumber. */
enum lkv_posenc_kind {
    LKV_POSENC_NONE = 0,
    LKV_POSENC_ROPE = 1,
    LKV_POSENC_ALIBI = 2,
};

/* RoPE pairings: half-split pairs (i, i + rot/2) as HF Llama/NeoX; interleaved (2i, 2i+1) as
 * GPT-J and llama2.c. */
enum lkv_rope_pairing {
    LKV_ROPE_HALF = 0,
    LKV_ROPE_INTERLEAVED = 1,
};

/* RoPE frequency scaling. */
enum lkv_rope_scaling {
    LKV_ROPE_SCALING_NONE = 0,
    LKV_ROPE_SCALING_LINEAR = 1, /* theta_j / factor */
    LKV_ROPE_SCALING_LLAMA3 = 2, /* Llama-3.1 piecewise (factor, low/high freq, orig max pos) */
};

/* Position-encoding configuration of a model (part of the model profile). */
typedef struct lkv_posenc_cfg {
    int kind;                /* enum lkv_posenc_kind. */
    double rope_theta;       /* RoPE base, e.g. 10000 or 500000. */
    int rope_pairing;        /* enum lkv_rope_pairing. */
    int rotary_dim;          /* Rotated dims per head (even, <= head_dim); 0 means head_dim. */
    int rope_scaling;        /* enum lkv_rope_scaling. */
    double scaling_factor;   /* Linear and llama3: the factor (e.g. 8). */
    double low_freq_factor;  /* llama3 only (e.g. 1). */
    double high_freq_factor; /* llama3 only (e.g. 4). */
    double original_max_pos; /* llama3 only (e.g. 8192). */
} lkv_posenc_cfg;

/* Shape of a model's KV, and of its blocks. */
typedef struct lkv_kv_shape {
    int n_layers;     /* Transformer layers (>= 1). */
    int n_q_heads;    /* Query heads (a multiple of n_kv_heads). */
    int n_kv_heads;   /* KV heads: == n_q_heads for MHA, 1 for MQA, else GQA. */
    int head_dim;     /* 8..256, a multiple of 8. */
    int dtype;        /* enum lkv_dtype of stored K and V. */
    int block_tokens; /* B: tokens per block, 1..64. */
} lkv_kv_shape;

#define LKV_MAX_HEAD_DIM     256
#define LKV_MAX_BLOCK_TOKENS 64

/* Bytes of one (layer, K|V, kv_head) slab of a block: B x head_dim elements. */
static inline LKV_HD size_t lkv_slab_bytes(const lkv_kv_shape *s)
{
    return (size_t)s->block_tokens * (size_t)s->head_dim * lkv_dtype_size(s->dtype);
}

/* Bytes of one whole block (all layers, K and V, all kv heads). */
static inline LKV_HD size_t lkv_block_bytes(const lkv_kv_shape *s)
{
    return (size_t)s->n_layers * 2u * (size_t)s->n_kv_heads * lkv_slab_bytes(s);
}

/* Byte offset of the slab (layer, kv: 0 = K / 1 = V, kv_head) within a block. */
static inline LKV_HD size_t lkv_slab_offset(const lkv_kv_shape *s, int layer, int kv, int head)
{
    return ((size_t)(layer * 2 + kv) * (size_t)s->n_kv_heads + (size_t)head) * lkv_slab_bytes(s);
}

/* Number of blocks that hold n_tokens tokens. */
static inline LKV_HD uint32_t lkv_blocks_for_tokens(const lkv_kv_shape *s, uint64_t n_tokens)
{
    return (uint32_t)((n_tokens + (uint64_t)s->block_tokens - 1) / (uint64_t)s->block_tokens);
}

/* Block reference fields. */
#define LKV_REF_PAGE_BITS  24
#define LKV_REF_START_BITS 22
#define LKV_REF_BLOCK_BITS 12
#define LKV_REF_VALID_BITS 6
#define LKV_REF_MAX_PAGE   ((1u << LKV_REF_PAGE_BITS) - 1u)  /* 16,777,215 */
#define LKV_REF_MAX_START  ((1u << LKV_REF_START_BITS) - 1u) /* 4,194,303 */
#define LKV_REF_MAX_BLOCK  ((1u << LKV_REF_BLOCK_BITS) - 1u) /* 4095 */
#define LKV_MAX_POSITION   LKV_REF_MAX_START

/* Packs a block reference. Fields are masked, not checked: callers that take the values from
 * input use lkv_ref_pack_checked. page <= LKV_REF_MAX_PAGE, start <= LKV_REF_MAX_START,
 * block <= LKV_REF_MAX_BLOCK, 1 <= valid <= 64. */
static inline LKV_HD uint64_t lkv_ref_pack(uint32_t page, uint32_t start, uint32_t block,
                                           uint32_t valid)
{
    return (uint64_t)(page & LKV_REF_MAX_PAGE) | ((uint64_t)(start & LKV_REF_MAX_START) << 24) |
           ((uint64_t)(block & LKV_REF_MAX_BLOCK) << 46) | ((uint64_t)((valid - 1u) & 63u) << 58);
}

/* Packs with range checks: returns 0 and writes *out, or -1 if a field is out of range. */
static inline int lkv_ref_pack_checked(uint32_t page, uint64_t start, uint32_t block,
                                       uint32_t valid, uint64_t *out)
{
    if (page > LKV_REF_MAX_PAGE || start > LKV_REF_MAX_START || block > LKV_REF_MAX_BLOCK ||
        valid < 1 || valid > 64) {
        return -1;
    }
    *out = lkv_ref_pack(page, (uint32_t)start, block, valid);
    return 0;
}

/* Address of the block that reference r names, in a region that starts at region_base (the
 * arena's base plus the region's base_offset) with pages of page_bytes. */
static inline LKV_HD const void *lkv_ref_block_addr(const void *region_base, uint64_t page_bytes,
                                                    uint64_t r)
{
    return (const uint8_t *)region_base + (uint64_t)(r & LKV_REF_MAX_PAGE) * page_bytes;
}

static inline LKV_HD uint32_t lkv_ref_page(uint64_t r)
{
    return (uint32_t)(r & LKV_REF_MAX_PAGE);
}
static inline LKV_HD uint32_t lkv_ref_start(uint64_t r)
{
    return (uint32_t)((r >> 24) & LKV_REF_MAX_START);
}
static inline LKV_HD uint32_t lkv_ref_block(uint64_t r)
{
    return (uint32_t)((r >> 46) & LKV_REF_MAX_BLOCK);
}
static inline LKV_HD uint32_t lkv_ref_valid(uint64_t r)
{
    return (uint32_t)((r >> 58) & 63u) + 1u;
}

#endif
