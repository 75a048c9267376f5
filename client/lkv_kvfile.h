/*
 * lkv_kvfile.h: the KV file, one document's KV on disk, as read by `lazykv put FILE` and written by
 * `lazykv get ... -o FILE`.
 *
 * A KV file holds one document: its model profile name, its token ids and its blocks in the wire
 * layout of kernels/lkv_layout.h ([layer][K then V][kv_head][token][head_dim], the last block
 * partial with zeroed unused slots). All integers are little-endian. Layout:
 *
 *     offset        size        field
 *     0             8           magic "LKVKV1\0\0"
 *     8             4           version (u32) = 1
 *     12            4           flags (u32): bit 0 set = token ids present; other bits 0
 *     16            4           P: profile name length in bytes (u32, 1..63)
 *     20            4           N: number of tokens (u32, >= 1)
 *     24            4           NB: number of blocks (u32, >= 1)
 *     28            4           reserved, 0
 *     32            8           BB: bytes per block (u64, >= 1)
 *     40            P           profile name ([A-Za-z0-9._-]+, no NUL)
 *     40+P          pad         zeros to a multiple of 8
 *     T = above     4*N         token ids (u32 each), only if flags bit 0 is set
 *     T+4N          pad         zeros to a multiple of 8 (only with token ids)
 *     D = above     NB*BB       blocks, block i at D + i*BB
 *
 * Token ids are absent only in files written from a Get by key (the daemon returns the
 * document's key, profile and token count, not its token ids); such a file cannot be Put
 * again, since the key is derived from the token ids.
 *
 * The file ends exactly at D + NB*BB; anything else is corrupt. The block count must equal
 * ceil(N / block_tokens) of the profile, which only the daemon knows: the file does not check
 * it, the daemon does on Put.
 */
#ifndef LKV_KVFILE_H
#define LKV_KVFILE_H

#include <stddef.h>
#include <stdint.h>

#define LKV_KVFILE_MAGIC    "LKVKV1\0\0"
#define LKV_KVFILE_VERSION  1u
#define LKV_KVFILE_NAME_MAX 63

/* One document's KV in memory. Every pointer is owned by the struct and freed by
 * lkv_kvfile_free (or by the caller, when the caller filled the struct itself). */
typedef struct lkv_kvfile {
    char profile[LKV_KVFILE_NAME_MAX + 1]; /* Profile name, NUL-terminated. */
    uint32_t n_tokens;                     /* Number of token ids. */
    uint32_t *tokens;                      /* n_tokens token ids, or NULL if absent. */
    uint32_t n_blocks;                     /* Number of blocks. */
    uint64_t block_bytes;                  /* Bytes per block. */
    uint8_t *blocks;                       /* n_blocks * block_bytes bytes, wire layout. */
} lkv_kvfile;

/* Reads path into *out (fields allocated with lkv_xmalloc; free with lkv_kvfile_free).
 * Returns 0, LKV_EIO if the file cannot be read (errno text in err), or LKV_ECORRUPT /
 * LKV_EINVAL for a bad file; err (errlen bytes, may be NULL) gets a message naming the
 * problem. On error *out is zeroed and owns nothing. */
int lkv_kvfile_read(const char *path, lkv_kvfile *out, char *err, int errlen);

/* Writes *kf to path (created or truncated, mode 0644), via a temporary file renamed into
 * place so that a reader never sees half a file. kf is borrowed. Returns 0, LKV_EINVAL for an
 * invalid *kf, or LKV_EIO (message in err). */
int lkv_kvfile_write(const char *path, const lkv_kvfile *kf, char *err, int errlen);

/* Checks the fields of *kf (name charset and length, counts, sizes); 0 or LKV_EINVAL with a
 * message in err. */
int lkv_kvfile_check(const lkv_kvfile *kf, char *err, int errlen);

/* Frees what *kf owns and zeroes it. NULL is allowed. */
void lkv_kvfile_free(lkv_kvfile *kf);

#endif
