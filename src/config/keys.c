/*
 * The key table: every config key with its type, range, default and meaning.
 * config.c maps and checks through it, print.c prints from it and --help
 * lists it, so a key added here is parsed, printed and documented at once.
 * Defaults are YAML text parsed like a value in a file, unless MF_CK_DOCDEF
 * (then they are set in code: model.init keys come from the family).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "src/config/config_impl.h"

#define NOLO (-HUGE_VAL)
#define NOHI HUGE_VAL
#define SEC(p, fl, help) \
  { p, MF_CK_SECTION, fl, 0, NOLO, NOHI, NULL, NULL, help }
#define KEY(p, kind, fl, member, lo, hi, choices, def, help) \
  { p, kind, fl, offsetof(mf_config, member), lo, hi, choices, def, help }
#define INIT(p, kind, fl, member, lo, hi, help) \
  KEY("model.init." p, kind, MF_CK_DOCDEF | (fl), model.init.member, lo, hi, NULL, "family", help)

const mf_config_key mf_config_keys[] = {
    SEC("model", MF_CK_REQUIRED, "the model: exactly one of model.path and model.init"),
    KEY("model.path", MF_CK_STR, MF_CK_NULLABLE | MF_CK_DOCDEF, model.path, NOLO, NOHI, NULL, "-",
        "Hugging Face checkpoint directory (config.json + *.safetensors)"),
    SEC("model.init", 0, "a new, randomly initialised model of this shape (instead of model.path)"),
    KEY("model.init.family", MF_CK_FAMILY, MF_CK_REQUIRED, model.init.family, NOLO, NOHI,
        "mixtral|qwen2_moe|qwen3_moe|olmoe|glm4_moe|deepseek_v3|gpt_oss", NULL,
        "model family; its transformers defaults fill the keys left out"),
    INIT("hidden", MF_CK_INT, 0, hidden, 1, 1 << 24, "hidden size"),
    INIT("layers", MF_CK_INT, 0, layers, 1, MF_MAX_LAYERS, "decoder layers"),
    INIT("heads", MF_CK_INT, 0, heads, 1, 4096, "attention (query) heads"),
    INIT("kv_heads", MF_CK_INT, 0, kv_heads, 1, 4096, "key/value heads (GQA); must divide heads"),
    KEY("model.init.head_dim", MF_CK_INT, MF_CK_DOCDEF, model.init.head_dim, 1, 65536, NULL, "hidden/heads",
        "dimension of one attention head (even)"),
    INIT("experts", MF_CK_INT, 0, experts, 1, 65536, "routed experts per MoE layer"),
    INIT("top_k", MF_CK_INT, 0, top_k, 1, 65536, "experts per token (<= experts)"),
    INIT("expert_ffn", MF_CK_INT, 0, expert_ffn, 1, 1 << 24, "intermediate size of a routed expert"),
    INIT("dense_ffn", MF_CK_INT, 0, dense_ffn, 0, 1 << 24, "intermediate size of dense-MLP layers; 0: none"),
    INIT("shared_ffn", MF_CK_INT, 0, shared_ffn, 0, 1 << 24,
         "shared-expert intermediate size (qwen2_moe; glm4_moe: a multiple of expert_ffn); 0: none"),
    INIT("vocab", MF_CK_INT, 0, vocab, 1, 2147483648.0, "vocabulary size"),
    INIT("max_seq", MF_CK_INT, 0, max_seq, 1, 1099511627776.0, "max positions (max_position_embeddings)"),
    INIT("rope_theta", MF_CK_FLOAT, MF_CK_LO_OPEN, rope_theta, 0, NOHI, "RoPE base"),
    INIT("norm_eps", MF_CK_FLOAT, MF_CK_LO_OPEN | MF_CK_HI_OPEN, norm_eps, 0, 1, "RMSNorm epsilon"),
    INIT("norm_topk_prob", MF_CK_BOOL, 0, norm_topk_prob, NOLO, NOHI,
         "renormalise the top-k routing weights"),
    INIT("tie_embeddings", MF_CK_BOOL, 0, tie_embeddings, NOLO, NOHI, "lm_head shares the embedding matrix"),
    INIT("qkv_bias", MF_CK_BOOL, 0, qkv_bias, NOLO, NOHI, "q/k/v projections have a bias (qwen2_moe)"),
    INIT("decoder_sparse_step", MF_CK_INT, 0, decoder_sparse_step, 1, MF_MAX_LAYERS,
         "layer i is MoE iff (i+1) % step == 0 (qwen)"),
    KEY("model.init.mlp_only_layers", MF_CK_INTLIST, MF_CK_DOCDEF, model.init.mlp_only_layers, 0,
        MF_MAX_LAYERS - 1, NULL, "[]", "layers with a dense MLP instead of experts (qwen)"),
    INIT("router_aux_loss_coef", MF_CK_FLOAT, 0, router_aux_loss_coef, 0, NOHI,
         "the model's load-balancing loss weight"),
    INIT("router_jitter", MF_CK_FLOAT, MF_CK_HI_OPEN, router_jitter, 0, 1,
         "router input jitter noise (mixtral); 0: off"),
    INIT("clip_qkv", MF_CK_FLOAT, 0, clip_qkv, 0, NOHI, "clamp q, k, v to +-clip_qkv (olmoe); 0: off"),
    INIT("partial_rotary", MF_CK_FLOAT, MF_CK_LO_OPEN, partial_rotary, 0, 1,
         "the fraction of each head RoPE rotates (glm4_moe: partial_rotary_factor)"),
    INIT("first_dense", MF_CK_INT, 0, first_dense, 0, MF_MAX_LAYERS,
         "the first layers with a dense MLP (glm4_moe: first_k_dense_replace)"),
    INIT("n_group", MF_CK_INT, 0, n_group, 1, 65536, "expert groups of the sigmoid router (glm4_moe)"),
    INIT("topk_group", MF_CK_INT, 0, topk_group, 1, 65536, "groups a token's experts come from (glm4_moe)"),
    INIT("q_lora_rank", MF_CK_INT, 0, q_lora_rank, 0, 1 << 24,
         "deepseek_v3: the rank of q's low-rank projection (q_a_proj, q_b_proj); 0: q_proj"),
    INIT("kv_lora_rank", MF_CK_INT, 0, kv_lora_rank, 0, 1 << 24,
         "deepseek_v3: the rank of the compressed kv"),
    INIT("qk_nope_dim", MF_CK_INT, 0, qk_nope_dim, 0, 65536,
         "deepseek_v3: the dims of a q/k head RoPE leaves"),
    INIT("qk_rope_dim", MF_CK_INT, 0, qk_rope_dim, 0, 65536,
         "deepseek_v3: the dims of a q/k head RoPE rotates"),
    INIT("v_head_dim", MF_CK_INT, 0, v_head_dim, 0, 65536, "deepseek_v3: the dims of a value head"),
    INIT("rope_interleave", MF_CK_BOOL, 0, rope_interleave, NOLO, NOHI,
         "deepseek_v3: RoPE on adjacent pairs (transformers' rope_interleave)"),
    INIT("sliding_window", MF_CK_INT, 0, sliding_window, 0, 1099511627776.0,
         "gpt_oss: the keys an even (sliding_attention) layer's query sees, itself included"),
    INIT("routed_scaling", MF_CK_FLOAT, MF_CK_LO_OPEN, routed_scaling, 0, 1e6,
         "factor on the routed experts' weights (glm4_moe: routed_scaling_factor)"),
    KEY("model.init.seed", MF_CK_U64, MF_CK_DOCDEF, model.init.seed, NOLO, NOHI, NULL, "1",
        "seed of the random init"),

    SEC("data", MF_CK_REQUIRED, "token files and sequence length"),
    KEY("data.train", MF_CK_STR, MF_CK_REQUIRED, data.train, NOLO, NOHI, NULL, NULL,
        "training token file (from `moefit data`)"),
    KEY("data.valid", MF_CK_STR, MF_CK_NULLABLE, data.valid, NOLO, NOHI, NULL, "null",
        "validation token file; null: none"),
    KEY("data.seq_len", MF_CK_INT, 0, data.seq_len, 1, 1 << 24, NULL, "256", "tokens per sequence"),

    SEC("train", MF_CK_REQUIRED, "optimisation"),
    KEY("train.micro_batch", MF_CK_INT, 0, train.micro_batch, 1, 1 << 20, NULL, "1",
        "sequences per micro-batch"),
    KEY("train.grad_accum", MF_CK_INT, 0, train.grad_accum, 1, 1 << 20, NULL, "1",
        "micro-batches per optimizer step"),
    KEY("train.micro_batch_order", MF_CK_ENUM, 0, train.micro_batch_order, NOLO, NOHI, "auto|layer|micro",
        "auto",
        "op order over the micro-batches: layer (each layer for all micro-batches; streamed weights loaded "
        "once "
        "per step, every micro-batch's activations held), micro (each micro-batch in turn), auto (the "
        "planner plans "
        "both and keeps the faster)"),
    KEY("train.overlap_optimizer", MF_CK_ENUM, 0, train.overlap_optimizer, NOLO, NOHI, "auto|true|false",
        "auto",
        "true: run the host AdamW of a step while the next step's device work goes on (each parameter's "
        "upload "
        "waits for its own update; the same bits as false); false: after each step; auto: the one the "
        "planner predicts faster on the cuda backend, false on cpu (whose device work runs on the same "
        "cores)"),
    KEY("train.adam_moments", MF_CK_ENUM, 0, train.adam_moments, NOLO, NOHI, "fp32|bf16", "fp32",
        "storage of the AdamW moments m and v: fp32 (8 bytes per parameter) or bf16 (4 bytes; each update "
        "computes in fp32 and stores m and v rounded to nearest even)"),
    KEY("train.precision", MF_CK_ENUM, 0, train.precision, NOLO, NOHI, "auto|fp32|bf16", "auto",
        "device storage of weights, activations and their gradients: bf16 (2 bytes a value on the device and "
        "in every transfer; the math accumulates in fp32; weight gradients, fp32 master weights and AdamW "
        "moments stay at home in their own dtypes; on cpu each kernel rounds what it stores, as cuda does) "
        "or "
        "fp32; auto: bf16 on the cuda backend, fp32 on cpu (exact parity with PyTorch fp32)"),
    KEY("train.steps", MF_CK_INT, MF_CK_REQUIRED, train.steps, 1, 1e12, NULL, NULL, "optimizer steps"),
    KEY("train.lr", MF_CK_FLOAT, MF_CK_LO_OPEN, train.lr, 0, 1e3, NULL, "1e-4", "peak learning rate"),
    KEY("train.min_lr", MF_CK_FLOAT, 0, train.min_lr, 0, 1e3, NULL, "0.0",
        "learning rate at the end of a linear or cosine schedule (<= lr)"),
    KEY("train.warmup", MF_CK_INT, 0, train.warmup, 0, 1e12, NULL, "0",
        "linear warmup steps from 0 to lr (<= steps)"),
    KEY("train.schedule", MF_CK_ENUM, 0, train.schedule, NOLO, NOHI, "constant|linear|cosine", "cosine",
        "learning-rate decay after warmup"),
    KEY("train.weight_decay", MF_CK_FLOAT, 0, train.weight_decay, 0, NOHI, NULL, "0.0",
        "AdamW decoupled weight decay"),
    KEY("train.beta1", MF_CK_FLOAT, MF_CK_HI_OPEN, train.beta1, 0, 1, NULL, "0.9", "AdamW beta1"),
    KEY("train.beta2", MF_CK_FLOAT, MF_CK_HI_OPEN, train.beta2, 0, 1, NULL, "0.999", "AdamW beta2"),
    KEY("train.eps", MF_CK_FLOAT, MF_CK_LO_OPEN, train.eps, 0, 1, NULL, "1e-8", "AdamW epsilon"),
    KEY("train.grad_clip", MF_CK_FLOAT, 0, train.grad_clip, 0, NOHI, NULL, "1.0",
        "clip the global gradient L2 norm; 0: off"),
    KEY("train.aux_loss_coef", MF_CK_FLOAT, MF_CK_NULLABLE, train.aux_loss_coef, 0, NOHI, NULL, "null",
        "router load-balancing loss weight; null: the model's router_aux_loss_coef"),
    KEY("train.seed", MF_CK_U64, 0, train.seed, NOLO, NOHI, NULL, "1",
        "seed of the data order and router jitter"),
    KEY("train.threads", MF_CK_INT, 0, train.threads, 0, 4096, NULL, "0",
        "host worker threads; 0: all online CPUs"),
    KEY("train.log_every", MF_CK_INT, 0, train.log_every, 1, 1e12, NULL, "10",
        "steps between progress lines"),
    KEY("train.eval_every", MF_CK_INT, 0, train.eval_every, 0, 1e12, NULL, "0",
        "steps between validation runs (with data.valid); 0: at the end only"),
    KEY("train.max_skipped_steps", MF_CK_INT, 0, train.max_skipped_steps, 0, 1e12, NULL, "10",
        "steps skipped for non-finite gradients or loss (counted over the whole run, resumes included) "
        "before "
        "the run stops with a checkpoint and an error: a few skips are a spike, more are a run that diverged "
        "and would otherwise spend its remaining steps changing nothing; 0: no limit"),

    SEC("train.lora", 0,
        "LoRA: low-rank adapters trained over a frozen base (PEFT's maths and adapter format)"),
    KEY("train.lora.rank", MF_CK_INT, 0, train.lora.rank, 0, 4096, NULL, "0",
        "adapter rank r; 0: off (full fine-tuning: every weight trained)"),
    KEY("train.lora.alpha", MF_CK_FLOAT, MF_CK_NULLABLE | MF_CK_LO_OPEN, train.lora.alpha, 0, NOHI, NULL,
        "null",
        "the adapters' output is scaled by alpha / rank (PEFT's lora_alpha); null: rank (a scale of 1)"),
    KEY("train.lora.dropout", MF_CK_FLOAT, MF_CK_HI_OPEN, train.lora.dropout, 0, 1, NULL, "0.0",
        "dropout on each adapter's input in training (PEFT's lora_dropout); its masks are a function of "
        "train.seed, the step and the micro-batch, the same for any plan, number of ranks or resume"),
    KEY("train.lora.targets", MF_CK_NAMELIST, MF_CK_DOCDEF, train.lora.targets, NOLO, NOHI,
        "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|w1|w2|w3|q_a_proj|q_b_proj|kv_a_proj_with_"
        "mqa|"
        "kv_b_proj",
        "[q_proj, k_proj, v_proj, o_proj]",
        "the HF module names that get adapters (PEFT's target_modules): attention q_proj, k_proj, v_proj, "
        "o_proj; MLP and expert gate_proj, up_proj, down_proj (qwen2_moe, qwen3_moe, olmoe: routed, shared "
        "and dense alike), w1, w3, w2 for Mixtral's experts; q_a_proj, q_b_proj, kv_a_proj_with_mqa, "
        "kv_b_proj for "
        "deepseek_v3's latent attention"),
    KEY("train.lora.experts", MF_CK_ENUM, 0, train.lora.experts, NOLO, NOHI, "all|hot", "all",
        "routed experts that get adapters (when targets name an expert projection): all, or hot: each "
        "layer's most routed by the measured routing statistics (memory.routing: a routing.json that a run "
        "on this model wrote; refused without one; a resume or export keeps the checkpoint's set)"),
    KEY("train.lora.hot_fraction", MF_CK_FLOAT, MF_CK_LO_OPEN, train.lora.hot_fraction, 0, 1, NULL, "0.25",
        "with experts: hot, the share of each layer's experts that get adapters"),
    KEY("train.lora.train_router", MF_CK_BOOL, 0, train.lora.train_router, NOLO, NOHI, NULL, "false",
        "train the router (gate) weights fully beside the adapters"),
    KEY("train.lora.base_dtype", MF_CK_ENUM, 0, train.lora.base_dtype, NOLO, NOHI, "bf16|nf4|fp8|auto",
        "auto",
        "how the frozen base is stored at home, crosses the link and sits on the device: auto (as the "
        "checkpoint ships it: a bitsandbytes 4-bit checkpoint stays nf4 as shipped, a float one is kept in "
        "bf16), bf16 (the checkpoint's values; a 4-bit one dequantized at load), nf4 (QLoRA: bitsandbytes' "
        "4-bit NormalFloat, quantized at load exactly as bitsandbytes does) or fp8 (e4m3 in 128x128 blocks, "
        "as transformers' FP8 quantizer); every frozen linear weight but the LM head is quantized "
        "(attention, routers, experts, shared experts, dense MLPs) and dequantized on the device just "
        "before each use"),
    KEY("train.lora.base_blocksize", MF_CK_INT, 0, train.lora.base_blocksize, 32, 4096, NULL, "64",
        "with base_dtype nf4, the elements that share one scale (a power of two; 64 is QLoRA's; a checkpoint "
        "shipped 4-bit has its own)"),
    KEY("train.lora.base_double_quant", MF_CK_BOOL, 0, train.lora.base_double_quant, NOLO, NOHI, NULL,
        "false",
        "with base_dtype nf4, quantize the scales again to 8 bits in blocks of 256 (QLoRA's double "
        "quantization: 0.127 bits a weight instead of 0.5)"),

    SEC("memory", 0, "memory budgets"),
    KEY("memory.device_budget", MF_CK_SIZE, 0, memory.device_budget, NOLO, NOHI, NULL, "auto",
        "device memory the plan may use, all included; auto: from the device at start-up"),
    KEY("memory.plan", MF_CK_STR, 0, memory.plan, NOLO, NOHI, NULL, "auto",
        "the plan train runs: auto (the planner's, within device_budget), a baseline (resident, "
        "zero_offload, "
        "megatrain, checkpoint, least_memory) or a plan file (*.json, from `moefit plan --json`)"),
    KEY("memory.routing", MF_CK_STR, 0, memory.routing, NOLO, NOHI, NULL, "auto",
        "routing statistics the planner plans with: auto (<output.dir>/routing.json, as train writes it, "
        "when "
        "it exists, else uniform), none (uniform) or a routing file (*.json)"),
    KEY("memory.pinned_limit", MF_CK_SIZE, 0, memory.pinned_limit, NOLO, NOHI, NULL, "auto",
        "pinned host memory (<= host_limit): the pinned home (memory.pinned_home), the offloaded "
        "activations' "
        "host copies and the staging arena; auto: the pinned home within half of host_limit, the rest "
        "unbounded"),
    KEY("memory.staging", MF_CK_ENUM, 0, memory.staging, NOLO, NOHI, "auto|true|false", "auto",
        "true: a planned run copies between host memory and the device through the compact pinned staging "
        "arena (laid out by the planner, within pinned_limit); false: straight; auto: true on the cuda "
        "backend "
        "(copies from pageable memory cannot overlap there), false on cpu (where it only adds a copy)"),
    KEY("memory.pinned_home", MF_CK_BOOL, 0, memory.pinned_home, NOLO, NOHI, NULL, "true",
        "pin the host regions that cross the link every step (the bf16 working copy of streamed weights, "
        "gradient sums that land once a step) where pinned_limit allows (auto: half of host_limit), so "
        "their copies go straight, with no host copy through the staging arena; false: stage them"),
    KEY("memory.host_limit", MF_CK_SIZE, 0, memory.host_limit, NOLO, NOHI, NULL, "auto",
        "host memory for weights, optimizer state, offloaded activations; auto: from the machine"),
    KEY("memory.nvme_dir", MF_CK_STR, MF_CK_NULLABLE, memory.nvme_dir, NOLO, NOHI, NULL, "null",
        "directory for spill past host_limit; null: no NVMe"),
    KEY("memory.overrides", MF_CK_OVERRIDES, MF_CK_DOCDEF, memory.overrides, NOLO, NOHI, NULL, "[]",
        "planner decisions to force: [{match: PATTERN, params|activations|grads|optimizer: DECISION}]"),

    SEC("hardware", 0, "the machine"),
    KEY("hardware.profile", MF_CK_STR, 0, hardware.profile, NOLO, NOHI, NULL, "auto",
        "a hardware profile file (configs/hw/, or what `moefit profile` writes) or auto: on cpu "
        "runs/hw/cpu.yaml, which train, eval, plan and bench kernels measure once (as `moefit profile "
        "--quick`, some "
        "seconds) when it is missing; on cuda "
        "<output.dir>/hw-cuda.yaml, else runs/hw/cuda.yaml, else the bundled configs/hw/h100-pcie.yaml "
        "(spec-sheet estimates; the run says so); with the GPU present and neither file, train, eval and "
        "plan first measure the GPU once into <output.dir>/hw-cuda.yaml"),

    SEC("parallel", 0, "how the ranks of `mpirun -np N moefit train` share the work"),
    KEY("parallel.expert", MF_CK_INT, 0, parallel.expert, 1, 65536, NULL, "1",
        "expert-parallel ranks: each of them owns routed experts/N of every MoE layer (weights, gradients; "
        "on the device only its own), and the tokens travel to their experts' ranks and back; it must "
        "equal the number of ranks (`moefit plan --ranks N` plans rank 0's share); 1: none, every rank "
        "holds every expert (data parallel)"),

    SEC("output", 0, "where results go"),
    KEY("output.dir", MF_CK_STR, MF_CK_DOCDEF, output.dir, NOLO, NOHI, NULL, "runs/<config name>",
        "run directory: checkpoints, logs, metrics"),
    KEY("output.checkpoint_every", MF_CK_INT, 0, output.checkpoint_every, 0, 1e12, NULL, "0",
        "steps between resume checkpoints (<output.dir>/checkpoints/step-NNNNNN; `moefit train CONFIG "
        "--resume` "
        "continues from the newest); 0: one at the end only"),
    KEY("output.checkpoint_compression", MF_CK_STR, 0, output.checkpoint_compression, NOLO, NOHI, NULL,
        "none",
        "how a checkpoint's master weights and AdamW moments are stored: none, or zstd-N (level 1..19, "
        "multithreaded, after a byte-plane filter; about 1.2x smaller on training state)"),
    KEY("output.keep_checkpoints", MF_CK_INT, 0, output.keep_checkpoints, 0, 1e9, NULL, "0",
        "complete checkpoints kept: older ones are removed once a new one is complete; 0: keep all"),
    KEY("output.checkpoint_async", MF_CK_ENUM, 0, output.checkpoint_async, NOLO, NOHI, "auto|true|false",
        "auto",
        "true: a checkpoint before the last step is written on a thread of its own from a snapshot of the "
        "master weights and AdamW moments (a copy in host memory) while training goes on; false: training "
        "pauses while it is written; auto: true when the snapshot takes at most half the host's available "
        "memory"),

    KEY("backend", MF_CK_ENUM, 0, backend, NOLO, NOHI, "auto|cpu|cuda", "auto",
        "compute backend; auto: cuda when this build has it and a GPU is visible, else cpu"),

    SEC("kernels", 0,
        "which cuda kernels run bf16 storage's expert GEMMs and attention (plan prints the choice)"),
    KEY("kernels.expert_gemm", MF_CK_ENUM, 0, kernels.expert_gemm, NOLO, NOHI, "auto|mma|cutlass", "auto",
        "the grouped expert GEMMs: mma (mma.sync tiles, sm_80 on) or cutlass (CUTLASS's sm90 grouped GEMM on "
        "wgmma + TMA: an sm_90 GPU and a build with CUTLASS's headers, else the run stops saying which is "
        "missing); auto: the default for the GPU, mma until cutlass is measured faster there; the "
        "environment's MF_EXPERT_GEMM overrides it"),
    KEY("kernels.attention", MF_CK_ENUM, 0, kernels.attention, NOLO, NOHI, "auto|mma|cudnn", "auto",
        "causal attention: mma (mma.sync flash kernels) or cudnn (cuDNN 9's fused flash attention, loaded at "
        "run time, its backward's workspace reserved in the kernel scratch; else the run stops saying why); "
        "auto: the default for the GPU, mma until cudnn is measured faster there; the environment's "
        "MF_ATTENTION overrides it"),
};

const size_t mf_config_n_keys = sizeof mf_config_keys / sizeof mf_config_keys[0];

int mf_config_key_find(const char *path) {
  for (size_t i = 0; i < mf_config_n_keys; i++)
    if (strcmp(mf_config_keys[i].path, path) == 0) return (int)i;
  return -1;
}

void mf_config_key_parent(const char *path, char *buf, size_t cap) {
  const char *dot = strrchr(path, '.');
  size_t n = dot ? (size_t)(dot - path) : 0;
  if (n >= cap) n = cap - 1;
  memcpy(buf, path, n);
  buf[n] = 0;
}

static const char *last_part(const char *path) {
  const char *dot = strrchr(path, '.');
  return dot ? dot + 1 : path;
}

/* Optimal string alignment distance (a transposition costs 1); big for long strings. */
static int osa_distance(const char *a, const char *b) {
  enum { MAXL = 64 };
  size_t la = strlen(a), lb = strlen(b);
  if (la >= MAXL || lb >= MAXL) return 1000;
  int d[MAXL + 1][MAXL + 1];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    for (size_t j = 1; j <= lb; j++) {
      int cost = a[i - 1] != b[j - 1];
      int v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (d[i - 1][j - 1] + cost < v) v = d[i - 1][j - 1] + cost;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  }
  return d[la][lb];
}

