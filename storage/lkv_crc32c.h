/*
 * lkv_crc32c.h: hardware CRC32c for RocksDB's own checksums.
 *
 * Why. Debian's librocksdb 7.8 is a portable build: its CRC32c (rocksdb::crc32c::Extend, used
 * for every WAL record, every blob record, every SST block and every checksum check) is a
 * table-driven software loop at about 1.5 GB/s, and it was most of the write-back writer's time
 * (perf: ~50% of lazykvd's samples during a put run, bench/RESULTS.md). The library calls its
 * exported rocksdb::crc32c::Extend through the PLT at each of its 37 call sites (no
 * -Bsymbolic), so a definition of that symbol in the executable takes precedence for all of
 * them. lkv_crc32c.c defines it: CRC32c (Castagnoli, reflected polynomial 0x82F63B78, with
 * RocksDB's pre/post inversion) with the SSE4.2 crc32 instruction over three interleaved streams
 * combined by a multiplication modulo P: the same values, about 10x faster.
 *
 * Safety. The result is the same CRC, bit for bit (storage.crc32c compares it with the
 * library's own function, found with dlsym(RTLD_NEXT), on random buffers of every alignment and
 * length, and with the standard check value), so files written either way read the same. On a
 * CPU without SSE4.2 the definition calls the library's own function. The symbol must be in the
 * executable's dynamic symbol table: storage/CMakeLists.txt passes
 * --export-dynamic-symbol for every executable that links lkv_storage; lkv_crc32c_active()
 * says whether the interposition took effect (lkv_cold logs it at open).
 */
#ifndef LKV_CRC32C_H
#define LKV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32c of data[0..n) continuing from crc (0 to start), as rocksdb::crc32c::Extend: the
 * standard conditioned value (crc32c("123456789") = 0xE3069283). data is borrowed; NULL only
 * when n is 0. Uses the SSE4.2 path when the CPU has it, else a portable loop. */
uint32_t lkv_crc32c_extend(uint32_t crc, const void *data, size_t n);

/* 1 if RocksDB's calls to rocksdb::crc32c::Extend reach lazykv's hardware CRC32c (the symbol is
 * interposed and the CPU has SSE4.2); 0 if they reach the library's own function. */
int lkv_crc32c_active(void);

/* A one-line description for the log, e.g. "hardware (SSE4.2, 3 streams; interposed over
 * librocksdb's software CRC32c)". Static storage; never NULL. */
const char *lkv_crc32c_describe(void);

#endif
