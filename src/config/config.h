/*
 * moefit configs: a YAML file (parsed with libyaml, every node keeping its
 * line and column) mapped onto a validated mf_config, with command-line
 * `key.path=value` overrides applied on top.
 *
 *   model:    {path: DIR} or {init: {family: mixtral, hidden: 64, ...}}
 *   data:     {train: FILE.tokens, valid: FILE.tokens, seq_len: 256}
 *   train:    {micro_batch, grad_accum, steps, lr, min_lr, warmup, schedule, ...}
 *   memory:   {device_budget: 8GiB, plan: auto, routing: auto, pinned_limit, host_limit, nvme_dir, overrides}
 *   hardware: {profile: auto}
 *   output:   {dir: runs/demo, checkpoint_every: 100}
 *   backend:  auto | cpu | cuda
 *   kernels:  {expert_gemm: auto, attention: auto}
 *
 * Every key, its type, range and default is listed by mf_config_print_keys
 * (and `moefit config --help`); docs/config.md documents them.
 * An error is MF_ERR_CONFIG (MF_ERR_IO for an unreadable file) whose message
 * starts with the place — "configs/x.yaml:12:3: " (1-based line and column)
 * or "command line: train.lr=bogus: " — and names the key path and the fault.
 * An error between two keys starts with the place of the value that made the
 * pair inconsistent (the later override, else the dependent key: warmup
 * before steps) and ends with where the other one came from: "command line:
 * train.steps=20: train.warmup (30) must be <= train.steps (20); train.warmup
 * is set at configs/demo.yaml:36:3" ("set by override 2 '...'", "not set: its
 * default"). A key missing because an override emptied its section is blamed
 * on that override.
 */
#ifndef MF_CONFIG_H
#define MF_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "src/core/core.h"
#include "src/model/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* memory.* sizes given as `auto`: taken from the machine at start-up. */
#define MF_CONFIG_SIZE_AUTO 0

typedef enum mf_config_schedule {
  MF_CONFIG_SCHEDULE_CONSTANT = 0, /* lr after warmup */
  MF_CONFIG_SCHEDULE_LINEAR,       /* lr → min_lr linearly after warmup */
  MF_CONFIG_SCHEDULE_COSINE,       /* lr → min_lr on a half cosine after warmup */
} mf_config_schedule;

typedef enum mf_config_backend {
  MF_CONFIG_BACKEND_AUTO = 0, /* cuda when a GPU is present, else cpu */
  MF_CONFIG_BACKEND_CPU,
  MF_CONFIG_BACKEND_CUDA,
} mf_config_backend;

/* kernels.expert_gemm: the kernel of bf16 storage's grouped expert GEMMs on
 * cuda. The values are kernels/cuda/backend_cuda.h's MF_CUDA_EXPERT_GEMM_*. */
typedef enum mf_config_expert_gemm {
  MF_CONFIG_EXPERT_GEMM_AUTO = 0, /* the default for the GPU (planner/run_plan.h mf_run_plan_kernels) */
  MF_CONFIG_EXPERT_GEMM_MMA,      /* mma.sync tiles */
  MF_CONFIG_EXPERT_GEMM_CUTLASS,  /* CUTLASS's sm90 grouped GEMM */
} mf_config_expert_gemm;

/* kernels.attention: the kernels of bf16 storage's causal attention on cuda
 * (MF_CUDA_ATTENTION_*). */
typedef enum mf_config_attention {
  MF_CONFIG_ATTENTION_AUTO = 0, /* the default for the GPU */
  MF_CONFIG_ATTENTION_MMA,      /* mma.sync flash kernels */
  MF_CONFIG_ATTENTION_CUDNN,    /* cuDNN's fused flash attention */
} mf_config_attention;

typedef struct mf_config_kernels {
  mf_config_expert_gemm expert_gemm;
  mf_config_attention attention;
} mf_config_kernels;

/* train.micro_batch_order: the order of a step's ops over its micro-batches
 * (src/model/program.h). */
typedef enum mf_config_mb_order {
  MF_CONFIG_MB_ORDER_AUTO = 0, /* the planner plans both and keeps the faster (planner/plan.h mf_plan_for) */
  MF_CONFIG_MB_ORDER_LAYER,    /* layer-major: each layer for every micro-batch, weights loaded once a step */
  MF_CONFIG_MB_ORDER_MICRO,    /* micro-batch-major: each micro-batch's forward and backward in turn */
} mf_config_mb_order;

/* train.adam_moments: the storage of AdamW's m and v (src/optim/optim.h,
 * mf_adamw_update_bufs: computed in fp32, stored rounded to nearest even). */