static int depth_of(const char *p) {
  int d = 0;
  for (; *p; p++) d += *p == '.';
  return d;
}

void mf_config_key_suggest(const char *path, const char *const *known, size_t n_known, char *buf,
                           size_t cap) {
  buf[0] = 0;
  const char *last = last_part(path);
  const int close = strlen(last) > 3 ? 2 : 1;
  if (known) { /* a fixed set of names under one parent */
    int best = 1000;
    const char *pick = NULL;
    for (size_t i = 0; i < n_known; i++) {
      int d = osa_distance(last, known[i]);
      if (d < best) best = d, pick = known[i];
    }
    if (pick && best <= close) {
      snprintf(buf, cap, " (did you mean '%s'?)", pick);
      return;
    }
    size_t o = (size_t)snprintf(buf, cap, " (known keys:");
    for (size_t i = 0; i < n_known && o < cap; i++)
      o += (size_t)snprintf(buf + o, cap - o, "%s %s", i ? "," : "", known[i]);
    if (o < cap) snprintf(buf + o, cap - o, ")");
    return;
  }
  /* 1. a near miss at the same depth: train.lrr, trian.lr */
  int best = 1000;
  const char *pick = NULL;
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    const char *p = mf_config_keys[i].path;
    if (depth_of(p) != depth_of(path)) continue;
    int d = osa_distance(path, p);
    if (d < best) best = d, pick = p;
  }
  if (pick && best <= 1) {
    snprintf(buf, cap, " (did you mean '%s'?)", pick);
    return;
  }
  /* 2. the same name in another section: train.seq_len -> data.seq_len */
  for (size_t i = 0; i < mf_config_n_keys; i++) {
    if (strcmp(last_part(mf_config_keys[i].path), last) == 0) {
      snprintf(buf, cap, " (did you mean '%s'?)", mf_config_keys[i].path);
      return;
    }
  }
  if (pick && best <= close) {
    snprintf(buf, cap, " (did you mean '%s'?)", pick);
    return;
  }
  /* 3. list what is there: under the longest known parent */
  char parent[256];
  mf_config_key_parent(path, parent, sizeof parent);
  while (parent[0] && (mf_config_key_find(parent) < 0 ||
                       mf_config_keys[mf_config_key_find(parent)].kind != MF_CK_SECTION)) {
    char up[256];
    mf_config_key_parent(parent, up, sizeof up);
    memcpy(parent, up, sizeof up);
  }
  size_t o = parent[0] ? (size_t)snprintf(buf, cap, " (known keys in '%s':", parent)
                       : (size_t)snprintf(buf, cap, " (known sections:");
  int first = 1;
  for (size_t i = 0; i < mf_config_n_keys && o < cap; i++) {
    char pp[256];
    mf_config_key_parent(mf_config_keys[i].path, pp, sizeof pp);
    if (strcmp(pp, parent) != 0) continue;
    o += (size_t)snprintf(buf + o, cap - o, "%s %s", first ? "" : ",", last_part(mf_config_keys[i].path));
    first = 0;
  }
  if (o < cap) snprintf(buf + o, cap - o, ")");
}

