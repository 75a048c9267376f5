/*
 * lkv_backend_cpu.h: the CPU backend of the model runner (lkv_backend.h): fp32 loops for the
 * dense ops, the LazyAttention CPU reference (kernels/lkv_attn_cpu.c) for attention and the
 * Block-Attention materialise, exact-angle RoPE (kernels/lkv_posenc.h), and the sampler.
 * Backend memory is host memory. Stateless: one shared table serves every thread.
 */
#ifndef LKV_BACKEND_CPU_H
#define LKV_BACKEND_CPU_H

#include "lkv_backend.h"

/* Returns the CPU backend (a static table: borrowed, valid for the process lifetime). */
const lkv_backend *lkv_backend_cpu(void);

#endif