typedef enum mf_config_moments {
  MF_CONFIG_MOMENTS_FP32 = 0, /* 8 bytes per parameter */
  MF_CONFIG_MOMENTS_BF16,     /* 4 bytes per parameter */
} mf_config_moments;

/* train.precision: the device storage of weights, activations and their
 * gradients (math is fp32 either way; weight gradients, master weights and
 * moments stay as they are). */
typedef enum mf_config_precision {
  MF_CONFIG_PRECISION_AUTO = 0, /* bf16 on the cuda backend, fp32 on cpu (planner/run_plan.h decides) */
  MF_CONFIG_PRECISION_FP32,
  MF_CONFIG_PRECISION_BF16,
} mf_config_precision;

/* train.overlap_optimizer. */
typedef enum mf_config_overlap {
  MF_CONFIG_OVERLAP_AUTO = 0, /* on for the cuda backend, off on cpu (planner/run_plan.h decides) */
  MF_CONFIG_OVERLAP_ON,
  MF_CONFIG_OVERLAP_OFF,
} mf_config_overlap;

/* memory.staging. */
typedef enum mf_config_staging {
  MF_CONFIG_STAGING_AUTO = 0, /* on for the cuda backend, off on cpu (planner/run_plan.h decides) */
  MF_CONFIG_STAGING_ON,
  MF_CONFIG_STAGING_OFF,
} mf_config_staging;

typedef struct mf_config_model {
  char *path;         /* HF checkpoint directory; NULL when has_init */
  int has_init;       /* 1: a random model of shape `init` */
  mf_model_spec init; /* validated; head_dim resolved */
} mf_config_model;

typedef struct mf_config_data {
  char *train;     /* token file */
  char *valid;     /* NULL: no validation */
  int64_t seq_len; /* tokens per sequence */
} mf_config_data;

/* train.lora: low-rank adapters over a frozen base (src/model/params.h
 * mf_lora; src/train mf_run_lora turns this into the table's adapters). */
#define MF_CONFIG_LORA_MAX_TARGETS 16
#define MF_CONFIG_LORA_NAME_MAX 32 /* kv_a_proj_with_mqa: 18 */
typedef enum mf_config_lora_experts {
  MF_CONFIG_LORA_EXPERTS_ALL = 0,
  MF_CONFIG_LORA_EXPERTS_HOT
} mf_config_lora_experts;
typedef struct mf_config_lora {
  int64_t rank;   /* r; 0: off (every weight trained) */
  double alpha;   /* the adapters' output scale is alpha / rank; NAN (null): rank, a scale of 1 */
  double dropout; /* on the adapters' input, in [0, 1) */
  char targets[MF_CONFIG_LORA_MAX_TARGETS][MF_CONFIG_LORA_NAME_MAX]; /* HF module names */
  int64_t n_targets;
  mf_config_lora_experts experts; /* all routed experts, or each layer's most routed (hot_fraction) */
  double hot_fraction;
  int train_router; /* the router weights trained fully beside the adapters */
  int base_dtype;   /* the frozen base at home: 0 bf16 (the checkpoint's float values), an mf_quant_kind (1 nf4,
                       2 fp8), or MF_CONFIG_BASE_AUTO (as the checkpoint ships it) */
  int64_t base_blocksize; /* NF4's block size */
  int base_double_quant;  /* NF4's absmax quantized again (bitsandbytes' compress_statistics) */
} mf_config_lora;

#define MF_CONFIG_BASE_AUTO 3 /* train.lora.base_dtype auto (the enum's 4th choice) */

typedef struct mf_config_train {
  int64_t micro_batch; /* sequences per micro-batch */
  int64_t grad_accum;  /* micro-batches per optimizer step */
  int64_t steps;       /* optimizer steps */
  double lr;           /* peak learning rate */
  double min_lr;       /* the schedule's floor (linear, cosine) */
  int64_t warmup;      /* linear warmup steps, <= steps */
  mf_config_schedule schedule;
  double weight_decay;      /* AdamW decoupled weight decay */
  double beta1, beta2, eps; /* AdamW */
  double grad_clip;         /* global L2 norm; 0 = off */
  double aux_loss_coef;     /* NAN (printed null): the model's router_aux_loss_coef */
  uint64_t seed;            /* data order, router jitter */
  int64_t threads;          /* host worker threads; 0 = all online CPUs */
  int64_t log_every;        /* steps between progress lines */
  int64_t eval_every;       /* steps between validation runs; 0 = only at the end */
  int64_t max_skipped_steps; /* steps skipped for non-finite values before the run stops; 0 = no limit */
  mf_config_mb_order micro_batch_order;
  mf_config_overlap overlap_optimizer; /* host AdamW of step k behind step k+1's device work (same bits) */
  mf_config_moments adam_moments; /* m and v stored in fp32 or bf16 */
  mf_config_precision precision;  /* device storage: fp32 or bf16 */
  mf_config_lora lora;
} mf_config_train;