const char *mf_config_key_choice(const mf_config_key *k, int n, char *buf, size_t cap) {
  const char *s = k->choices;
  if (!s || n < 0) return NULL;
  for (int i = 0; i < n; i++) {
    s = strchr(s, '|');
    if (!s) return NULL;
    s++;
  }
  const char *e = strchr(s, '|');
  size_t len = e ? (size_t)(e - s) : strlen(s);
  if (len >= cap) len = cap - 1;
  memcpy(buf, s, len);
  buf[len] = 0;
  return buf;
}

const char *mf_config_key_type(const mf_config_key *k, char *buf, size_t cap) {
  const char *num = k->kind == MF_CK_FLOAT ? "number" : "int";
  const int has_lo = isfinite(k->lo), has_hi = isfinite(k->hi) && k->hi < 1e6;
  switch (k->kind) {
    case MF_CK_SECTION:
      snprintf(buf, cap, "map");
      break;
    case MF_CK_U64:
      snprintf(buf, cap, "int >= 0");
      break;
    case MF_CK_BOOL:
      snprintf(buf, cap, "true|false");
      break;
    case MF_CK_STR:
      snprintf(buf, cap, "%s", k->flags & MF_CK_NULLABLE ? "string|null" : "string");
      break;
    case MF_CK_SIZE:
      snprintf(buf, cap, "size|auto");
      break;
    case MF_CK_ENUM:
    case MF_CK_FAMILY:
      snprintf(buf, cap, "%s", k->choices);
      break;
    case MF_CK_INTLIST:
      snprintf(buf, cap, "list of ints");
      break;
    case MF_CK_NAMELIST:
      snprintf(buf, cap, "list of %s", k->choices);
      break;
    case MF_CK_OVERRIDES:
      snprintf(buf, cap, "list of maps");
      break;
    case MF_CK_INT:
    case MF_CK_FLOAT:
      if (has_lo && has_hi)
        snprintf(buf, cap, "%s in %c%g, %g%c", num, k->flags & MF_CK_LO_OPEN ? '(' : '[', k->lo, k->hi,
                 k->flags & MF_CK_HI_OPEN ? ')' : ']');
      else if (has_lo)
        snprintf(buf, cap, "%s %s %g", num, k->flags & MF_CK_LO_OPEN ? ">" : ">=", k->lo);
      else
        snprintf(buf, cap, "%s", num);
      if (k->flags & MF_CK_NULLABLE) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "|null");
      }
      break;
  }
  return buf;
}
