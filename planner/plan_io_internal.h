/*
 * What planner/plan_io.c (writing, memory.overrides) and plan_io_read.c
 * (reading) share: the format's words and which tensors a plan decides.
 */
#ifndef MF_PLANNER_PLAN_IO_INTERNAL_H
#define MF_PLANNER_PLAN_IO_INTERNAL_H

#include <stdint.h>

#include "planner/plan_io.h"

#define MF_PLAN_FORMAT "moefit-plan"
/* 5: the kernels; 4: device storage and the backend's bytes; 3: optimizer
 * placement; 2: staging and host figures; 1 to 4 still read. */
#define MF_PLAN_VERSION 6
#define MF_PLAN_OPTIM_WORDS "host, device"
/* "kernels" (version 5): the words each takes. */
#define MF_PLAN_EXPERT_GEMM_WORDS "cpu, cuda-core, mma, cutlass"
#define MF_PLAN_ATTENTION_WORDS "cpu, cuda-core, mma, cudnn"
/* 1 when w is one of `words` (", "-separated). */
int mf_plan_io_kernel_ok(const char *w, const char *words);

/* The kinds of a plan's entries ("kind"). */
enum { MF_PLAN_K_PARAM = 0, MF_PLAN_K_GRAD, MF_PLAN_K_ACT, MF_PLAN_K_COUNT_ };
extern const char *const mf_plan_io_kind_names[MF_PLAN_K_COUNT_]; /* "param", "grad", "act" */
extern const char *const mf_plan_io_kind_words[MF_PLAN_K_COUNT_]; /* each kind's decisions, for messages */

const char *mf_plan_io_decision_name(int kind, int dec);
int mf_plan_io_decision_from_word(int kind, const char *w); /* or -1 */
int mf_plan_io_optim_from_word(const char *w);              /* "host" / "device" -> mf_optim_dec, or -1 */
/* The plan's entry kind of program tensor t, or -1 when a plan says nothing about it. */
int mf_plan_io_kind_of(const mf_program *p, int32_t t);
/* batch.storage: "fp32" for F32, "bf16" for BF16, NULL for any other dtype. */
const char *mf_plan_io_storage_name(mf_dtype storage);

/* mf_schedule_act_options for every tensor, in one pass over the program
 * (mf_schedule_can_recompute indexes the whole program on each call: once per
 * activation, that made writing and reading a real-size plan take seconds).
 * (*out)[t] & MF_PLAN_ACT_CAN_RECOMPUTE: t may be recomputed. Free with free(). */
#define MF_PLAN_ACT_CAN_RECOMPUTE 2
mf_status mf_plan_io_act_options(const mf_program *p, uint8_t **out);

#endif /* MF_PLANNER_PLAN_IO_INTERNAL_H */