/* One entry of memory.overrides, stored as written: the planner checks the
 * decisions (a NULL decision is left to the planner). */
typedef struct mf_config_mem_override {
  char *match;  /* tensor-name pattern */
  char *params; /* decision strings, NULL when not given */
  char *activations;
  char *grads;
  char *optimizer; /* host | device; device pins params resident and grads device with it (plan_io.h) */
  char *where; /* "file:line:column" or "command line: ..." for messages */
} mf_config_mem_override;

/* memory.plan: which plan `train` runs. The words are the planner's baselines
 * (planner/plan.h); a value ending in ".json" is a plan file. */
typedef enum mf_config_plan {
  MF_CONFIG_PLAN_AUTO = 0,      /* the planner chooses within device_budget (auto: all resident) */
  MF_CONFIG_PLAN_RESIDENT,      /* everything on the device */
  MF_CONFIG_PLAN_ZERO_OFFLOAD,  /* weights resident, gradients streamed home */
  MF_CONFIG_PLAN_MEGATRAIN,     /* weights streamed, layers recomputed */
  MF_CONFIG_PLAN_CHECKPOINT,    /* weights resident, layers recomputed */
  MF_CONFIG_PLAN_LEAST_MEMORY,  /* the least-memory plan */
  MF_CONFIG_PLAN_FILE,          /* decisions read from the file memory.plan names */
} mf_config_plan;

/* memory.routing: the routing statistics the planner plans with
 * (experts/routing.h). */
typedef enum mf_config_routing {
  MF_CONFIG_ROUTING_AUTO = 0, /* <output.dir>/routing.json when that file exists, else uniform */
  MF_CONFIG_ROUTING_NONE,     /* uniform routing */
  MF_CONFIG_ROUTING_FILE,     /* the file memory.routing names */
} mf_config_routing;

typedef struct mf_config_memory {
  uint64_t device_budget; /* bytes; MF_CONFIG_SIZE_AUTO = auto */
  char *plan;               /* memory.plan as written: a word of mf_config_plan or a path */
  mf_config_plan plan_kind; /* what `plan` says (derived, not a key) */
  char *routing;                  /* memory.routing as written: auto, none or a path */
  mf_config_routing routing_kind; /* what `routing` says (derived, not a key) */
  uint64_t pinned_limit;
  mf_config_staging staging; /* copies through the pinned staging arena (src/exec/exec.h) */
  int pinned_home; /* the home regions that cross the link pinned where pinned_limit allows (run_plan.h) */
  uint64_t host_limit;
  char *nvme_dir; /* NULL: no NVMe spill */
  /* train.adam_moments, copied here for the host accounting (planner/host.h;
   * derived, not a key) */
  mf_config_moments adam_moments;
  size_t n_overrides;
  mf_config_mem_override *overrides;
} mf_config_memory;

/* parallel: how the ranks of an mpirun share the work. */
typedef struct mf_config_parallel {
  int64_t expert; /* expert-parallel ranks (1: none, every rank holds every expert) */
} mf_config_parallel;

typedef struct mf_config_hardware {
  char *profile; /* "auto" (measure / detect) or a profile file */
} mf_config_hardware;

/* output.checkpoint_async. */
typedef enum mf_config_ckpt_async {
  MF_CONFIG_CKPT_ASYNC_AUTO = 0, /* on when its snapshot takes at most half the host's free memory */
  MF_CONFIG_CKPT_ASYNC_ON,
  MF_CONFIG_CKPT_ASYNC_OFF,
} mf_config_ckpt_async;

typedef struct mf_config_output {
  char *dir;                /* run directory: checkpoints, logs, metrics */
  int64_t checkpoint_every; /* steps; 0 = only at the end */
  char *checkpoint_compression; /* "none" or "zstd-N" (N 1..19) as written */
  int checkpoint_zstd;          /* its level; 0: none (derived, not a key) */
  int64_t keep_checkpoints;     /* complete checkpoints kept; 0: all */
  mf_config_ckpt_async checkpoint_async; /* written from a snapshot while training goes on */
} mf_config_output;

