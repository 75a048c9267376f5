/*
 * svc_cold.h: cold-tier reads of the service benchmark, RocksDB beside plain files.
 *
 * svc_cold_open writes n_docs documents twice under dir: once into a RocksDB cold tier through
 * storage/lkv_cold.h (dir/cold-rocksdb: one atomic batch per document, blocks as blob-file
 * values, as the store writes them), once as plain files (dir/cold-files/doc-N: the same
 * block payload bytes, concatenated). It then closes and reopens the database (so every value
 * is read from its blob file, not the memtable) and reads everything once through both paths,
 * so the page cache is warm for both when the timed reads start.
 *
 * Reads are whole documents, block by block, into a per-client 2 MiB-class buffer:
 *   rocksdb  lkv_cold_get_block per block (a RocksDB Get plus the XXH3-128 tag check that
 *            every cold read does);
 *   pread    one pread(2) per block from the document's file (the ceiling: the same bytes from
 *            the same file system with the page cache in the same state);
 *   pread+tag  pread plus the XXH3-128 computation of the cold tier's tag (a reference that
 *            splits the gap into checksum cost and RocksDB cost).
 *
 * Thread safety: the read functions may be called concurrently for distinct tid.
 */
#ifndef SVC_COLD_H
#define SVC_COLD_H

#include <stddef.h>
#include <stdint.h>

typedef struct svc_cold svc_cold; /* Opaque. */

/* Creates the two copies under dir (created if absent; borrowed) for up to max_clients
 * concurrent readers. Document i has doc_blocks[i] blocks (borrowed array of n_docs entries)
 * of block_bytes bytes, taken from payload (borrowed, at least max(doc_blocks) * block_bytes).
 * *out is owned by the caller, freed with svc_cold_close. Returns 0, LKV_EIO or LKV_EROCKSDB. */
int svc_cold_open(const char *dir, int n_docs, const uint32_t *doc_blocks, size_t block_bytes,
                  const void *payload, int max_clients, svc_cold **out);

/* Closes the database and the files, and frees c; the files stay on disk. c may be NULL. */
void svc_cold_close(svc_cold *c);

/* Reads document doc (0..n_docs-1) for client tid through RocksDB; adds its payload bytes to
 * *bytes. LKV_ECORRUPT if a block's first 8 bytes differ from what was written (the warm-up
 * pass of svc_cold_open compares every byte of both copies). */
int svc_cold_read_rocksdb(svc_cold *c, int tid, int doc, uint64_t *bytes);

/* Same document, same bytes, through pread(2) of its plain file. */
int svc_cold_read_pread(svc_cold *c, int tid, int doc, uint64_t *bytes);

/* Same bytes through pread(2), plus the XXH3-128 tag computation that lkv_cold_get_block
 * does on every block (over the 37-byte block key and the payload; computed, not compared):
 * separates the cost of the tag from the cost of RocksDB. */
int svc_cold_read_pread_tag(svc_cold *c, int tid, int doc, uint64_t *bytes);

/* Bytes of payload stored (each copy). */
uint64_t svc_cold_bytes(const svc_cold *c);

#endif