typedef struct mf_config {
  char *source; /* the file (or name) it was loaded from */
  char **where; /* per key: where its value came from (mf_config_where; private) */
  mf_config_model model;
  mf_config_data data;
  mf_config_train train;
  mf_config_memory memory;
  mf_config_hardware hardware;
  mf_config_parallel parallel;
  mf_config_output output;
  mf_config_backend backend;
  mf_config_kernels kernels;
  /* Not a key: the data-parallel ranks the run has (mpirun's world size, or
   * `moefit plan --ranks N`); 0 or 1: one. Set by the command before planning. */
  int64_t ranks;
  int64_t node_ranks; /* of them, on one machine (0: all) */
  int64_t ep_rank;    /* with parallel.expert > 1: this rank's place among the expert-parallel ranks */
  int64_t ep_group;   /* and its group of them, with more ranks than parallel.expert (0: the first) */
  int device;         /* the CUDA device this process uses (a rank's: its local rank's GPU); default 0 */
} mf_config;

/* Loads `path`, applies the overrides in order ("key.path=value"; the value is
 * read as YAML, so `train.lr=1e-4`, `data.valid=null`,
 * `model.init.mlp_only_layers=[0,2]`; a map or list value replaces the whole
 * entry), fills the defaults and checks everything. *out is NULL on failure. */
mf_status mf_config_load(const char *path, const char *const *overrides, size_t n_overrides, mf_config **out);
/* The same from text in memory; `name` stands for the file in messages and
 * gives output.dir its default (runs/<name without directory and extension>). */
mf_status mf_config_load_string(const char *text, size_t len, const char *name, const char *const *overrides,
                                size_t n_overrides, mf_config **out);
void mf_config_free(mf_config *cfg); /* NULL is fine */

/* What a config is loaded for: each command requires only the keys it uses.
 * Every one needs the model (model.path or model.init); TRAIN also data.train
 * and train.steps (mf_config_load); PLAN and EVAL neither (eval's tokens come
 * from --tokens, data.valid or data.train; plan reads no data). The keys not
 * given take their defaults; train.warmup is checked against train.steps only
 * when train.steps is given. */
typedef enum mf_config_use {
  MF_CONFIG_FOR_TRAIN = 0,
  MF_CONFIG_FOR_PLAN,
  MF_CONFIG_FOR_EVAL,
} mf_config_use;

/* libyaml's problem at 0-based (line, col) of text restated when it is a tab
 * ("tabs are not allowed for indentation in YAML: indent with spaces"), else
 * NULL: for every reader of YAML files (configs, hardware profiles). */
const char *mf_yaml_tab_problem(const char *text, size_t len, size_t line, size_t col);

mf_status mf_config_load_for(const char *path, const char *const *overrides, size_t n_overrides, mf_config_use use,
                             mf_config **out);
/* The same from text in memory (`name` as mf_config_load_string's): what a
 * reader that has verified a file's bytes loads, rather than the file again. */
mf_status mf_config_load_string_for(const char *text, size_t len, const char *name, const char *const *overrides,
                                    size_t n_overrides, mf_config_use use, mf_config **out);

/* Where the value of key `path` came from, for the messages of checks made
 * after loading (eval checks data.seq_len against the model it loads):
 * "configs/x.yaml:28:3" (its key in the file) or "command line:
 * data.seq_len=4096" (the override that set it); NULL when the key took its
 * default or is not a key. */
const char *mf_config_where(const mf_config *cfg, const char *path);

/* Writes the resolved config as YAML, every default filled in; loading the
 * output gives a config equal to `cfg`. MF_ERR_IO when the write fails. */
mf_status mf_config_print(const mf_config *cfg, FILE *f);
/* 1 when every setting is equal (`source` is not compared; NaN equals NaN). */
int mf_config_equal(const mf_config *a, const mf_config *b);
/* The keys whose values differ between a and b, in key-table order: up to
 * `cap` of their paths (static strings, "model.init" when only one has an
 * init) into paths; returns how many differ. */
size_t mf_config_diff(const mf_config *a, const mf_config *b, const char **paths, size_t cap);
/* One line per key: path, default, type and meaning (for --help). */
void mf_config_print_keys(FILE *f);

const char *mf_config_schedule_name(mf_config_schedule s); /* "cosine" */
const char *mf_config_backend_name(mf_config_backend b);   /* "auto" */
const char *mf_config_mb_order_name(mf_config_mb_order o); /* "layer" */
const char *mf_config_moments_name(mf_config_moments m);   /* "bf16" */
/* The memory.plan word of a baseline ("zero_offload"); "auto" for AUTO, NULL for FILE. */
const char *mf_config_plan_word(mf_config_plan p);

#ifdef __cplusplus
}
#endif

#endif /* MF_CONFIG_H */
