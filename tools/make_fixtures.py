#!/usr/bin/env python3
"""Writes the model-parity fixtures of tests/fixtures/ with PyTorch + transformers.

Run it in a venv holding the exact versions of tools/requirements-fixtures.txt
(PyPI only; the CPU is used even though PyPI's Linux torch wheel is a CUDA build):

    python3 -m venv /tmp/fixvenv
    /tmp/fixvenv/bin/pip install -r tools/requirements-fixtures.txt
    /tmp/fixvenv/bin/python tools/make_fixtures.py --out tests/fixtures   # rewrite
    /tmp/fixvenv/bin/python tools/make_fixtures.py --check                # compare only

For every fixture (FIXTURES below) it builds a tiny random float32 model with the
real transformers class (attn_implementation="eager", train mode), runs one batch
(B=2, S=7) with labels and output_router_logits=True, backpropagates out.loss
(= CE + router_aux_loss_coef * aux) and takes one torch.optim.AdamW step. It writes
tests/fixtures/<name>/
  config.json          model.config.save_pretrained output
  model.safetensors    the initial weights (save_pretrained, per-expert HF names)
  fixture.safetensors  input_ids, labels, loss_mask [B,S] I32; logits [B,S,V],
                       loss, ce_loss, aux_loss (0-d) F32; router_logits.<layer>
                       [B*S,E] F32 for each MoE layer (raw gate outputs, the
                       tensors the aux loss is computed from); grad.<param> for
                       every parameter that has a gradient; after.<param> for
                       every parameter after the AdamW step. __metadata__ holds
                       the hyperparameters and versions as strings, and "no_grad"
                       (JSON list of parameters whose .grad stayed None; AdamW
                       skips them, so after.<p> == initial <p>).
GLM-4.5 (glm4_moe*) differs where its model does: its loss has no aux term and it records
no router logits, so it runs without output_router_logits, loss = ce_loss, aux_loss = 0 and
router_aux_loss_coef "0.0"; router_logits.<layer> are the raw logits x W^T recomputed from
each router's input (a forward hook), as Glm4MoeTopkRouter computes them. Its routers'
e_score_correction_bias buffers are saved in model.safetensors but are not parameters: they
are drawn at random like the weights (build()), listed in the metadata's "frozen", never
trained, and written as after.<buffer> (= initial) too.
DeepSeek-V3 (deepseek_v3*: DeepseekV3ForCausalLM) has GLM-4.5's router, MoE block and loss (the
same code, handled here the same way) under multi-head latent attention: each layer's attention
output is also checked against an fp64 reference of MLA from its parameters (check_mla: q_proj or
q_a_proj/q_b_proj, the kv latent, RoPE on the rope slices interleaved or in halves, YaRN).
gpt-oss (gpt_oss*: GptOssForCausalLM) keeps the contract above (aux loss on, loss = CE + coef * aux) with three
differences: the model records the routers' scores (softmax over the top-k logits scattered into zeros) as its
router_logits and computes the aux loss from them, so router_logits.<layer> are the raw logits x W^T + b recomputed
from each router's input (gate_hooks) and the metadata's aux_loss_rule says what aux_loss is; its experts are fused
[E, ...] tensors, so no grad is None and an idle expert's slice (and router row) of the grads is all zero
(expert_grad_rule); its expert weights are drawn wider (GPT_OSS_INIT_STD) so that the clamped SwiGLU's clamps are
reached. Each layer's attention (sinks, sliding window, YaRN with truncate false) and MoE block are checked against
fp64 references (check_sink_attention, check_gpt_oss_moe).
It also writes tests/fixtures/NOTES.md: the facts about the 4.57 maths the C code must match,
each checked by this script against the installed sources (SOURCE_FACTS) and, where
it can be, numerically (check_moe_block, check_aux, check_adamw).

Conventions: loss_mask is in labels coordinates: loss_mask[b,s] = 1 iff labels[b,s]
is a target that counts, i.e. labels[b,s] != -100 and s >= 1 (the target of
logits[b,t] is labels[b,t+1]; the last logit of a sequence predicts nothing).
ce_loss = sum of -log softmax(logits[b,s-1])[labels[b,s]] over loss_mask / sum(loss_mask).

Determinism: parameters and token ids come from numpy's PCG64 (bit-stable on every
CPU; torch's CPU normal_ picks a SIMD code path at run time), torch runs on one
thread with deterministic algorithms, MKL_CBWR=COMPATIBLE and ATen's baseline
kernels (set at the top, before torch loads), fixture.safetensors is written by write_st
(sorted __metadata__: the safetensors package writes its metadata map in a random
order). Two runs on one machine give byte-identical files. --check regenerates into
a temporary directory: config.json, model.safetensors and NOTES.md must be
byte-identical; fixture.safetensors must have the same names, dtypes, shapes and
metadata and values within CHECK_RTOL/CHECK_ATOL (another CPU's BLAS may round the
last bits differently); it says whether the bytes are identical too.

Routing is kept away from ties: a seed is used only if, in every MoE layer and for
every token, the k-th and (k+1)-th router probabilities differ by at least
MIN_ROUTING_MARGIN, so a correct implementation cannot pick other experts through
rounding (GLM-4.5, DeepSeek-V3: its k-th and (k+1)-th masked choice scores and, with a
group limit, its topk_group-th and next group scores, recomputed in float64; and leaving out
the router bias, or the group limit, must change the choice in every MoE layer). Fixtures
with need_idle_expert take the first seed (counting up from the one given) for which exactly
one routed expert receives no token, so the no_grad path (Mixtral/Qwen/GLM/DeepSeek: grad
None, AdamW skips) and the zero-grad path (OLMoE: grad 0, AdamW still decays; gpt-oss: a zero slice of the fused
experts' grads) are both exercised. gpt-oss: its k-th and (k+1)-th logits (bias included) recomputed in float64, and
leaving out its router bias must change the choice in every MoE layer.
"""

import argparse
import copy
import filecmp
import inspect
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import textwrap

# Before torch loads: MKL's conditional numerical reproducibility (GEMM results that do
# not depend on the CPU model or on memory alignment: without it, weights mmap'd by
# from_pretrained give other last bits than torch-allocated ones), ATen's baseline
# kernels instead of the AVX2/AVX-512 variants chosen at run time, one thread.
os.environ["MKL_CBWR"] = "COMPATIBLE"
os.environ["ATEN_CPU_CAPABILITY"] = "default"
os.environ["OMP_NUM_THREADS"] = "1"

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from transformers import (AutoModelForCausalLM, DeepseekV3Config, Glm4MoeConfig, GptOssConfig, MixtralConfig,
                          OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)

PINNED = {"torch": "2.9.1", "transformers": "4.57.6"}
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures")

B, S = 2, 7
MASKED_LABELS = [(0, 0), (0, 1), (1, 4)]  # (b, s) set to -100
LR, BETA1, BETA2, EPS, WD = 1e-2, 0.9, 0.95, 1e-8, 0.1
AUX_COEF = 0.01
INIT_STD, NORM_STD = 0.2, 0.1
MIN_ROUTING_MARGIN = 1e-3
SEED_TRIES = 200
CHECK_RTOL, CHECK_ATOL = 1e-4, 1e-5

COMMON = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    hidden_act="silu", max_position_embeddings=64, attention_dropout=0.0, tie_word_embeddings=False,
    router_aux_loss_coef=AUX_COEF, num_experts_per_tok=2)
# Glm4MoeConfig takes no router_aux_loss_coef (Glm4MoeForCausalLM's loss has no aux term; a passed
# one would only sit in config.json as an unused attribute): COMMON less it, for a fixture's "common".
GLM_COMMON = {k: v for k, v in COMMON.items() if k != "router_aux_loss_coef"}
# DeepseekV3Config has no router_aux_loss_coef either; its attention wants num_key_value_heads = heads (MLA's
# k and v are per head, from kv_b_proj; fewer kv heads make eager_attention_forward's repeat_kv fail).
DS_COMMON = dict(GLM_COMMON, num_key_value_heads=GLM_COMMON["num_attention_heads"])
# DeepSeek-V3's YaRN as published (type "yarn", factor 40, original 4096, betas 32 / 1, mscale = mscale_all_dim
# = 1) at fixture size: factor 4 over an original 16 positions (max_position_embeddings 64 = 4 * 16).
DS_YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32, "beta_slow": 1,
           "mscale": 1.0, "mscale_all_dim": 1.0}
# gpt-oss's YaRN as published (rope_type "yarn", factor 32 over an original 4096, betas 32 / 1, truncate false, no
# mscale: attention factor 0.1 ln(factor) + 1) at fixture size: factor 8 over an original 512 positions
# (max_position_embeddings 4096 = 8 * 512), theta 1000, so that the correction range (0.54, 2.55) is fractional at
# both ends within the 4 frequencies of head_dim 8 (floor / ceil, truncate true, would make it [0, 3]).
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False}
# gpt-oss's expert weights are drawn wider than INIT_STD (build(): "init_std", by name suffix) so that the clamps of its
# SwiGLU (GptOssExperts.limit = 7) are reached: gate_up_proj N(0, 1) (gate and up have std ~5.7 on the normed
# input), down_proj N(0, 0.02^2) (the block output stays within a few units).
GPT_OSS_INIT_STD = {"mlp.experts.gate_up_proj": 1.0, "mlp.experts.down_proj": 0.02}

# rms_norm_eps is left at each family's default (Mixtral 1e-5, Qwen2/3 1e-6, OLMoE 1e-5);
# rope_theta is set away from each default (Mixtral 1e6, Qwen2/3 1e4, OLMoE 1e4).
FIXTURES = [
    dict(name="mixtral", config=MixtralConfig, seed=1000, need_idle_expert=True,
         kw=dict(intermediate_size=16, num_local_experts=8, rope_theta=1e4, router_jitter_noise=0.0)),
    dict(name="qwen2_moe", config=Qwen2MoeConfig, seed=2000, need_idle_expert=False,
         kw=dict(intermediate_size=20, moe_intermediate_size=16, shared_expert_intermediate_size=24,
                 num_experts=8, mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=False,
                 qkv_bias=True, rope_theta=1e6)),
    dict(name="qwen3_moe", config=Qwen3MoeConfig, seed=3000, need_idle_expert=False,
         kw=dict(intermediate_size=20, moe_intermediate_size=16, num_experts=8, mlp_only_layers=[],
                 decoder_sparse_step=2, head_dim=8, norm_topk_prob=True, rope_theta=1e6)),
    # The same family with the flag flipped, and head_dim (16) != hidden/heads (8).
    dict(name="qwen3_moe_nonorm", config=Qwen3MoeConfig, seed=4000, need_idle_expert=False,
         kw=dict(intermediate_size=20, moe_intermediate_size=16, num_experts=8, mlp_only_layers=[],
                 decoder_sparse_step=2, head_dim=16, norm_topk_prob=False, rope_theta=1e6)),
    dict(name="olmoe", config=OlmoeConfig, seed=5000, need_idle_expert=True,
         kw=dict(intermediate_size=16, num_experts=8, norm_topk_prob=False, rope_theta=1e6, clip_qkv=None)),
    # GLM-4.5 (Glm4MoeForCausalLM): sigmoid router with e_score_correction_bias, group-limited top-k,
    # routed_scaling_factor, ungated shared experts, partial RoPE, no aux loss. "common" replaces COMMON.
    # glm4_moe: 3 layers, layer 0 dense (first_k_dense_replace 1), layers 1 and 2 MoE; 2 groups of 4,
    # 1 kept; head_dim 8 (H/heads), rotary dim 4; q/k/v bias; per-head qk-norm; x2.5 after renorm.
    dict(name="glm4_moe", config=Glm4MoeConfig, seed=6000, need_idle_expert=True,
         common=dict(GLM_COMMON, num_hidden_layers=3),
         kw=dict(intermediate_size=20, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1,
                 n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                 partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=True, rope_theta=1e6)),
    # glm4_moe_nogroup: every layer MoE, one group (no group limit), no renorm, scaling 1, two shared
    # experts (I 32), no bias, no qk-norm; head_dim 16 != H/heads (8), rotary dim 4 = head_dim/4.
    dict(name="glm4_moe_nogroup", config=Glm4MoeConfig, seed=7000, need_idle_expert=False,
         common=GLM_COMMON,
         kw=dict(intermediate_size=20, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2,
                 n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.0,
                 head_dim=16, partial_rotary_factor=0.25, attention_bias=False, use_qk_norm=False, rope_theta=5e5)),
    # DeepSeek-V3 (DeepseekV3ForCausalLM): GLM-4.5's router and MoE block (the same code) under multi-head latent
    # attention (MLA). Both: kv_lora_rank 16, q/k head = qk_nope_head_dim 8 + qk_rope_head_dim 4 = 12, v head 6,
    # routed_scaling_factor 2.5, no attention bias.
    # deepseek_v3: q through q_a_proj -> q_a_layernorm -> q_b_proj (q_lora_rank 24), interleaved RoPE, default
    # RoPE (theta 1e3, so that both frequencies of the 4 rotated dims turn); 3 layers, layer 0 dense; 2 groups
    # of 4, 1 kept; one shared expert; renormalised top-k.
    dict(name="deepseek_v3", config=DeepseekV3Config, seed=8000, need_idle_expert=True,
         common=dict(DS_COMMON, num_hidden_layers=3),
         kw=dict(intermediate_size=20, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1,
                 n_group=2, topk_group=1, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                 q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                 rope_interleave=True, rope_scaling=None, rope_theta=1e3)),
    # deepseek_v3_noq: q through q_proj (q_lora_rank null), RoPE in halves (rope_interleave false), YaRN (DS_YARN:
    # YaRN frequencies, softmax scale * mscale^2; theta 100); every layer MoE, one group, two shared experts
    # (I 32), no renormalisation; rms_norm_eps 1e-5 (Moonlight's; the latent norms keep 1e-6).
    dict(name="deepseek_v3_noq", config=DeepseekV3Config, seed=9000, need_idle_expert=False,
         common=DS_COMMON,
         kw=dict(intermediate_size=20, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2,
                 n_group=1, topk_group=1, first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=2.5,
                 q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                 rope_interleave=False, rope_scaling=DS_YARN, rope_theta=100.0, rms_norm_eps=1e-5)),
    # gpt-oss (GptOssForCausalLM): attention sinks, q/k/v/o biases, sliding-window and full attention layers, YaRN,
    # a router with a bias (top-k of the logits, softmax over the k), fused experts (gate_up_proj [E,H,2I] with gate
    # and up interleaved, down_proj [E,I,H], both with biases) through a clamped SwiGLU; an aux loss. Both: 2 layers,
    # head_dim 8 (passed: GptOssConfig's default is 64), expert I 16, sliding_window 3, GPT_OSS_INIT_STD.
    # gpt_oss: layer 0 sliding_attention, layer 1 full_attention (as published: even layers slide), YaRN
    # (GPT_OSS_YARN, truncate false).
    dict(name="gpt_oss", config=GptOssConfig, seed=10000, need_idle_expert=True,
         common=dict(COMMON, max_position_embeddings=4096), init_std=GPT_OSS_INIT_STD,
         kw=dict(intermediate_size=16, num_local_experts=8, head_dim=8, sliding_window=3,
                 layer_types=["sliding_attention", "full_attention"], rope_scaling=GPT_OSS_YARN, rope_theta=1e3)),
    # gpt_oss_nosw: every layer full_attention (sliding_window stays set: GptOssModel builds the sliding mask whatever
    # the layer types, and create_sliding_window_causal_mask refuses a null window), default RoPE (rope_scaling null).
    dict(name="gpt_oss_nosw", config=GptOssConfig, seed=11000, need_idle_expert=False,
         common=COMMON, init_std=GPT_OSS_INIT_STD,
         kw=dict(intermediate_size=16, num_local_experts=8, head_dim=8, sliding_window=3,
                 layer_types=["full_attention", "full_attention"], rope_scaling=None, rope_theta=1e4)),
]


def fail(msg):
    raise SystemExit(f"make_fixtures: {msg}")


def need(cond, msg):
    if not cond:
        fail(msg)


# ----------------------------------------------------------------------------- sources
def _src(obj):
    return inspect.getsource(obj)


def source_facts():
    """(citation, object, snippet that must occur in its source). Checked at start-up."""
    from torch.optim import adam as tadam
    from transformers import modeling_rope_utils as rope
    from transformers.loss import loss_utils
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.glm4_moe import modeling_glm4_moe as gl
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    from transformers.models.mixtral import modeling_mixtral as mx
    from transformers.models.olmoe import modeling_olmoe as ol
    from transformers.models.qwen2_moe import modeling_qwen2_moe as q2
    from transformers.models.qwen3_moe import modeling_qwen3_moe as q3
    return [
        ("modeling_mixtral.py MixtralSparseMoeBlock.forward", mx.MixtralSparseMoeBlock.forward,
         "routing_weights /= routing_weights.sum(dim=-1, keepdim=True)"),
        ("modeling_mixtral.py MixtralSparseMoeBlock.forward", mx.MixtralSparseMoeBlock.forward,
         "for expert_idx in expert_hit:"),
        ("modeling_mixtral.py MixtralSparseMoeBlock.forward", mx.MixtralSparseMoeBlock.forward,
         "expert_layer(current_state) * routing_weights[top_x, idx, None]"),
        ("modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward", q2.Qwen2MoeSparseMoeBlock.forward,
         "if self.norm_topk_prob:"),
        ("modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock.forward", q2.Qwen2MoeSparseMoeBlock.forward,
         "F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output"),
        ("modeling_qwen2_moe.py Qwen2MoeModel.forward", q2.Qwen2MoeModel.forward,
         "if output_router_logits and layer_outputs[-1] is not None:"),
        ("modeling_qwen2_moe.py Qwen2MoeDecoderLayer.__init__", q2.Qwen2MoeDecoderLayer.__init__,
         "(layer_idx + 1) % config.decoder_sparse_step == 0"),
        ("modeling_qwen3_moe.py Qwen3MoeAttention.forward", q3.Qwen3MoeAttention.forward,
         "self.q_norm(self.q_proj(hidden_states).view(hidden_shape))"),
        ("modeling_qwen3_moe.py Qwen3MoeSparseMoeBlock.forward", q3.Qwen3MoeSparseMoeBlock.forward,
         "if self.norm_topk_prob:"),
        ("modeling_olmoe.py OlmoeAttention.forward", ol.OlmoeAttention.forward,
         "query_states = self.q_norm(self.q_proj(hidden_states))"),
        ("modeling_olmoe.py OlmoeAttention.forward", ol.OlmoeAttention.forward,
         "query_states.clamp_(min=-self.config.clip_qkv, max=self.config.clip_qkv)"),
        ("modeling_olmoe.py OlmoeSparseMoeBlock.forward", ol.OlmoeSparseMoeBlock.forward,
         "for expert_idx in range(self.num_experts):"),
        ("modeling_mixtral.py MixtralRMSNorm.forward", mx.MixtralRMSNorm.forward,
         "return self.weight * hidden_states.to(input_dtype)"),
        ("modeling_mixtral.py load_balancing_loss_func", mx.load_balancing_loss_func,
         "concatenated_gate_logits = torch.cat("),
        ("modeling_mixtral.py load_balancing_loss_func", mx.load_balancing_loss_func,
         "return overall_loss * num_experts"),
        ("loss/loss_utils.py ForCausalLMLoss", loss_utils.ForCausalLMLoss,
         "labels = nn.functional.pad(labels, (0, 1), value=ignore_index)"),
        ("loss/loss_utils.py fixed_cross_entropy", loss_utils.fixed_cross_entropy,
         'reduction = "sum" if num_items_in_batch is not None else "mean"'),
        ("torch/optim/adam.py Adam._init_group", tadam.Adam._init_group, "if p.grad is not None:"),
        ("torch/optim/adam.py _single_tensor_adam", tadam._single_tensor_adam,
         "param.mul_(1 - lr * weight_decay)"),
        ("torch/optim/adam.py _single_tensor_adam", tadam._single_tensor_adam,
         "exp_avg.lerp_(grad, 1 - device_beta1)"),
        ("torch/optim/adam.py _single_tensor_adam", tadam._single_tensor_adam,
         "denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)"),
        ("torch/optim/adam.py _single_tensor_adam", tadam._single_tensor_adam,
         "param.addcdiv_(exp_avg, denom, value=-step_size)"),
    ] + glm_facts(gl, rope) + ds_facts(ds, rope) + gpt_oss_facts(go, rope)


def glm_facts(gl, rope):
    """GLM-4.5's facts (modeling_glm4_moe.py; the partial RoPE of modeling_rope_utils.py)."""
    c = "modeling_glm4_moe.py "
    return (
        facts(c + "Glm4MoeAttention.__init__", gl.Glm4MoeAttention.__init__,
              'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
              "self.scaling = self.head_dim**-0.5",
              "config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias",
              "config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias",
              "self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)",
              "self.q_norm = Glm4MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)",
              "self.k_norm = Glm4MoeRMSNorm(self.head_dim, eps=config.rms_norm_eps)")
        + facts(c + "Glm4MoeAttention.forward", gl.Glm4MoeAttention.forward,
                "query_states = self.q_proj(hidden_states).view(hidden_shape)",
                "if self.use_qk_norm:  # main diff from Llama",
                "query_states = self.q_norm(query_states)",
                "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)")
        + facts(c + "apply_rotary_pos_emb", gl.apply_rotary_pos_emb,
                "rotary_dim = cos.shape[-1]",
                "q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]",
                "q_embed = (q_rot * cos) + (rotate_half(q_rot) * sin)",
                "q_embed = torch.cat([q_embed, q_pass], dim=-1)")
        + facts(c + "rotate_half", gl.rotate_half, "return torch.cat((-x2, x1), dim=-1)")
        + facts("modeling_rope_utils.py _compute_default_rope_parameters", rope._compute_default_rope_parameters,
                'partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)',
                'head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads',
                "dim = int(head_dim * partial_rotary_factor)",
                "inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, "
                "dtype=torch.float) / dim))")
        + facts(c + "Glm4MoeRotaryEmbedding.forward", gl.Glm4MoeRotaryEmbedding.forward,
                "emb = torch.cat((freqs, freqs), dim=-1)")
        + facts(c + "Glm4MoeTopkRouter.__init__", gl.Glm4MoeTopkRouter.__init__,
                'self.register_buffer("e_score_correction_bias", torch.zeros((self.n_routed_experts), '
                'dtype=torch.float32))')
        + group_router_facts(gl, "Glm4Moe", c)
    )


def group_router_facts(mod, P, c):
    """The lines GLM-4.5 and DeepSeek-V3 share (class names P...; c: the file's citation): the RMSNorm, the
    dense/MoE layer rule, the MLP, the sigmoid group-limited router, the MoE block, the loss (no aux term)."""
    router, moe = getattr(mod, P + "TopkRouter"), getattr(mod, P + "MoE")
    return (
        facts(c + P + "RMSNorm.forward", getattr(mod, P + "RMSNorm").forward,
              "return self.weight * hidden_states.to(input_dtype)")
        + facts(c + P + "DecoderLayer.__init__", getattr(mod, P + "DecoderLayer").__init__,
                "if layer_idx >= config.first_k_dense_replace:", f"self.mlp = {P}MoE(config)",
                f"self.mlp = {P}MLP(config)")
        + facts(c + P + "MLP.forward", getattr(mod, P + "MLP").forward,
                "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))")
        + facts(c + P + "TopkRouter.__init__", router.__init__,
                "self.weight = nn.Parameter(torch.empty((self.n_routed_experts, config.hidden_size)))")
        + facts(c + P + "TopkRouter.get_topk_indices", router.get_topk_indices,
                "@torch.no_grad()",
                "scores_for_choice = scores.view(-1, self.n_routed_experts) + "
                "self.e_score_correction_bias.unsqueeze(0)",
                ".topk(2, dim=-1)[0]",
                "group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]",
                "scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), 0.0)",
                "topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]")
        + facts(c + P + "TopkRouter.forward", router.forward,
                "router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))",
                "scores = router_logits.sigmoid()",
                "topk_weights = scores.gather(1, topk_indices)",
                "denominator = topk_weights.sum(dim=-1, keepdim=True) + 1e-20",
                "topk_weights = topk_weights * self.routed_scaling_factor")
        + facts(c + P + "MoE.__init__", moe.__init__,
                f"{P}MLP(config, intermediate_size=config.moe_intermediate_size)",
                "intermediate_size=config.moe_intermediate_size * config.n_shared_experts")
        + facts(c + P + "MoE.moe", moe.moe,
                "final_hidden_states = torch.zeros_like(hidden_states, dtype=topk_weights.dtype)",
                "for expert_idx in range(len(self.experts)):",
                "if token_indices.numel() > 0:",
                "weighted_output = expert_output * expert_weights.unsqueeze(-1)",
                "final_hidden_states.index_add_(0, token_indices, weighted_output)")
        + facts(c + P + "MoE.forward", moe.forward,
                "hidden_states = hidden_states + self.shared_experts(residuals)")
        + facts(c + P + "ForCausalLM.forward", getattr(mod, P + "ForCausalLM").forward,
                "loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, "
                "**kwargs)")
    )


def ds_facts(ds, rope):
    """DeepSeek-V3's facts (modeling_deepseek_v3.py, configuration_deepseek_v3.py; the YaRN of
    modeling_rope_utils.py); its router and MoE block are GLM-4.5's (group_router_facts)."""
    c = "modeling_deepseek_v3.py "
    cfg = "configuration_deepseek_v3.py DeepseekV3Config.__init__"
    return (
        facts(cfg, DeepseekV3Config.__init__,
              "self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim",
              "self.head_dim = qk_rope_head_dim",
              'self.rope_scaling["rope_type"] = self.rope_scaling["type"]',
              'for key in ["beta_fast", "beta_slow", "factor"]:')
        + facts(c + "DeepseekV3Attention.__init__", ds.DeepseekV3Attention.__init__,
                "self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads",
                "self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.qk_head_dim, bias=False)",
                "self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=config.attention_bias)",
                "self.q_a_layernorm = DeepseekV3RMSNorm(config.q_lora_rank)",
                "self.q_b_proj = nn.Linear(config.q_lora_rank, self.num_heads * self.qk_head_dim, bias=False)",
                "self.kv_lora_rank + self.qk_rope_head_dim,",
                "self.kv_a_layernorm = DeepseekV3RMSNorm(self.kv_lora_rank)",
                "self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),",
                "self.num_heads * self.v_head_dim,",
                "self.scaling = self.qk_head_dim ** (-0.5)",
                'mscale_all_dim = self.config.rope_scaling.get("mscale_all_dim", 0)',
                "mscale = yarn_get_mscale(scaling_factor, mscale_all_dim)",
                "self.scaling = self.scaling * mscale * mscale")
        + facts(c + "yarn_get_mscale", ds.yarn_get_mscale, "return 0.1 * mscale * math.log(scale) + 1.0")
        + facts(c + "DeepseekV3RMSNorm.__init__", ds.DeepseekV3RMSNorm.__init__,
                "def __init__(self, hidden_size, eps=1e-6):")
        + facts(c + "DeepseekV3Attention.forward", ds.DeepseekV3Attention.forward,
                "q_states = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))",
                "q_pass, q_rot = torch.split(q_states, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)",
                "k_pass, k_rot = torch.split(compressed_kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)",
                "k_pass = self.kv_b_proj(self.kv_a_layernorm(k_pass)).view(key_shape).transpose(1, 2)",
                "k_pass, value_states = torch.split(k_pass, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)",
                "k_rot = k_rot.view(batch_size, 1, seq_length, self.qk_rope_head_dim)",
                "if self.config.rope_interleave:",
                "q_rot, k_rot = apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)",
                "q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin)",
                "k_rot = k_rot.expand(*k_pass.shape[:-1], -1)",
                "query_states = torch.cat((q_pass, q_rot), dim=-1)",
                "key_states = torch.cat((k_pass, k_rot), dim=-1)",
                "attn_output = self.o_proj(attn_output)")
        + facts(c + "apply_rotary_pos_emb_interleave", ds.apply_rotary_pos_emb_interleave,
                "q = q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)",
                "q_embed = (q * cos) + (rotate_half(q) * sin)")
        + facts(c + "apply_rotary_pos_emb", ds.apply_rotary_pos_emb, "q_embed = (q * cos) + (rotate_half(q) * sin)")
        + facts(c + "rotate_half", ds.rotate_half, "return torch.cat((-x2, x1), dim=-1)")
        + facts(c + "DeepseekV3RotaryEmbedding.forward", ds.DeepseekV3RotaryEmbedding.forward,
                "emb = torch.cat((freqs, freqs), dim=-1)", "cos = emb.cos() * self.attention_scaling")
        + facts(c + "eager_attention_forward", ds.eager_attention_forward,
                "attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling",
                "attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)")
        + facts("modeling_rope_utils.py _compute_yarn_parameters", rope._compute_yarn_parameters,
                'head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
                "dim = int(head_dim * partial_rotary_factor)",
                "if mscale and mscale_all_dim:",
                "attention_factor = float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))",
                "attention_factor = get_mscale(factor)",
                'beta_fast = config.rope_scaling.get("beta_fast") or 32',
                'beta_slow = config.rope_scaling.get("beta_slow") or 1',
                "return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / "
                "(2 * math.log(base))",
                'truncate = config.rope_scaling.get("truncate", True)',
                "low = math.floor(low)", "high = math.ceil(high)",
                "return max(low, 0), min(high, dim - 1)",
                "max += 0.001  # Prevent singularity",
                "inv_freq_interpolation = 1.0 / (factor * pos_freqs)",
                "inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)",
                "inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)",
                "+ inv_freq_extrapolation * inv_freq_extrapolation_factor")
        + facts(c + "DeepseekV3TopkRouter.__init__", ds.DeepseekV3TopkRouter.__init__,
                'self.register_buffer("e_score_correction_bias", torch.zeros(self.n_routed_experts))')
        + group_router_facts(ds, "DeepseekV3", c)
    )


def gpt_oss_facts(go, rope):
    """gpt-oss's facts (modeling_gpt_oss.py, configuration_gpt_oss.py; the sliding window of masking_utils.py, the
    YaRN truncation of modeling_rope_utils.py)."""
    from transformers import masking_utils
    c = "modeling_gpt_oss.py "
    cfg = "configuration_gpt_oss.py GptOssConfig.__init__"
    return (
        facts(cfg, GptOssConfig.__init__,
              'self.head_dim = head_dim if head_dim is not None else self.hidden_size // self.num_attention_heads',
              '"sliding_attention" if bool((i + 1) % 2) else "full_attention" for i in range(self.num_hidden_layers)',
              "self.attention_bias = True",
              "self.router_aux_loss_coef = router_aux_loss_coef")
        + facts(c + "GptOssRMSNorm.forward", go.GptOssRMSNorm.forward,
                "return (self.weight * hidden_states).to(input_dtype)")
        + facts(c + "GptOssExperts.__init__", go.GptOssExperts.__init__,
                "self.gate_up_proj = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, "
                "2 * self.expert_dim))",
                "self.gate_up_proj_bias = nn.Parameter(torch.empty(self.num_experts, 2 * self.expert_dim))",
                "self.down_proj = nn.Parameter(torch.empty((self.num_experts, self.expert_dim, self.hidden_size)))",
                "self.down_proj_bias = nn.Parameter(torch.empty(self.num_experts, self.hidden_size))",
                "self.alpha = 1.702", "self.limit = 7.0")
        + facts(c + "GptOssExperts.forward", go.GptOssExperts.forward,
                'if hidden_states.device.type == "cpu" or self.training:',
                "for expert_idx in expert_hit[:]:",
                "gate_up = current_state @ self.gate_up_proj[expert_idx] + self.gate_up_proj_bias[expert_idx]",
                "gate, up = gate_up[..., ::2], gate_up[..., 1::2]",
                "gate = gate.clamp(min=None, max=self.limit)",
                "up = up.clamp(min=-self.limit, max=self.limit)",
                "glu = gate * torch.sigmoid(gate * self.alpha)",
                "gated_output = (up + 1) * glu",
                "out = gated_output @ self.down_proj[expert_idx] + self.down_proj_bias[expert_idx]",
                "weighted_output = out * routing_weights[token_idx, expert_idx, None]",
                "next_states.index_add_(0, token_idx, weighted_output.to(hidden_states.dtype))")
        + facts(c + "GptOssTopKRouter.forward", go.GptOssTopKRouter.forward,
                "router_logits = F.linear(hidden_states, self.weight, self.bias)",
                "router_top_value, router_indices = torch.topk(router_logits, self.top_k, dim=-1)",
                "router_top_value = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)",
                "router_scores = torch.zeros_like(router_logits).scatter_(1, router_indices, router_top_value)",
                "return router_scores, router_indices")
        + facts(c + "GptOssMLP.forward", go.GptOssMLP.forward,
                "routed_out = self.experts(hidden_states, router_indices=router_indices, "
                "routing_weights=router_scores)")
        + facts(c + "GptOssDecoderLayer.__init__", go.GptOssDecoderLayer.__init__,
                "self.mlp = GptOssMLP(config)", "self.attention_type = config.layer_types[layer_idx]")
        + facts(c + "GptOssAttention.__init__", go.GptOssAttention.__init__,
                'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
                "self.scaling = self.head_dim**-0.5",
                "config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias",
                "config.hidden_size, config.num_key_value_heads * self.head_dim, bias=config.attention_bias",
                "config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias",
                'self.sliding_window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" '
                "else None",
                "self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))")
        + facts(c + "GptOssAttention.forward", go.GptOssAttention.forward,
                "query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)",
                "attn_output = self.o_proj(attn_output)")
        + facts(c + "_apply_rotary_emb", go._apply_rotary_emb,
                "first_half, second_half = torch.chunk(x, 2, dim=-1)",
                "first_ = first_half * cos - second_half * sin",
                "second_ = second_half * cos + first_half * sin")
        + facts(c + "GptOssRotaryEmbedding.forward", go.GptOssRotaryEmbedding.forward,
                "emb = freqs", "cos = emb.cos() * self.attention_scaling")
        + facts(c + "eager_attention_forward", go.eager_attention_forward,
                "attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling",
                "sinks = module.sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)",
                "combined_logits = torch.cat([attn_weights, sinks], dim=-1)",
                "combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values",
                "scores = probs[..., :-1]  # we drop the sink here")
        + facts(c + "GptOssModel.forward", go.GptOssModel.forward,
                '"sliding_attention": create_sliding_window_causal_mask(**mask_kwargs),',
                "attention_mask=causal_mask_mapping[decoder_layer.attention_type],")
        + facts("masking_utils.py sliding_window_overlay", masking_utils.sliding_window_overlay,
                "return kv_idx > q_idx - sliding_window")
        + facts("masking_utils.py create_sliding_window_causal_mask", masking_utils.create_sliding_window_causal_mask,
                'raise ValueError("Could not find a `sliding_window` argument in the config, or it is not set")')
        + facts("modeling_rope_utils.py _compute_yarn_parameters", rope._compute_yarn_parameters,
                "if truncate:", "attention_factor = get_mscale(factor)")
        + facts(c + "load_balancing_loss_func", go.load_balancing_loss_func,
                "routing_weights = torch.nn.functional.softmax(concatenated_gate_logits, dim=-1)",
                "_, selected_experts = torch.topk(routing_weights, top_k, dim=-1)",
                "return overall_loss * num_experts")
        + facts(c + "GptOssForCausalLM.forward", go.GptOssForCausalLM.forward,
                "outputs.router_logits,",
                "loss += self.router_aux_loss_coef * aux_loss.to(loss.device)")
    )


def facts(cite, obj, *snippets):
    """(citation, object, snippet) for each of several snippets of one object's source."""
    return [(cite, obj, snippet) for snippet in snippets]


def check_facts(facts, what="source fact"):
    """Each (citation, object, snippet): the snippet occurs in the object's source."""
    for cite, obj, snippet in facts:
        need(snippet in _src(obj), f"{what} not found: {cite}: {snippet!r}")


def check_sources():
    check_facts(source_facts())
    need(inspect.signature(OlmoeConfig.__init__).parameters["clip_qkv"].default is None,
         "OlmoeConfig clip_qkv default is not None")
    for cls in (Qwen2MoeConfig, Qwen3MoeConfig, OlmoeConfig):
        need(inspect.signature(cls.__init__).parameters["norm_topk_prob"].default is False,
             f"{cls.__name__} norm_topk_prob default is not False")
    need("norm_topk_prob" not in inspect.signature(MixtralConfig.__init__).parameters,
         "MixtralConfig has a norm_topk_prob")
    check_glm_sources()
    check_gpt_oss_sources()


def check_glm_sources():
    """What modeling_glm4_moe.py and modeling_deepseek_v3.py do not have: an aux loss or router logits in their
    outputs (the output_router_logits kwarg is swallowed by **kwargs), a head_dim or router_aux_loss_coef config
    argument; GLM's attention order (qk-norm before RoPE); DeepSeek's defaults (rope_interleave true, eps 1e-6)."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
    from transformers.models.glm4_moe import modeling_glm4_moe as gl
    for mod, P in ((gl, "Glm4Moe"), (ds, "DeepseekV3")):
        for obj in (getattr(mod, P + "ForCausalLM").forward, getattr(mod, P + "Model").forward,
                    getattr(mod, P + "MoE").forward, getattr(mod, P + "DecoderLayer").forward):
            for word in ("aux_loss", "router_logits", "load_balancing"):
                need(word not in _src(obj), f"{mod.__name__} {obj.__qualname__} mentions {word}")
        need("router_logits" not in getattr(mod, P + "PreTrainedModel")._can_record_outputs,
             f"{P}PreTrainedModel records router logits")
    for cls, eps in ((Glm4MoeConfig, 1e-5), (DeepseekV3Config, 1e-6)):
        ps = inspect.signature(cls.__init__).parameters
        need("router_aux_loss_coef" not in ps and "head_dim" not in ps,
             f"{cls.__name__} has a router_aux_loss_coef or head_dim argument")
        need(ps["rms_norm_eps"].default == eps, f"{cls.__name__} rms_norm_eps default is not {eps}")
    ps = inspect.signature(DeepseekV3Config.__init__).parameters
    need(ps["rope_interleave"].default is True and ps["attention_bias"].default is False,
         "DeepseekV3Config rope_interleave default is not True or attention_bias not False")
    fwd = _src(gl.Glm4MoeAttention.forward)
    need(fwd.index("self.q_norm(query_states)") < fwd.index("apply_rotary_pos_emb("),
         "Glm4MoeAttention.forward: q_norm is not before RoPE")


def check_gpt_oss_sources():
    """What gpt-oss's sources say beyond their lines: the model records the routers' first output (router_scores, not
    the logits) as router_logits; neither the config nor the modeling code reads a swiglu_limit (GptOssExperts'
    limit is the constant 7), and the config takes attention_bias only through **kwargs (it sets True first)."""
    from transformers.models.gpt_oss import modeling_gpt_oss as go
    rec = go.GptOssPreTrainedModel._can_record_outputs["router_logits"]
    need(rec.target_class is go.GptOssTopKRouter and rec.index == 0,
         f"GptOssPreTrainedModel records router_logits as {rec}")
    need("swiglu_limit" not in inspect.getsource(go) and "swiglu_limit" not in _src(GptOssConfig),
         "modeling_gpt_oss.py / GptOssConfig read a swiglu_limit")
    ps = inspect.signature(GptOssConfig.__init__).parameters
    need("attention_bias" not in ps and "swiglu_limit" not in ps and ps["rms_norm_eps"].default == 1e-5,
         "GptOssConfig takes attention_bias / swiglu_limit, or its rms_norm_eps default is not 1e-5")


# ----------------------------------------------------------------------------- safetensors
_ST_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<i4"): "I32"}


def write_st(path, tensors, metadata):
    """Deterministic safetensors writer: data ordered by alignment then name, header
    padded with spaces to 8 bytes, __metadata__ keys sorted (as the safetensors reference writer)."""
    names = sorted(tensors, key=lambda n: (-tensors[n].dtype.itemsize, n))
    header = {"__metadata__": {k: metadata[k] for k in sorted(metadata)}}
    blobs, off = [], 0
    for n in names:
        a = np.array(tensors[n], order="C")  # (ascontiguousarray would make 0-d tensors 1-d)
        need(a.dtype in _ST_DTYPES, f"{n}: dtype {a.dtype}")
        b = a.tobytes()
        header[n] = {"dtype": _ST_DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_st(path):
    """(tensors, metadata) with 0-d tensors kept 0-d (safetensors' numpy loader gives them
    shape (1,)); the safetensors package must accept the file as well."""
    with safe_open(path, framework="np") as f:
        keys, meta = sorted(f.keys()), f.metadata()
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    need(sorted(header) == keys, f"{path}: header names")
    np_dt = {v: k for k, v in _ST_DTYPES.items()}
    out = {k: np.frombuffer(data[h["data_offsets"][0]:h["data_offsets"][1]], dtype=np_dt[h["dtype"]])
           .reshape(h["shape"]) for k, h in header.items()}
    return out, meta


# ----------------------------------------------------------------------------- model
def is_norm(name):
    return name.endswith("norm.weight")


def moe_block(layer):
    blk = getattr(layer, "block_sparse_moe", None) or layer.mlp
    return blk if hasattr(blk, "experts") else None


def expert_prefix(model, layer_idx, e):
    attr = "block_sparse_moe" if hasattr(model.model.layers[layer_idx], "block_sparse_moe") else "mlp"
    return f"model.layers.{layer_idx}.{attr}.experts.{e}."


def frozen_buffers(model):
    """The buffers the model saves (state_dict) that are not parameters, in named_buffers() order:
    GLM-4.5's and DeepSeek-V3's e_score_correction_bias; none in the other families (inv_freq is not
    persistent)."""
    sd, params = model.state_dict(), dict(model.named_parameters())
    return [(n, b) for n, b in model.named_buffers() if n in sd and n not in params]


def init_std(fx, name):
    """The standard deviation build() draws parameter `name` (not a norm weight) with: fx's "init_std" entry whose
    key ends the name (gpt-oss's experts: GPT_OSS_INIT_STD), else INIT_STD."""
    stds = [v for k, v in fx.get("init_std", {}).items() if name.endswith("." + k)]
    need(len(stds) <= 1, f"{name}: several init_std entries")
    return stds[0] if stds else INIT_STD


def build(fx, seed):
    cfg = fx["config"](**copy.deepcopy(fx.get("common", COMMON)), **copy.deepcopy(fx["kw"]))  # (rope_scaling:
    # DeepseekV3Config adds rope_type to the dict it is given and casts its betas to float)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            need(p.dtype == torch.float32, f"{name} is {p.dtype}")
            z = rng.standard_normal(tuple(p.shape))
            if is_norm(name):
                need(p.dim() == 1, f"{name}: norm weight not 1-d")
                v = 1.0 + NORM_STD * z
            else:
                v = init_std(fx, name) * z
            p.copy_(torch.from_numpy(v.astype(np.float32)))
        # Saved buffers (GLM's and DeepSeek's router bias; transformers leaves it 0) random too, so that a wrong use
        # of the bias changes the routing.
        for name, b in frozen_buffers(model):
            need(name.endswith(".e_score_correction_bias") and b.dtype == torch.float32,
                 f"saved buffer {name} ({b.dtype}): build() does not know it")
            b.copy_(torch.from_numpy((INIT_STD * rng.standard_normal(tuple(b.shape))).astype(np.float32)))
    pad = cfg.pad_token_id
    allowed = np.array([t for t in range(cfg.vocab_size) if t != pad], dtype=np.int64)
    ids = allowed[rng.integers(0, len(allowed), size=(B, S))]
    model.train()
    return model, torch.from_numpy(ids)


def make_labels(ids):
    labels = ids.clone()
    for b, s in MASKED_LABELS:
        labels[b, s] = -100
    mask = (labels != -100).to(torch.int32)
    mask[:, 0] = 0
    return labels, mask


def routing_stats(router_logits, k, E):
    margin, idle = math.inf, []
    for li, lg in enumerate(router_logits):
        p = F.softmax(lg.detach(), dim=-1, dtype=torch.float)
        top = p.sort(dim=-1, descending=True).values
        margin = min(margin, (top[:, k - 1] - top[:, k]).min().item())
        hits = torch.bincount(p.topk(k, dim=-1).indices.reshape(-1), minlength=E)
        idle += [(li, e) for e in range(E) if hits[e] == 0]
    return margin, idle


# The families with GLM-4.5's sigmoid, group-limited router (e_score_correction_bias, routed_scaling_factor,
# shared experts) and no aux loss: model_type -> (causal LM class, router class).
GROUP_ROUTER = {"glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeTopkRouter"),
                "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3TopkRouter")}


def is_group_router(cfg):
    """GLM-4.5 or DeepSeek-V3: GLM-4.5's router and MoE block, no aux loss (GROUP_ROUTER)."""
    return cfg.model_type in GROUP_ROUTER


def is_mla(cfg):
    """DeepSeek-V3's multi-head latent attention."""
    return cfg.model_type == "deepseek_v3"


def aux_coef(cfg):
    """The weight of the aux loss in out.loss (the metadata's router_aux_loss_coef): GLM-4.5 and DeepSeek-V3
    have none."""
    return 0.0 if is_group_router(cfg) else AUX_COEF


def is_gpt_oss(cfg):
    """gpt-oss (GptOssForCausalLM): a router with a bias (top-k of its logits, softmax over the k), fused experts
    through a clamped SwiGLU, attention with sinks and sliding windows."""
    return cfg.model_type == "gpt_oss"


def has_hooked_router(cfg):
    """The families whose routing the script reads from the routers themselves (gate_hooks), not from the model's
    router_logits output: GLM-4.5 and DeepSeek-V3 (none recorded), gpt-oss (it records router scores, not logits)."""
    return is_group_router(cfg) or is_gpt_oss(cfg)


def norm_topk(cfg):
    """Whether the combine weights of the top-k sum to 1 (before any routed_scaling_factor): always for Mixtral, and
    for gpt-oss (a softmax over the k chosen logits), else norm_topk_prob."""
    return True if cfg.model_type in ("mixtral", "gpt_oss") else bool(cfg.norm_topk_prob)


def forward_kw(cfg):
    """The forward's router-logit flag: GLM-4.5 and DeepSeek-V3 record no router logits (output_router_logits
    would be swallowed by **kwargs), so it is not passed; the routers are read by gate_hooks instead."""
    return {} if is_group_router(cfg) else dict(output_router_logits=True)


def gate_hooks(model):
    """Forward hooks on the GLM-4.5 / DeepSeek-V3 routers (GROUP_ROUTER's: the modules with an
    e_score_correction_bias) and the gpt-oss ones (GptOssTopKRouter); also inside a PeftModel: captured[layer] =
    (router, its input [T,H], its output: (topk_indices, topk_weights), gpt-oss (router_scores [T,E],
    router_indices [T,k])). Returns captured and the hooks."""
    captured, hooks = {}, []
    for n, m in model.named_modules():
        if hasattr(m, "e_score_correction_bias") or type(m).__name__ == "GptOssTopKRouter":
            li = int(re.search(r"layers\.(\d+)\.", n).group(1))
            hooks.append(m.register_forward_hook(lambda m_, inp, out, li=li: captured.__setitem__(li, (
                m_, inp[0].detach().reshape(-1, inp[0].shape[-1]).clone(), tuple(t.detach().clone() for t in out)))))
    return captured, hooks


def group_route(cfg, x, w, bias, use_bias=True, groups=True):
    """GLM-4.5's (and DeepSeek-V3's) choice (Glm4MoeTopkRouter) in float64 from the router input x [T,H], its
    weight w [E,H] and e_score_correction_bias: (sigmoid scores [T,E], chosen experts [T,k] ascending, margin [T]).
    A token's margin is the smaller of the gap between its topk_group-th and next group score (when
    groups are left out) and the gap between its k-th and (k+1)-th masked choice score. use_bias /
    groups False: the choice without the bias / the group limit (the checks' wrong variants)."""
    E, G, tg, k = cfg.n_routed_experts, cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok
    s = torch.sigmoid(x.double() @ w.double().T)
    c = s + bias.double() if use_bias else s.clone()
    T = c.shape[0]
    margin = torch.full((T,), math.inf, dtype=torch.float64)
    if groups and G > tg:
        gs = c.view(T, G, E // G).topk(2, dim=-1).values.sum(-1)
        top = gs.sort(dim=-1, descending=True).values
        margin = top[:, tg - 1] - top[:, tg]
        keep = torch.zeros(T, G, dtype=torch.bool).scatter_(1, gs.topk(tg, dim=-1).indices, True)
        c = c.masked_fill(~keep.repeat_interleave(E // G, dim=1), 0.0)
    top = c.sort(dim=-1, descending=True).values
    margin = torch.minimum(margin, top[:, k - 1] - top[:, k])
    return s, c.topk(k, dim=-1).indices.sort(dim=-1).values, margin


def group_router_logits(gates):
    """The raw router logits x W^T [T,E] F32 of each MoE layer (ascending), as Glm4MoeTopkRouter.forward
    (DeepseekV3TopkRouter.forward) computes them (F.linear of the float32 input and weight)."""
    return [F.linear(x.float(), g.weight.detach().float()) for g, x, _ in (gates[li] for li in sorted(gates))]


def bias_route(cfg, x, w, bias, use_bias=True):
    """gpt-oss's choice (GptOssTopKRouter) in float64 from the router input x [T,H], its weight w [E,H] and bias [E]:
    (logits x W^T + b [T,E], chosen experts [T,k] ascending, margin [T]: the gap between the k-th and (k+1)-th
    logit). use_bias False: the choice without the bias (the checks' wrong variant)."""
    k = cfg.num_experts_per_tok
    lg = x.double() @ w.double().T + (bias.double() if use_bias else 0.0)
    top = lg.sort(dim=-1, descending=True).values
    return lg, lg.topk(k, dim=-1).indices.sort(dim=-1).values, top[:, k - 1] - top[:, k]


def group_routing_stats(cfg, gates):
    """routing_stats for GLM-4.5 / DeepSeek-V3 (group_route) and gpt-oss (bias_route) from gate_hooks' capture:
    (margin, idle [(MoE layer position, e)], chosen experts per MoE layer [T,k], whether the float64 choice is
    transformers' in every layer, whether leaving out the bias (and, with a group limit, the limit) changes it in
    every layer)."""
    E = num_experts(cfg)
    margin, idle, sels, same, sensitive = math.inf, [], [], True, True
    for pos, li in enumerate(sorted(gates)):
        g, x, out = gates[li]
        if is_gpt_oss(cfg):
            idx, w, b = out[1], g.weight.detach(), g.bias.detach()
            _, sel, m = bias_route(cfg, x, w, b)
            sensitive = sensitive and not torch.equal(sel, bias_route(cfg, x, w, b, use_bias=False)[1])
        else:
            idx, w, b = out[0], g.weight.detach(), g.e_score_correction_bias
            _, sel, m = group_route(cfg, x, w, b)
            sensitive = sensitive and not torch.equal(sel, group_route(cfg, x, w, b, use_bias=False)[1])
            if cfg.n_group > cfg.topk_group:
                sensitive = sensitive and not torch.equal(sel, group_route(cfg, x, w, b, groups=False)[1])
        margin = min(margin, m.min().item())
        same = same and torch.equal(sel, idx.sort(dim=-1).values)
        hits = torch.bincount(sel.reshape(-1), minlength=E)
        idle += [(pos, e) for e in range(E) if hits[e] == 0]
        sels.append(sel)
    return margin, idle, sels, same, sensitive


def usable_routing(fx, model, cfg, ids):
    """The model's routing of ids keeps away from ties, and has exactly one idle expert when fx needs one;
    GLM-4.5's (DeepSeek-V3's, gpt-oss's) also changes without the router bias (and without the group limit, where
    there is one) in every MoE layer."""
    if has_hooked_router(cfg):
        gates, hooks = gate_hooks(model)
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        for h in hooks:
            h.remove()
        margin, idle, _, same, sensitive = group_routing_stats(cfg, gates)
        if not (same and sensitive):
            return False
    else:
        with torch.no_grad():
            out = model(input_ids=ids, output_router_logits=True, use_cache=False)
        margin, idle = routing_stats(out.router_logits, cfg.num_experts_per_tok, num_experts(cfg))
    return margin >= MIN_ROUTING_MARGIN and len(idle) == (1 if fx["need_idle_expert"] else len(idle))


def pick_seed(fx):
    for seed in range(fx["seed"], fx["seed"] + SEED_TRIES):
        model, ids = build(fx, seed)
        if usable_routing(fx, model, model.config, ids):
            return seed
    fail(f"{fx['name']}: no usable seed in [{fx['seed']}, {fx['seed'] + SEED_TRIES})")


def num_experts(cfg):
    return getattr(cfg, "num_local_experts", None) or getattr(cfg, "n_routed_experts", None) or cfg.num_experts


def dead_experts(sels, moe_layers, loss_mask, n_layers, E, aux):
    """(layer, e) of the routed experts that get tokens none of which reaches the loss, so that their
    gradient is all zero (not None). In the last layer the MLP output of position t reaches only
    logits[t], counted iff loss_mask[b, t+1] (an aux loss reaches the router only). In an earlier
    layer it reaches positions t..S-1 of its sequence (causal attention): with an aux loss (aux) and
    a later MoE layer, that layer's router logits at every position, so it always counts; without
    (GLM-4.5), it counts iff one of positions t..S-1 predicts a counted target (here: every position
    but the last). sels: the chosen experts [B*S, k] of each MoE layer."""
    counts = torch.zeros(B, S, dtype=torch.bool)
    counts[:, :-1] = loss_mask[:, 1:].bool()
    later = counts.int().flip(-1).cummax(-1).values.flip(-1).bool()  # a counted target at t' >= t
    dead = []
    for li, sel in zip(moe_layers, sels):
        if li == n_layers - 1:
            reach = counts
        elif aux and any(l > li for l in moe_layers):
            reach = torch.ones(B, S, dtype=torch.bool)
        else:
            reach = later
        sel = sel.reshape(B, S, -1)
        dead += [(li, e) for e in range(E) if (sel == e).any() and not ((sel == e).any(-1) & reach).any()]
    return dead


# ----------------------------------------------------------------------------- checks
def ref_moe(blk, x, cfg, renorm):
    """fp64 reference of one sparse MoE block from its parameters."""
    d = lambda t: t.detach().double()
    x = d(x).reshape(-1, x.shape[-1])
    p = torch.softmax(x @ d(blk.gate.weight).T, dim=-1)
    w, idx = p.topk(cfg.num_experts_per_tok, dim=-1)
    if renorm:
        w = w / w.sum(-1, keepdim=True)

    def mlp(m, v):
        if hasattr(m, "w1"):
            return F.silu(v @ d(m.w1.weight).T) * (v @ d(m.w3.weight).T) @ d(m.w2.weight).T
        return (F.silu(v @ d(m.gate_proj.weight).T) * (v @ d(m.up_proj.weight).T)) @ d(m.down_proj.weight).T

    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            y[t] += w[t, j] * mlp(blk.experts[int(idx[t, j])], x[t:t + 1])[0]
    if hasattr(blk, "shared_expert"):
        y += torch.sigmoid(x @ d(blk.shared_expert_gate.weight).T) * mlp(blk.shared_expert, x)
    return y


def ref_group_moe(blk, x, cfg, use_bias=True, groups=True, renorm=None, choice_weights=False, scaling=None,
                  shared=True):
    """fp64 reference of one Glm4MoeMoE (DeepseekV3MoE) block from its parameters and router bias: the choice
    of group_route,
    weights = the chosen experts' sigmoid scores (choice_weights: scores + bias), / (sum + 1e-20) if
    renorm (default norm_topk_prob), * scaling (default routed_scaling_factor), sum_j w_j Expert_j(x)
    + shared_experts(x) (ungated). The keyword arguments give the wrong variants of check_moe_block."""
    d = lambda t: t.detach().double()  # noqa: E731
    x = d(x).reshape(-1, x.shape[-1])
    g = blk.gate
    s, sel, _ = group_route(cfg, x, d(g.weight), d(g.e_score_correction_bias), use_bias, groups)
    w = (s + d(g.e_score_correction_bias) if choice_weights else s).gather(1, sel)
    if cfg.norm_topk_prob if renorm is None else renorm:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * (cfg.routed_scaling_factor if scaling is None else scaling)

    def mlp(m, v):
        return (F.silu(v @ d(m.gate_proj.weight).T) * (v @ d(m.up_proj.weight).T)) @ d(m.down_proj.weight).T

    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(sel.shape[1]):
            y[t] += w[t, j] * mlp(blk.experts[int(sel[t, j])], x[t:t + 1])[0]
    return y + mlp(blk.shared_experts, x) if shared else y


def group_wrong_variants(cfg):
    """check_moe_block's wrong GLM-4.5 / DeepSeek-V3 blocks, each of which the fixture must tell from the right one."""
    v = {"the router bias left out of the choice": dict(use_bias=False),
         "renormalisation flipped": dict(renorm=not cfg.norm_topk_prob),
         "weights from the choice scores (scores + bias)": dict(choice_weights=True),
         "shared experts left out": dict(shared=False)}
    if cfg.n_group > cfg.topk_group:
        v["the group limit left out"] = dict(groups=False)
    if cfg.routed_scaling_factor != 1.0:
        v["routed_scaling_factor left out"] = dict(scaling=1.0)
    return v


def check_moe_block(name, model, captured):
    """The block output equals sum_j w_j * Expert(x) (+ sigmoid-gated shared expert) with
    renormalisation exactly as the family does it, and not with it flipped. GLM-4.5 / DeepSeek-V3:
    ref_group_moe, and none of group_wrong_variants (the router bias, the group limit, ... matter)."""
    cfg = model.config
    if is_gpt_oss(cfg):
        return check_gpt_oss_moe(name, cfg, captured)
    if is_group_router(cfg):
        for li, (blk, x, y) in captured.items():
            y = y.detach().double().reshape(-1, y.shape[-1])
            err = (ref_group_moe(blk, x, cfg) - y).abs().max().item()
            need(err < 1e-5, f"{name}: layer {li} MoE block differs from the reference by {err}")
            for what, kw in group_wrong_variants(cfg).items():
                err = (ref_group_moe(blk, x, cfg, **kw) - y).abs().max().item()
                need(err > 1e-3, f"{name}: layer {li} MoE block insensitive to {what} ({err})")
        return
    renorm = True if cfg.model_type == "mixtral" else bool(cfg.norm_topk_prob)
    for li, (blk, x, y) in captured.items():
        y = y.detach().double().reshape(-1, y.shape[-1])
        err = (ref_moe(blk, x, cfg, renorm) - y).abs().max().item()
        err_flipped = (ref_moe(blk, x, cfg, not renorm) - y).abs().max().item()
        need(err < 1e-5, f"{name}: layer {li} MoE block differs from the reference by {err}")
        need(err_flipped > 1e-3, f"{name}: layer {li} MoE block insensitive to renormalisation")


def check_group_router(name, cfg, gates, router_logits):
    """GLM-4.5 / DeepSeek-V3: the router's weights are, bit for bit, sigmoid(router_logits) gathered at its choice,
    / (sum + 1e-20) if norm_topk_prob, * routed_scaling_factor (so router_logits are the logits it used)."""
    for li, lg in zip(sorted(gates), router_logits):
        _, _, (idx, w) = gates[li]
        ref = lg.sigmoid().gather(1, idx)
        if cfg.norm_topk_prob:
            ref = ref / (ref.sum(dim=-1, keepdim=True) + 1e-20)
        ref = ref * cfg.routed_scaling_factor
        need(torch.equal(ref, w), f"{name}: layer {li} router weights are not those of its logits")


def check_ignores_router_flag(name, model, ids, labels, logits, loss):
    """GLM-4.5 (DeepSeek-V3) accepts output_router_logits=True (its forward's **kwargs) and ignores it: the same logits
    and loss, no router logits, no aux loss."""
    with torch.no_grad():
        o = model(input_ids=ids, labels=labels, use_cache=False, output_router_logits=True)
    need(torch.equal(o.logits, logits) and torch.equal(o.loss, loss) and sorted(o.keys()) == ["logits", "loss"],
         f"{name}: output_router_logits=True changes the output ({sorted(o.keys())})")


# ----------------------------------------------------------------------------- MLA (DeepSeek-V3)
LATENT_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: DeepseekV3RMSNorm's default, not rms_norm_eps


def yarn_mscale(scale, mscale):
    """yarn_get_mscale: 0.1 * mscale * ln(scale) + 1 (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_freqs(rot, base, rs, max_pos, yarn=True, exponent_dim=None, truncate=None, attention_factor=True):
    """(inv_freq [rot/2] float64, attention_factor) of RoPE over rot dims with theta base: 1/base^(2i/rot), or with
    rope_scaling rs of rope_type yarn _compute_yarn_parameters' mix of those (extrapolation) and them / factor
    (interpolation), ramped over [low, high]: the correction range of beta_fast / beta_slow (defaults 32 / 1) over
    original_max_position_embeddings (default max_pos), floor / ceil unless rs says truncate false, clamped to
    [0, rot-1]; attention_factor (cos and sin are multiplied by it) mscale(factor, mscale) / mscale(factor,
    mscale_all_dim) where both are set, else mscale(factor, 1); 1 without yarn. yarn False / exponent_dim / truncate /
    attention_factor False: the wrong variants (plain frequencies; another dim in the exponent; the other truncation;
    the factor left at 1)."""
    dim = exponent_dim or rot
    inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / dim)
    if rs is None or not yarn:
        return inv, 1.0
    need(rs["rope_type"] == "yarn" and "attention_factor" not in rs,
         f"rope_scaling {rs}: rope_freqs knows yarn with the attention factor from mscale only")
    f = rs["factor"]
    orig = rs.get("original_max_position_embeddings") or max_pos

    def corr(rotations):  # find_correction_dim
        return rot * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(rs.get("beta_fast") or 32), corr(rs.get("beta_slow") or 1)
    if rs.get("truncate", True) if truncate is None else truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot - 1)
    if low == high:
        high += 0.001
    extra = 1 - ((torch.arange(rot // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv = inv / f * (1 - extra) + inv * extra
    if not attention_factor:
        return inv, 1.0
    m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
    return inv, (yarn_mscale(f, m) / yarn_mscale(f, m_all) if m and m_all else yarn_mscale(f, 1))


def mla_rope(cfg, yarn=True, exponent_dim=None):
    """(inv_freq [rot/2] float64, attention_factor) of DeepSeek-V3's RoPE (rope_freqs), rot = qk_rope_head_dim
    (config.head_dim is set to it). yarn False / exponent_dim: the wrong variants (plain frequencies; another dim in
    the exponent)."""
    return rope_freqs(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings, yarn,
                      exponent_dim)


def mla_scale(cfg, yarn=True):
    """The softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 when rope_scaling has a
    (non-zero) mscale_all_dim (DeepseekV3Attention.__init__; whatever the rope type)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rs = cfg.rope_scaling
    if yarn and rs is not None and rs.get("mscale_all_dim", 0):
        scale *= yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2
    return scale


def ref_mla(attn, x, cfg, wrong_slice=False, interleave=None, yarn=True, exponent_dim=None, scale=None,
            q_norm=True, kv_norm=True):
    """fp64 reference of one DeepseekV3Attention from its parameters; x [B,S,H] its input (causal, positions
    0..S-1, no padding). q = q_proj(x) or q_b_proj(rmsnorm(q_a_proj(x))), per head [nope | rope]; kv_a_proj_with_mqa(x)
    = [c (kv_lora_rank) | k_rope (qk_rope_head_dim, one for all heads)]; kv_b_proj(rmsnorm(c)) per head
    [k_nope | v]; RoPE on the rope parts of q and k by pairs: (2i, 2i+1) with rope_interleave, else (i, i+rot/2),
    pair i turned by position * inv_freq[i], cos and sin times attention_factor; scores q.k * mla_scale, causal
    softmax, @ v, heads concatenated, o_proj. The keyword arguments give check_mla's wrong variants: RoPE on the
    first rot dims of the q / k heads (wrong_slice), the other pairing (interleave), the frequencies without
    YaRN, over another dim (exponent_dim), another scale, a latent norm left out."""
    d = lambda t: t.detach().double()  # noqa: E731
    x = d(x)
    Bx, Sx, _ = x.shape
    nh, dn, dr, dv, r = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim,
                         cfg.kv_lora_rank)

    def lin(v, m):
        return v @ d(m.weight).T + (d(m.bias) if m.bias is not None else 0.0)

    def rms(v, norm, on=True):
        return d(norm.weight) * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + LATENT_NORM_EPS) if on else v

    if cfg.q_lora_rank is None:
        q = lin(x, attn.q_proj)
    else:
        q = lin(rms(lin(x, attn.q_a_proj), attn.q_a_layernorm, q_norm), attn.q_b_proj)
    q = q.view(Bx, Sx, nh, dn + dr)
    ckv = lin(x, attn.kv_a_proj_with_mqa)
    kv = lin(rms(ckv[..., :r], attn.kv_a_layernorm, kv_norm), attn.kv_b_proj).view(Bx, Sx, nh, dn + dv)
    k = torch.cat([kv[..., :dn], ckv[..., None, r:].expand(Bx, Sx, nh, dr)], dim=-1)
    v = kv[..., dn:]

    inv, af = mla_rope(cfg, yarn, exponent_dim)
    ang = torch.arange(Sx, dtype=torch.float64)[:, None] * inv[None, :]  # [S, rot/2]
    cos, sin = (af * ang.cos())[None, :, None, :], (af * ang.sin())[None, :, None, :]
    inter = cfg.rope_interleave if interleave is None else interleave
    at = slice(0, dr) if wrong_slice else slice(dn, dn + dr)

    def rope(t):
        t = t.clone()
        u = t[..., at]
        a, b = (u[..., 0::2], u[..., 1::2]) if inter else (u[..., :dr // 2], u[..., dr // 2:])
        a, b = a * cos - b * sin, b * cos + a * sin
        if inter:
            u = torch.stack([a, b], dim=-1).reshape(u.shape)
        else:
            u = torch.cat([a, b], dim=-1)
        t[..., at] = u
        return t

    q, k = rope(q), rope(k)
    sc = torch.einsum("bshd,bthd->bhst", q, k) * (mla_scale(cfg, yarn) if scale is None else scale)
    sc = sc.masked_fill(torch.ones(Sx, Sx, dtype=torch.bool).triu(1), -math.inf)
    o = torch.einsum("bhst,bthd->bshd", sc.softmax(-1), v).reshape(Bx, Sx, nh * dv)
    return lin(o, attn.o_proj)


def mla_wrong_variants(cfg):
    """check_mla's wrong attentions, each of which the fixture must tell from the right one."""
    v = {"RoPE on the first qk_rope_head_dim dims of the q/k heads (not the last)": dict(wrong_slice=True),
         ("RoPE in halves (rotate_half without the de-interleave)" if cfg.rope_interleave else
          "RoPE on interleaved pairs"): dict(interleave=not cfg.rope_interleave),
         "inv_freq over qk_head_dim (not qk_rope_head_dim)": dict(exponent_dim=cfg.qk_nope_head_dim
                                                                   + cfg.qk_rope_head_dim),
         "softmax scale v_head_dim^-0.5": dict(scale=cfg.v_head_dim ** -0.5 * mla_scale(cfg)
                                               / mla_scale(cfg, yarn=False)),
         "kv_a_layernorm left out": dict(kv_norm=False)}
    if cfg.q_lora_rank is not None:
        v["q_a_layernorm left out"] = dict(q_norm=False)
    if cfg.rope_scaling is not None:
        v["plain RoPE frequencies (not YaRN's)"] = dict(yarn=False, scale=mla_scale(cfg))
        v["softmax scale without mscale^2"] = dict(scale=mla_scale(cfg, yarn=False))
    return v


def check_mla(name, model, captured):
    """DeepSeek-V3: transformers' RoPE buffer, attention factor and softmax scale are mla_rope's / mla_scale's,
    and every layer's attention output (o_proj's) is ref_mla's within 1e-5 and more than 1e-3 away from each of
    mla_wrong_variants. captured[layer] = (attention module, its input [B,S,H], its output). Returns the largest
    error, and the smallest distance to a wrong variant per variant."""
    cfg = model.config
    inv, af = mla_rope(cfg)
    re_ = model.model.rotary_emb
    need(torch.allclose(re_.inv_freq.double(), inv, rtol=1e-6, atol=0) and abs(re_.attention_scaling - af) < 1e-12,
         f"{name}: RoPE inv_freq {re_.inv_freq.tolist()} / factor {re_.attention_scaling}, "
         f"expected {inv.tolist()} / {af}")
    worst, wrong = 0.0, {}
    for li, (attn, x, y) in sorted(captured.items()):
        need(abs(attn.scaling - mla_scale(cfg)) < 1e-12, f"{name}: layer {li} scaling {attn.scaling}")
        need(attn.kv_a_layernorm.variance_epsilon == LATENT_NORM_EPS and (
            cfg.q_lora_rank is None or attn.q_a_layernorm.variance_epsilon == LATENT_NORM_EPS),
            f"{name}: layer {li} latent norm eps")
        y = y.detach().double()
        err = (ref_mla(attn, x, cfg) - y).abs().max().item()
        need(err < 1e-5, f"{name}: layer {li} attention differs from the MLA reference by {err}")
        worst = max(worst, err)
        for what, kw in mla_wrong_variants(cfg).items():
            e = (ref_mla(attn, x, cfg, **kw) - y).abs().max().item()
            need(e > 1e-3, f"{name}: layer {li} attention insensitive to {what} ({e})")
            wrong[what] = min(wrong.get(what, math.inf), e)
    return worst, wrong


# ----------------------------------------------------------------------------- gpt-oss
def gpt_oss_route(blk, x, cfg, use_bias=True, softmax_all=False):
    """gpt-oss's routing in float64 of the router input x [T,H]: (combine weights [T,k], chosen experts [T,k]):
    the top-k of the logits x W^T + b, softmax over those k (GptOssTopKRouter). softmax_all: the wrong variant
    (softmax over all E, then the top-k probabilities, not renormalised)."""
    d = lambda t: t.detach().double()  # noqa: E731
    r = blk.router
    lg = x @ d(r.weight).T + (d(r.bias) if use_bias else 0.0)
    if softmax_all:
        return lg.softmax(-1).topk(cfg.num_experts_per_tok, dim=-1)
    top, idx = lg.topk(cfg.num_experts_per_tok, dim=-1)
    return top.softmax(-1), idx


def gpt_oss_expert(ex, e, v, halves=False, swap=False, clamp=True, gate_floor=False, plus_one=True, alpha=None):
    """One gpt-oss expert e on rows v [n,H] in float64: (h [n,I] = (up + 1) * gate * sigmoid(alpha * gate) before
    down_proj, gate [n,I] and up [n,I] before their clamps), gate_up = v @ gate_up_proj[e] + gate_up_proj_bias[e]
    with gate = its even columns, up = its odd ones; gate clamped above at limit only, up to [-limit, limit]
    (GptOssExperts.forward). The keyword arguments give check_gpt_oss_moe's wrong variants."""
    d = lambda t: t.detach().double()  # noqa: E731
    gu = v @ d(ex.gate_up_proj[e]) + d(ex.gate_up_proj_bias[e])
    I = gu.shape[-1] // 2
    gate, up = (gu[..., :I], gu[..., I:]) if halves else (gu[..., 0::2], gu[..., 1::2])
    if swap:
        gate, up = up, gate
    g, u = gate, up
    if clamp:
        g = g.clamp(min=-ex.limit if gate_floor else None, max=ex.limit)
        u = u.clamp(min=-ex.limit, max=ex.limit)
    h = g * torch.sigmoid(g * (ex.alpha if alpha is None else alpha))
    return ((u + 1) * h if plus_one else u * h), gate, up


def ref_gpt_oss_moe(blk, x, cfg, use_bias=True, softmax_all=False, bias_weighted=True, **expert_kw):
    """fp64 reference of one GptOssMLP block from its parameters: sum_j w_j (h_j @ down_proj[e_j] +
    down_proj_bias[e_j]) (gpt_oss_route, gpt_oss_expert). The keyword arguments give check_gpt_oss_moe's wrong
    variants (bias_weighted False: down_proj_bias added outside the routing weight)."""
    d = lambda t: t.detach().double()  # noqa: E731
    x = d(x).reshape(-1, x.shape[-1])
    ex = blk.experts
    w, idx = gpt_oss_route(blk, x, cfg, use_bias, softmax_all)
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            h = gpt_oss_expert(ex, e, x[t:t + 1], **expert_kw)[0][0]
            o = h @ d(ex.down_proj[e])
            y[t] += w[t, j] * (o + d(ex.down_proj_bias[e])) if bias_weighted else w[t, j] * o + d(ex.down_proj_bias[e])
    return y


def gpt_oss_clamps(blk, x, cfg):
    """How many elements of the chosen experts' gate and up (over every token and chosen expert) lie beyond the
    clamps: {"gate > limit", "gate < -limit", "up > limit", "up < -limit"}, out of "elements" each."""
    x = x.detach().double().reshape(-1, x.shape[-1])
    _, idx = gpt_oss_route(blk, x, cfg)
    lim, n = blk.experts.limit, {"gate > limit": 0, "gate < -limit": 0, "up > limit": 0, "up < -limit": 0,
                                 "elements": 0}
    for t in range(x.shape[0]):
        for e in idx[t].tolist():
            _, gate, up = gpt_oss_expert(blk.experts, e, x[t:t + 1])
            n["gate > limit"] += int((gate > lim).sum())
            n["gate < -limit"] += int((gate < -lim).sum())
            n["up > limit"] += int((up > lim).sum())
            n["up < -limit"] += int((up < -lim).sum())
            n["elements"] += gate.numel()
    return n


GPT_OSS_MOE_WRONG = {
    "the router bias left out": dict(use_bias=False),
    "softmax over all E, then top-k (not over the k chosen logits)": dict(softmax_all=True),
    "gate / up as halves of gate_up_proj (not interleaved)": dict(halves=True),
    "gate and up swapped": dict(swap=True),
    "no clamps": dict(clamp=False),
    "up without the + 1": dict(plus_one=False),
    "sigmoid(gate) without alpha (plain SiLU)": dict(alpha=1.0),
    "down_proj_bias outside the routing weight": dict(bias_weighted=False),
}


def check_gpt_oss_moe(name, cfg, captured):
    """gpt-oss: GptOssExperts' constants are alpha 1.702 and limit 7; every MoE block's output is ref_gpt_oss_moe's
    within 1e-5 and more than 1e-3 away from each of GPT_OSS_MOE_WRONG; every clamp (gate above, up above and
    below) is active in every MoE layer, and gate also lies below -limit somewhere (where it is not clamped; clamping
    it there would change h by less than 1e-4: gate * sigmoid(1.702 * gate) is ~0 either way, so no wrong variant
    of that shows). Returns the clamp counts per layer and the smallest distance to each wrong variant."""
    clamps, wrong = {}, {}
    for li, (blk, x, y) in sorted(captured.items()):
        need(blk.experts.alpha == 1.702 and blk.experts.limit == 7.0,
             f"{name}: layer {li} alpha {blk.experts.alpha} limit {blk.experts.limit}")
        y = y.detach().double().reshape(-1, y.shape[-1])
        err = (ref_gpt_oss_moe(blk, x, cfg) - y).abs().max().item()
        need(err < 1e-5, f"{name}: layer {li} MoE block differs from the reference by {err}")
        for what, kw in GPT_OSS_MOE_WRONG.items():
            e = (ref_gpt_oss_moe(blk, x, cfg, **kw) - y).abs().max().item()
            need(e > 1e-3, f"{name}: layer {li} MoE block insensitive to {what} ({e})")
            wrong[what] = min(wrong.get(what, math.inf), e)
        clamps[li] = gpt_oss_clamps(blk, x, cfg)
        need(all(v > 0 for v in clamps[li].values()), f"{name}: layer {li} clamps not all reached: {clamps[li]}")
    return clamps, wrong


def gpt_oss_router_logits(gates):
    """The raw router logits x W^T + b [T,E] F32 of each MoE layer (ascending), as GptOssTopKRouter.forward computes
    them (F.linear of the router input, weight and bias)."""
    return [F.linear(x, g.weight.detach(), g.bias.detach()) for g, x, _ in (gates[li] for li in sorted(gates))]


def check_gpt_oss_router(name, cfg, gates, router_logits, recorded):
    """gpt-oss: each router's output (router_scores, router_indices) is, bit for bit, the top-k of router_logits with
    a softmax over the k scattered into zeros [T,E]; and the model's recorded router_logits (out.router_logits, what
    the aux loss is computed from) are those router_scores, not the logits."""
    k = cfg.num_experts_per_tok
    for li, lg, rec in zip(sorted(gates), router_logits, recorded):
        _, _, (scores, idx) = gates[li]
        top, i = torch.topk(lg, k, dim=-1)
        ref = torch.zeros_like(lg).scatter_(1, i, F.softmax(top, dim=1, dtype=top.dtype))
        need(torch.equal(i, idx) and torch.equal(ref, scores),
             f"{name}: layer {li} router scores are not those of its logits")
        need(torch.equal(rec.detach(), scores), f"{name}: layer {li} recorded router_logits are not the router scores")


def ref_sink_attention(attn, x, cfg, window=False, sinks=True, interleave=False, biases=True, **rope_kw):
    """fp64 reference of one GptOssAttention from its parameters; x [B,S,H] its input (positions 0..S-1, no padding).
    q / k / v = x W^T + b per head (head_dim), RoPE (rope_freqs: pairs (i, i + head_dim/2), cos and sin times the
    attention factor), GQA (kv head h serves query heads h*g .. h*g+g-1), scores q.k * head_dim^-0.5, causal mask and,
    on a sliding_attention layer, key s' visible from query s iff s' > s - sliding_window; one more logit per head, its
    sink, joins each row's softmax and is dropped after it; @ v, o_proj (with its bias). window: the layer's own
    (False), None (none) or a width (check_sink_attention's wrong variants, as the other keyword arguments: sinks left
    out, RoPE on interleaved pairs, biases left out, rope_freqs' variants)."""
    d = lambda t: t.detach().double()  # noqa: E731
    x = d(x)
    Bx, Sx, _ = x.shape
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def lin(v, m):
        return v @ d(m.weight).T + (d(m.bias) if biases and m.bias is not None else 0.0)

    q = lin(x, attn.q_proj).view(Bx, Sx, nh, hd)
    k = lin(x, attn.k_proj).view(Bx, Sx, nkv, hd).repeat_interleave(nh // nkv, dim=2)
    v = lin(x, attn.v_proj).view(Bx, Sx, nkv, hd).repeat_interleave(nh // nkv, dim=2)
    inv, af = rope_freqs(hd, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings, **rope_kw)
    ang = torch.arange(Sx, dtype=torch.float64)[:, None] * inv[None, :]  # [S, hd/2]
    cos, sin = (af * ang.cos())[None, :, None, :], (af * ang.sin())[None, :, None, :]

    def rope(t):
        a, b = (t[..., 0::2], t[..., 1::2]) if interleave else (t[..., :hd // 2], t[..., hd // 2:])
        a, b = a * cos - b * sin, b * cos + a * sin
        return torch.stack([a, b], dim=-1).reshape(t.shape) if interleave else torch.cat([a, b], dim=-1)

    q, k = rope(q), rope(k)
    sc = torch.einsum("bshd,bthd->bhst", q, k) * hd ** -0.5
    w = attn.sliding_window if window is False else window
    s_, t_ = torch.arange(Sx)[:, None], torch.arange(Sx)[None, :]
    hidden = (t_ > s_) | ((t_ <= s_ - w) if w is not None else False)
    sc = sc.masked_fill(hidden, -math.inf)
    if sinks:
        sink = d(attn.sinks)[None, :, None, None].expand(Bx, nh, Sx, 1)
        p = torch.cat([sc, sink], dim=-1).softmax(-1)[..., :-1]
    else:
        p = sc.softmax(-1)
    o = torch.einsum("bhst,bthd->bshd", p, v).reshape(Bx, Sx, nh * hd)
    return lin(o, attn.o_proj)


def sink_attention_wrong_variants(cfg, attn):
    """check_sink_attention's wrong attentions for one layer, each of which the fixture must tell from the right one."""
    v = {"sinks left out": dict(sinks=False), "RoPE on interleaved pairs": dict(interleave=True),
         "attention biases left out": dict(biases=False)}
    if attn.sliding_window is not None:
        v["the sliding window ignored"] = dict(window=None)
        v["the sliding window one wider (s' >= s - sliding_window)"] = dict(window=attn.sliding_window + 1)
    else:
        v["a sliding window on a full_attention layer"] = dict(window=cfg.sliding_window)
    rs = cfg.rope_scaling
    if rs is not None:
        v["plain RoPE frequencies (not YaRN's)"] = dict(yarn=False)
        v["YaRN without its attention factor"] = dict(attention_factor=False)
        v["YaRN's correction range " + ("truncated (floor / ceil)" if not rs.get("truncate", True) else
                                        "not truncated")] = dict(truncate=not rs.get("truncate", True))
    return v


def check_sink_attention(name, model, captured):
    """gpt-oss: transformers' RoPE buffer and attention factor are rope_freqs', each layer's scale head_dim^-0.5 and
    window its layer type's, and every layer's attention output (o_proj's) is ref_sink_attention's within 1e-5 and
    more than 1e-3 away from each of sink_attention_wrong_variants. captured[layer] = (attention module, its input
    [B,S,H], its output). Returns the largest error, and the smallest distance to a wrong variant per variant."""
    cfg = model.config
    inv, af = rope_freqs(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
    re_ = model.model.rotary_emb
    need(torch.allclose(re_.inv_freq.double(), inv, rtol=1e-6, atol=0) and abs(re_.attention_scaling - af) < 1e-12,
         f"{name}: RoPE inv_freq {re_.inv_freq.tolist()} / factor {re_.attention_scaling}, "
         f"expected {inv.tolist()} / {af}")
    worst, wrong = 0.0, {}
    for li, (attn, x, y) in sorted(captured.items()):
        slides = cfg.layer_types[li] == "sliding_attention"
        need(attn.scaling == cfg.head_dim ** -0.5 and attn.sliding_window == (cfg.sliding_window if slides else None),
             f"{name}: layer {li} scaling {attn.scaling} window {attn.sliding_window}")
        y = y.detach().double()
        err = (ref_sink_attention(attn, x, cfg) - y).abs().max().item()
        need(err < 1e-5, f"{name}: layer {li} attention differs from the reference by {err}")
        worst = max(worst, err)
        for what, kw in sink_attention_wrong_variants(cfg, attn).items():
            e = (ref_sink_attention(attn, x, cfg, **kw) - y).abs().max().item()
            need(e > 1e-3, f"{name}: layer {li} attention insensitive to {what} ({e})")
            wrong[what] = min(wrong.get(what, math.inf), e)
    return worst, wrong


def check_attention(name, model, captured):
    """The families whose attention is checked against an fp64 reference: DeepSeek-V3 (check_mla), gpt-oss
    (check_sink_attention); (None, {}) for the others."""
    cfg = model.config
    if is_mla(cfg):
        return check_mla(name, model, captured)
    if is_gpt_oss(cfg):
        return check_sink_attention(name, model, captured)
    return None, {}


def check_fused_expert_grads(name, model, grads, moe_layers, idle, dead):
    """gpt-oss's experts are fused [E, ...] tensors (mlp.experts.gate_up_proj, gate_up_proj_bias, down_proj,
    down_proj_bias): every one has a gradient, and in MoE layer l expert e's slice [e] of each is all zero iff (l, e)
    is idle or in dead (its tokens reach no counted target); the router's row e (mlp.router.weight[e], bias[e]) is
    all zero iff (l, e) is idle (the router's gradient reaches only the chosen logits: the scores are a scatter of
    the softmax over the k into zeros; the aux loss reaches a dead expert's row). Returns the names checked."""
    checked = []
    for li in moe_layers:
        pre = f"model.layers.{li}.mlp."
        for n in ("experts.gate_up_proj", "experts.gate_up_proj_bias", "experts.down_proj", "experts.down_proj_bias",
                  "router.weight", "router.bias"):
            g = grads[pre + n]
            zero_rows = [e for e in range(g.shape[0]) if not g[e].any()]
            want = [e for e in range(g.shape[0]) if (li, e) in idle or (n.startswith("experts.") and (li, e) in dead)]
            need(zero_rows == want, f"{name}: {pre + n}: all-zero slices {zero_rows}, expected {want}")
            checked.append(pre + n)
    return checked


def attn_hooks(model):
    """Forward hooks on every layer's self_attn (called with keyword arguments): captured[layer] = (module,
    hidden_states [B,S,H], attention output [B,S,H]). Returns captured and the hooks."""
    captured, hooks = {}, []
    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(
            lambda m, args, kwargs, out, i=i: captured.__setitem__(
                i, (m, kwargs["hidden_states"].detach().clone(), out[0].detach().clone())), with_kwargs=True))
    return captured, hooks


def check_aux(name, router_logits, k, E, aux):
    """aux = E * sum_{j,e} mean_n onehot(topk)[n,j,e] * mean_n softmax[n,e], rows of all
    MoE layers concatenated (load_balancing_loss_func); aux None: computed, not compared."""
    lg = torch.cat([t.detach() for t in router_logits]).double()
    p = torch.softmax(lg, dim=-1)
    f = F.one_hot(p.topk(k, dim=-1).indices, E).double().mean(0)
    ref = E * (f * p.mean(0)).sum()
    need(aux is None or abs(ref.item() - aux) <= 1e-5 * abs(aux), f"{name}: aux {aux} != pooled formula {ref.item()}")
    per_layer = [E * (F.one_hot(torch.softmax(t.detach().double(), -1).topk(k, -1).indices, E).double().mean(0)
                      * torch.softmax(t.detach().double(), -1).mean(0)).sum().item() for t in router_logits]
    return ref.item(), per_layer


def check_adamw(name, before, after, grads):
    t = 1
    bc1, bc2 = 1 - BETA1 ** t, 1 - BETA2 ** t
    worst = 0.0
    for n, p0 in before.items():
        if n not in grads:
            need(torch.equal(after[n], p0), f"{name}: {n} has no grad but AdamW changed it")
            continue
        g, p0d = grads[n].double(), p0.double()
        m, v = (1 - BETA1) * g, (1 - BETA2) * g * g
        ref = p0d * (1 - LR * WD) - (LR / bc1) * m / (v.sqrt() / math.sqrt(bc2) + EPS)
        worst = max(worst, (ref - after[n].double()).abs().max().item())
    need(worst < 1e-6, f"{name}: AdamW step differs from the decoupled formula by {worst}")
    return worst


# ----------------------------------------------------------------------------- one fixture
def batch_tensors(ids, labels, loss_mask, logits, loss, ce, aux, moe_layers, router_logits):
    """A fixture's batch and what the model made of it, as fixture.safetensors holds them."""
    tensors = {
        "input_ids": ids.numpy().astype("<i4"),
        "labels": labels.numpy().astype("<i4"),
        "loss_mask": loss_mask.numpy().astype("<i4"),
        "logits": logits.numpy().astype("<f4"),
        "loss": np.array(loss.item(), dtype="<f4"),
        "ce_loss": np.array(ce.item(), dtype="<f4"),
        "aux_loss": np.array(aux.item(), dtype="<f4"),
    }
    for li, lg in zip(moe_layers, router_logits):
        tensors[f"router_logits.{li}"] = lg.detach().numpy().astype("<f4")
    return tensors


def fixture_dir(outdir, name):
    """The directory of fixture name under outdir, made empty."""
    d = os.path.join(outdir, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    return d


def write_fixture(name, path, tensors, meta):
    """fixture.safetensors by write_st, asserted to read back (read_st) as written."""
    write_st(path, tensors, meta)
    back, back_meta = read_st(path)
    need(back_meta == meta and set(back) == set(tensors), f"{name}: fixture.safetensors does not read back")
    for n, a in tensors.items():
        need(np.array_equal(back[n], a), f"{name}: {n} does not read back")


def make_fixture(fx, outdir):
    name = fx["name"]
    seed = pick_seed(fx)
    model, ids = build(fx, seed)
    cfg = model.config
    k, E, V = cfg.num_experts_per_tok, num_experts(cfg), cfg.vocab_size
    moe_layers = [i for i, l in enumerate(model.model.layers) if moe_block(l) is not None]

    d = fixture_dir(outdir, name)
    model.save_pretrained(d, safe_serialization=True)
    for f in os.listdir(d):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, f))
        else:
            os.chmod(os.path.join(d, f), 0o644)
    # Saved buffers that are not parameters (GLM's, DeepSeek's router bias): in model.safetensors, F32, never trained.
    params = dict(model.named_parameters())
    with safe_open(os.path.join(d, "model.safetensors"), framework="pt") as f:
        frozen = sorted(n for n in f.keys() if n not in params)
        need(all(f.get_slice(n).get_dtype() == "F32" for n in frozen), f"{name}: a saved buffer is not F32")
    frozen_init = {n: b.detach().clone() for n, b in frozen_buffers(model)}
    need(frozen == sorted(frozen_init), f"{name}: saved non-parameters {frozen}, buffers {sorted(frozen_init)}")
    need(bool(frozen) == is_group_router(cfg), f"{name}: saved non-parameters {frozen}")

    labels, loss_mask = make_labels(ids)
    captured, hooks = {}, []
    for i in moe_layers:
        blk = moe_block(model.model.layers[i])
        hooks.append(blk.register_forward_hook(lambda m, inp, out, i=i: captured.__setitem__(
            i, (m, inp[0].detach().clone(), (out[0] if isinstance(out, tuple) else out).detach().clone()))))
    gates, gate_hks = gate_hooks(model)
    attns, attn_hks = attn_hooks(model) if is_mla(cfg) or is_gpt_oss(cfg) else ({}, [])
    out = model(input_ids=ids, labels=labels, use_cache=False, **forward_kw(cfg))
    for h in hooks + gate_hks + attn_hks:
        h.remove()

    if is_group_router(cfg):
        need(sorted(gates) == moe_layers, f"{name}: routers of layers {sorted(gates)} for MoE layers {moe_layers}")
        need(getattr(out, "aux_loss", None) is None and getattr(out, "router_logits", None) is None,
             f"{name}: {GROUP_ROUTER[cfg.model_type][0]} returned an aux loss or router logits")
        router_logits = group_router_logits(gates)
        check_group_router(name, cfg, gates, router_logits)
    elif is_gpt_oss(cfg):  # out.router_logits are the routers' scores: the logits are recomputed from their input
        need(sorted(gates) == moe_layers, f"{name}: routers of layers {sorted(gates)} for MoE layers {moe_layers}")
        router_logits = gpt_oss_router_logits(gates)
        check_gpt_oss_router(name, cfg, gates, router_logits, out.router_logits)
    else:
        router_logits = out.router_logits
    need(len(router_logits) == len(moe_layers),
         f"{name}: {len(router_logits)} router logits for MoE layers {moe_layers}")
    logits = out.logits.detach()
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V).float(), labels[:, 1:].reshape(-1), ignore_index=-100)
    n_targets = int(loss_mask.sum())
    need(n_targets == int((labels[:, 1:] != -100).sum()), f"{name}: loss_mask count")
    # the same CE from loss_mask (documents the mask's coordinates)
    lp = torch.log_softmax(logits.double(), -1)
    ce_mask = -(lp[:, :-1].gather(-1, ids[:, 1:, None].clamp(min=0))[..., 0] * loss_mask[:, 1:]).sum() / n_targets
    need(abs(ce_mask.item() - ce.item()) < 1e-5, f"{name}: ce from loss_mask {ce_mask.item()} != {ce.item()}")
    aux = torch.zeros((), dtype=torch.float32) if is_group_router(cfg) else out.aux_loss.detach()
    loss = out.loss.detach()
    need(torch.isfinite(loss) and torch.isfinite(aux) and torch.isfinite(logits).all(), f"{name}: non-finite")
    need(aux.item() > 0 or is_group_router(cfg), f"{name}: aux {aux.item()}")
    need(abs(loss.item() - (ce.item() + aux_coef(cfg) * aux.item())) <= 1e-6 * abs(loss.item()),
         f"{name}: loss {loss.item()} != ce + coef*aux")
    if is_group_router(cfg):
        aux_per_layer = []
        margin, idle, sels, same, sensitive = group_routing_stats(cfg, gates)
        need(same and sensitive, f"{name}: float64 routing is transformers' {same}, bias / group matter {sensitive}")
        check_ignores_router_flag(name, model, ids, labels, logits, loss)
    elif is_gpt_oss(cfg):  # the aux loss of the recorded router scores, which differs from that of the logits
        aux_ref, aux_per_layer = check_aux(name, out.router_logits, k, E, aux.item())
        aux_of_logits = check_aux(name, router_logits, k, E, None)[0]
        need(abs(aux_of_logits - aux.item()) > 1e-3, f"{name}: aux of the raw logits {aux_of_logits} = aux")
        margin, idle, sels, same, sensitive = group_routing_stats(cfg, gates)
        need(same and sensitive, f"{name}: float64 routing is transformers' {same}, the bias matters {sensitive}")
    else:
        aux_ref, aux_per_layer = check_aux(name, router_logits, k, E, aux.item())
        margin, idle = routing_stats(router_logits, k, E)
        sels = [lg.detach().topk(k, dim=-1).indices for lg in router_logits]
    moe_checked = check_moe_block(name, model, captured)
    attn_err, attn_wrong = check_attention(name, model, attns)
    idle = [(moe_layers[li], e) for li, e in idle]

    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None}
    no_grad = sorted(n for n, p in params.items() if p.grad is None)
    for n, g in grads.items():
        need(torch.isfinite(g).all(), f"{name}: grad of {n} not finite")
    idle_params = sorted(n for (li, e) in idle for n in params if n.startswith(expert_prefix(model, li, e)))
    dead = dead_experts(sels, moe_layers, loss_mask, cfg.num_hidden_layers, E, aux_coef(cfg) > 0)
    if is_gpt_oss(cfg):  # fused experts: every parameter has a grad; idle (and dead) experts' slices are zero
        need(not no_grad, f"{name}: unexpected no_grad {no_grad}")
        check_fused_expert_grads(name, model, grads, moe_layers, idle, dead)
        idle_params = sorted(f"model.layers.{li}.mlp.experts.{n}[{e}]" for li, e in idle
                             for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias"))
    elif cfg.model_type == "olmoe":  # loops over every expert: idle experts get an all-zero grad
        need(not no_grad, f"{name}: unexpected no_grad {no_grad}")
        for n in idle_params:
            need(not grads[n].any(), f"{name}: idle expert param {n} has a non-zero grad")
    else:  # loops over the experts hit only: idle experts get no grad at all
        need(no_grad == idle_params, f"{name}: no_grad {no_grad} != idle experts' params {idle_params}")
    dead_params = sorted(n for (li, e) in dead for n in params if n.startswith(expert_prefix(model, li, e)))
    zero = sorted(n for n in grads if not grads[n].any())
    expect_zero = sorted(set(dead_params) | (set(idle_params) if cfg.model_type == "olmoe" else set()))
    need(zero == expect_zero, f"{name}: all-zero grads {zero}, expected {expect_zero}")
    need(not fx["need_idle_expert"] or idle_params, f"{name}: no idle expert")

    before = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WD,
                            foreach=False)
    opt.step()
    need(all(params[n] not in opt.state for n in no_grad), f"{name}: AdamW kept state for a no-grad param")
    after = {n: p.detach().clone() for n, p in params.items()}
    adam_err = check_adamw(name, before, after, grads)
    bufs = dict(model.named_buffers())
    for n, b0 in frozen_init.items():  # not a parameter: no grad, AdamW never sees it
        need(n not in params and not bufs[n].requires_grad and torch.equal(bufs[n], b0),
             f"{name}: buffer {n} changed or is trained")
        after[n] = bufs[n].detach().clone()

    tensors = batch_tensors(ids, labels, loss_mask, logits, loss, ce, aux, moe_layers, router_logits)
    for n, g in grads.items():
        tensors[f"grad.{n}"] = g.numpy().astype("<f4")
    for n, p in after.items():
        tensors[f"after.{n}"] = p.numpy().astype("<f4")
    meta = {
        "format": "pt",
        "fixture": name,
        "model_type": cfg.model_type,
        "seed": str(seed),
        "init": (f"numpy default_rng(seed) (PCG64): for each parameter in named_parameters() order, "
                 f"z = standard_normal(shape) float64; norm weights 1+{NORM_STD}*z, "
                 + "".join(f"*.{k} {v}*z, " for k, v in sorted(fx.get("init_std", {}).items()))
                 + f"all others {INIT_STD}*z; cast to float32. " + (
                     f"Then for each saved buffer that is not a parameter (frozen), in named_buffers() order, "
                     f"z = standard_normal(shape) float64, {INIT_STD}*z cast to float32. " if frozen else "") +
                 "Then input_ids [B,S] from the same generator: integers over the vocab less pad_token_id"),
        "batch": f"B={B} S={S}; labels = input_ids with -100 at (b,s) {MASKED_LABELS}",
        "loss_mask": "labels coordinates: 1 iff labels[b,s] != -100 and s >= 1 (target of logits[b,s-1])",
        "n_targets": str(n_targets),
        "loss": (f"loss = ce_loss ({GROUP_ROUTER[cfg.model_type][0]} has no aux loss: aux_loss is written as 0); "
                 "ce_loss = mean over the n_targets targets" if is_group_router(cfg) else
                 "loss = ce_loss + router_aux_loss_coef * aux_loss; ce_loss = mean over the n_targets targets"),
        "router_aux_loss_coef": repr(aux_coef(cfg)),
        "optimizer": "torch.optim.AdamW(foreach=False), one step, one param group holding every parameter",
        "lr": repr(LR),
        "beta1": repr(BETA1),
        "beta2": repr(BETA2),
        "eps": repr(EPS),
        "weight_decay": repr(WD),
        "moe_layers": json.dumps(moe_layers),
        "idle_experts": json.dumps([list(x) for x in idle]),
        "no_grad": json.dumps(no_grad),
        "zero_grad_experts": json.dumps([list(x) for x in dead]),
        "min_routing_margin": f"{margin:.3e}",
        "torch_version": torch.__version__.split("+")[0],
        "transformers_version": transformers.__version__,
        "safetensors_version": safetensors.__version__,
        "numpy_version": np.__version__,
    }
    if frozen:
        meta["frozen"] = json.dumps(frozen)
    if is_group_router(cfg):
        meta["router_logits"] = ("raw router logits x W^T [B*S,E] of each MoE layer (F.linear of the router input "
                                 f"and mlp.gate.weight in float32, as {GROUP_ROUTER[cfg.model_type][1]}.forward "
                                 "computes them); "
                                 "scores = sigmoid of them")
        meta["min_routing_margin_rule"] = ("min over MoE layers and tokens of the gap between the topk_group-th and "
                                           "next group score (n_group > topk_group only) and of the gap between the "
                                           "k-th and (k+1)-th masked choice score, in float64")
    if is_gpt_oss(cfg):
        meta["router_logits"] = ("raw router logits x W^T + b [B*S,E] of each MoE layer (F.linear of the router input, "
                                 "mlp.router.weight and mlp.router.bias in float32, as GptOssTopKRouter.forward "
                                 "computes them); the experts are their top-k, the weights a softmax over those k")
        meta["aux_loss_rule"] = ("load_balancing_loss_func of the router scores [B*S,E] (what the model records as "
                                 "router_logits: the softmax over the top-k logits scattered into zeros), not of the "
                                 "raw logits: p = softmax(scores) over all E, f = mean one-hot of topk(p, k) (the same "
                                 "experts), aux = E * sum f * mean p, MoE layers pooled")
        meta["min_routing_margin_rule"] = ("min over MoE layers and tokens of the gap between the k-th and "
                                           "(k+1)-th raw router logit (bias included), in float64")
        meta["expert_grad_rule"] = ("experts fused: mlp.experts.{gate_up_proj, gate_up_proj_bias, down_proj, "
                                    "down_proj_bias} [E,...] always have a grad (no_grad empty); an idle expert's "
                                    "slice [e] of each is all zero (AdamW decays it), as are mlp.router.weight[e] and "
                                    "mlp.router.bias[e]; a zero_grad_experts expert's slices are all zero too, its "
                                    "router row not (the aux loss reaches it)")
        meta["swiglu"] = ("GptOssExperts: gate_up = x @ gate_up_proj[e] + gate_up_proj_bias[e] [2I]; gate = "
                          "gate_up[0::2], up = gate_up[1::2]; gate = min(gate, 7); up = clamp(up, -7, 7); "
                          "h = (up + 1) * gate * sigmoid(1.702 * gate); out = h @ down_proj[e] + down_proj_bias[e], "
                          "times the routing weight (alpha 1.702 and limit 7 are constants of the module, not read "
                          "from the config)")
    # The checked-in directory alone reproduces the logits.
    again = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager")
    again.train()
    with torch.no_grad():
        rl = again(input_ids=ids, use_cache=False).logits
    need(torch.equal(rl, logits), f"{name}: {d} reloaded gives other logits")

    path = os.path.join(d, "fixture.safetensors")
    write_fixture(name, path, tensors, meta)

    return dict(name=name, family=cfg.model_type, seed=seed, moe_layers=moe_layers, k=k, E=E, cfg=cfg,
                frozen=frozen,
                norm_topk=norm_topk(cfg),
                head_dim=(f"{cfg.qk_head_dim}/{cfg.v_head_dim}" if is_mla(cfg) else
                          getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads),
                attn_err=attn_err, attn_wrong=attn_wrong, moe_checked=moe_checked, layers=cfg.num_hidden_layers,
                rope_theta=cfg.rope_theta, eps=cfg.rms_norm_eps, loss=loss.item(), ce=ce.item(),
                aux=aux.item(), aux_per_layer=aux_per_layer, n_targets=n_targets, idle=idle, dead=dead,
                no_grad=len(no_grad), margin=margin, adam_err=adam_err,
                n_params=sum(p.numel() for p in params.values()))


# ----------------------------------------------------------------------------- NOTES.md
NOTES = """\
# Parity fixtures: facts the C code must match

Written by `tools/make_fixtures.py` (do not edit; rerun it). transformers {tf},
torch {torch}, float32 on the CPU. Every fact below is read from the installed
sources (file and function named) and asserted by the script, textually
(`source_facts`) and, where marked *(checked)*, numerically on every fixture.

## Fixtures (`<name>/config.json`, `model.safetensors` = initial weights, `fixture.safetensors`)

| name | family | MoE layers | renorm top-k | head_dim | rope_theta | eps | seed | idle experts (layer, e) | params with grad None | zero-grad experts | loss | ce | aux |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

All: H=32, 4 heads / 2 kv heads, vocab 64, E=8, k=2, expert I=16, silu, untied,
attention_dropout 0, eager attention, train mode; 2 layers and router_aux_loss_coef
0.01 except glm4_* and deepseek_v3* (GLM-4.5, DeepSeek-V3: their own sections below;
no aux loss; DeepSeek-V3 has 4 kv heads, its head_dim is q/k head / v head). gpt_oss*
(gpt-oss: its own section below) has a clamped SwiGLU instead of silu and its expert
weights drawn wider. Mixtral jitter 0. qwen2_moe: shared expert I=24, layer 0 dense
(`mlp_only_layers=[0]`, intermediate 20), q/k/v bias. qwen3_*: layer 0 dense through
`decoder_sparse_step=2` (intermediate 20). Initial weights N(0, 0.2²), norm weights
1 + 0.1·N(0,1) (numpy PCG64, see `init` in the metadata). B=2, S=7; labels = ids with
-100 at (0,0), (0,1), (1,4); `loss_mask` is in labels coordinates (1 iff the label
counts: not -100 and s ≥ 1), {nt} targets each. One AdamW step: lr 1e-2, betas
(0.9, 0.95), eps 1e-8, weight_decay 0.1, every parameter in one group.
Top-k choices are at least {margin} apart in probability (no near-ties; GLM-4.5 and
DeepSeek-V3: in choice score and group score, gpt-oss: in logit, below).

## Loss
- **CE** (`loss/loss_utils.py` `ForCausalLMLoss`, `fixed_cross_entropy`): logits upcast to
  fp32; labels padded on the right with -100 and shifted, so `logits[b,t]` predicts
  `labels[b,t+1]` and the last position of each sequence predicts nothing;
  `F.cross_entropy(ignore_index=-100, reduction="mean")` over the flattened batch =
  sum over all non-ignored targets of the whole batch / their count (not a
  per-sequence mean). Only when `num_items_in_batch` is passed (Trainer gradient
  accumulation) is it sum / num_items_in_batch. *(checked)*
- **Total** (`<Family>ForCausalLM.forward`): `loss = CE + router_aux_loss_coef · aux_loss`,
  only with `labels` and `output_router_logits=True`; `out.aux_loss` is unscaled. *(checked)*
- **Aux** (`load_balancing_loss_func`, one copy per modeling file): the raw gate
  logits (`gate(x)`, not probabilities, so no double softmax in 4.57) of the recorded
  layers are concatenated along rows (N = L_moe·B·S), `p = softmax(logits)` (in the
  logits' dtype), `sel = topk(p, k)`, `f[j,e] = mean_n onehot(sel)[n,j,e]` ([k,E]),
  `P[e] = mean_n p[n,e]`, `aux = E · Σ_j Σ_e f[j,e]·P[e]`: pooled over layers, not a
  mean of per-layer values; = k under uniform routing. Gradient flows through P only
  (the one-hot is constant). *(checked)*
  - Dense layers are not pooled: Qwen2-MoE's dense layers return no router logits and
    `Qwen2MoeModel.forward` skips them (`if output_router_logits and layer_outputs[-1]
    is not None`); Qwen3-MoE and Mixtral record only `…SparseMoeBlock` outputs
    (`_can_record_outputs = OutputRecorder(Qwen3MoeSparseMoeBlock, index=1)`). *(checked:
    the number of router-logit tensors equals the number of MoE layers)*
  - Padding: only through the forward's 2-D `attention_mask`: rows whose mask is 0
    are left out of both means (masked sums / mask sums). Labels = -100 do not
    affect the aux loss. The fixtures pass no attention_mask: all B·S rows count.
  - Qwen2-MoE and OLMoE slice `tokens_per_expert[:, rank:rank+E]` with
    `rank = E·device_index`: a no-op on CPU / cuda:0 (0 on any other device).

## MoE block (`MixtralSparseMoeBlock`, `Qwen2MoeSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`, `OlmoeSparseMoeBlock` `.forward`)
1. `router_logits = gate(x)` (Linear H→E, no bias), x = post_attention_layernorm output.
2. `w = softmax(router_logits, dtype=float32)`; `(w, idx) = topk(w, k)` (descending).
3. Renormalise `w /= Σ_k w`: **Mixtral always** (no flag exists); **Qwen2-MoE,
   Qwen3-MoE, OLMoE only if `norm_topk_prob`** (config default False in all three).
   The flag changes only the combine weights, never the aux loss. *(checked: the block
   output matches the reference with the family's rule and not with it flipped)*
4. `w` cast to the hidden dtype; output starts at zero; for each expert e in
   ascending order, its tokens (`torch.where` over the [k,T] one-hot: slot-major)
   give `Expert_e(x_t) · w[t,j]` (weight applied to the expert's **output**, after
   down_proj), `index_add_` into the output row t.
   Expert: `down(silu(gate(x)) · up(x))` (Mixtral `w2(silu(w1 x) · w3 x)`).
5. Qwen2-MoE then adds the shared expert:
   `y += sigmoid(shared_expert_gate(x)) · shared_expert(x)`, `shared_expert_gate` =
   Linear(H, 1, bias=False), x the same normed input as the router. *(checked)*
- Experts that get no token: Mixtral, Qwen2-MoE and Qwen3-MoE loop over
  `expert_hit` only, so those experts are not in the graph and their `.grad` is
  **None**; OLMoE loops over `range(num_experts)` (empty matmuls), so their `.grad` is
  an **all-zero tensor**. *(checked: `no_grad` metadata, OLMoE zero grads)* gpt-oss's
  experts are fused tensors: an idle expert's slice of them is all zero (below).
- An expert of the **last** layer whose tokens all sit at positions that predict no
  counted target (the last position, or one whose next label is -100) gets an
  all-zero gradient that is not None (the aux loss reaches the router only), so
  AdamW decays it. Listed per fixture as `zero_grad_experts` in the metadata.
  *(checked: exactly these and the OLMoE idle experts have all-zero grads)*
  In an earlier layer the output of position t reaches positions t..S-1 (causal
  attention): with an aux loss and a later MoE layer, that layer's router logits at
  every position, so it always has a gradient; **without an aux loss (GLM-4.5,
  DeepSeek-V3)** an expert whose tokens all sit at positions from which no later
  position predicts a counted target (here: the last position of a sequence) gets an
  all-zero gradient too ({dead_earlier}). *(checked, same list)*
- Qwen2/3 layer i is MoE iff `i ∉ mlp_only_layers and num_experts > 0 and
  (i+1) % decoder_sparse_step == 0` (`…DecoderLayer.__init__`); other layers are a
  dense MLP with `intermediate_size`.

## Norms and attention
- **RMSNorm** (`MixtralRMSNorm` / `Qwen2MoeRMSNorm` / `Qwen3MoeRMSNorm` / `OlmoeRMSNorm`
  `.forward`): `x32 = x.float(); x32 = x32 · rsqrt(mean(x32², -1) + eps);
  return weight · x32.to(input_dtype)` (weight applied after the cast back).
  eps from the config: Mixtral 1e-5, Qwen2/3 1e-6, OLMoE 1e-5.
- **qk-norm, Qwen3** (`Qwen3MoeAttention.forward`): `q_norm`/`k_norm` = RMSNorm(head_dim)
  applied per head after `view(B,S,heads,head_dim)`, **before RoPE**. head_dim =
  `config.head_dim` if present else H/heads (Qwen3MoeConfig 4.57 has no head_dim
  argument; a passed one is kept as an attribute and written to config.json).
- **qk-norm, OLMoE** (`OlmoeAttention.forward`): `q_norm` = RMSNorm(H), `k_norm` =
  RMSNorm(kv_heads·head_dim) over the whole `q_proj`/`k_proj` output, then the
  optional clamp, then the head reshape, then RoPE. head_dim is always H/heads.
- **OLMoE `clip_qkv`**: default None (`OlmoeConfig.__init__`); if set, q (after q_norm),
  k (after k_norm) and v are clamped in place to ±clip_qkv before RoPE.
- Attention: scores `q·kᵀ · head_dim^-0.5`, causal mask added, softmax in fp32, GQA by
  repeating kv heads (`repeat_kv`: kv head h serves query heads h·g … h·g+g-1).
  RoPE `rotate_half` (halves, not interleaved), `inv_freq = 1/θ^(2i/head_dim)`
  (`modeling_rope_utils._compute_default_rope_parameters`), cos/sin in fp32.
  Qwen2-MoE: q/k/v bias (`qkv_bias`), no o bias.
- Embeddings use `padding_idx = pad_token_id` (OLMoE default 1; None for the
  others): that row of the embedding never gets a gradient. The fixtures' ids avoid
  the pad id.
{glm}{ds}{gpt_oss}
## AdamW (torch {torch}: `torch/optim/adamw.py` `AdamW` = `Adam(decoupled_weight_decay=True)`; `torch/optim/adam.py` `_single_tensor_adam`, the CPU path)
For each parameter with a gradient, step t (= 1 here):
```
p ← p · (1 − lr·wd)                        # decoupled decay first, on the parameter
m ← m + (g − m)(1 − β1)                    # exp_avg.lerp_(g, 1−β1)
v ← v·β2 + (1 − β2)·g²
bc1 = 1 − β1^t ; bc2 = 1 − β2^t
p ← p − (lr / bc1) · m / (sqrt(v) / sqrt(bc2) + eps)
```
At t = 1: `p1 = p0(1 − lr·wd) − lr · g / (|g| + eps)` ≈ `p0(1 − lr·wd) − lr·sign(g)`.
*(checked against `after.*` in fp64: max error {adam})*
- `Adam._init_group` takes only `if p.grad is not None`: a parameter whose grad is
  **None** is skipped entirely (no decay, no state, step not counted) → `after.<p>` =
  initial. A zero grad (OLMoE idle experts, unused embedding rows) is not skipped:
  the parameter decays, `p1 = p0·(1 − lr·wd)` exactly. *(checked)*
- Decay applies to every parameter in the group, norms, biases and embeddings included.
- `after.*` amplifies gradient error where |g| is near eps (the fixtures hold grads
  down to ~1e-9): an error δg moves `p1` by about `lr·δg/(|g|+eps)`. Check the
  optimizer on its own (initial weights + `grad.*` → `after.*`), and the end-to-end
  `after.*` with a tolerance that allows for it.
"""


GLM_NOTES = """
## GLM-4.5 (`glm4_moe*`: `Glm4MoeForCausalLM`, `modeling_glm4_moe.py`)

| name | layers | MoE layers | n_group / topk_group | head_dim | rotary dim | q/k/v bias | qk-norm | shared experts (I) | norm_topk_prob | routed_scaling_factor | rope_theta | seed | min margin | idle experts (layer, e) | zero-grad experts |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Both: H=32, 4 heads / 2 kv heads, vocab 64, E = `n_routed_experts` = 8, k = 2, expert
I = `moe_intermediate_size` = 16, dense I = `intermediate_size` = 20, `rms_norm_eps`
1e-5 (the default), pad_token_id None; no `router_aux_loss_coef` (`Glm4MoeConfig` has
none, so it is not passed and not in config.json). `glm4_moe` has 3 layers so that
two MoE layers follow the dense one; `glm4_moe_nogroup` passes `head_dim` = 16
(≠ H/heads = 8). The `e_score_correction_bias` buffers are random like the weights:
{init_std}·N(0,1), drawn after the parameters in `named_buffers()` order (transformers
leaves them 0), so that a wrong use of the bias changes the routing.
- **Layers** (`Glm4MoeDecoderLayer.__init__`): layer i is MoE iff `i >=
  first_k_dense_replace`, else a dense `Glm4MoeMLP` (`mlp.gate_proj/up_proj/down_proj`,
  `intermediate_size`). The RMSNorms are Mixtral's (weight after the cast back).
- **Attention** (`Glm4MoeAttention`): head_dim = `config.head_dim` if set, else H/heads
  (`Glm4MoeConfig` has no head_dim argument: a passed one is kept as an attribute and
  written to config.json; RoPE reads the same). q/k/v_proj have a bias iff
  `attention_bias`, o_proj never. `use_qk_norm`: `self_attn.q_norm`/`k_norm` =
  RMSNorm(head_dim) per head after `view(B,S,heads,head_dim)`, **before RoPE** (as
  Qwen3; absent without the flag). Scores `· head_dim^-0.5`, softmax fp32, GQA as above.
- **Partial RoPE** (`modeling_rope_utils.py` `_compute_default_rope_parameters`,
  `apply_rotary_pos_emb`): rot = `int(head_dim · partial_rotary_factor)`; `inv_freq =
  1/θ^(2i/rot)`, i < rot/2 (**rot** in the exponent, not head_dim); cos/sin have rot
  columns (`cat(freqs, freqs)`); the first rot dims of each q/k head are rotated by
  `rotate_half` **within them** (dim j < rot/2 pairs with j + rot/2), dims rot..head_dim-1
  pass unchanged (`torch.cat([q_embed, q_pass], dim=-1)`).
- **Router** (`Glm4MoeTopkRouter`): `mlp.gate.weight` [E,H] (a Parameter in a plain
  module, not an `nn.Linear`) and `mlp.gate.e_score_correction_bias` [E], a **buffer**:
  persistent (F32 in model.safetensors, loaded by `from_pretrained`), not a parameter (no
  grad, not in AdamW's group, never changed). Metadata `frozen` lists these names;
  `after.<bias>` = its initial value. *(checked)*
  1. `router_logits = F.linear(x.float(), W.float())` (float32 whatever the model dtype),
     x = the post_attention_layernorm output; `scores = sigmoid(router_logits)`.
  2. `get_topk_indices` (under `@torch.no_grad()`: the choice is a constant): choice =
     scores + bias; group score = sum of the **top 2** choice scores of each of `n_group`
     contiguous groups of E/n_group experts; the `topk_group` best groups are kept; the
     other experts' choice scores are set to **0.0** (`masked_fill(..., 0.0)`, not -inf: a
     kept expert whose choice score is negative loses to a masked one); `topk(k,
     sorted=False)` of the masked choice scores (no defined order of the k).
  3. Weights = the chosen experts' **scores** (`scores.gather`: without the bias); if
     `norm_topk_prob`: `/ (sum + 1e-20)`; then `· routed_scaling_factor` (after the
     renormalisation, so normalised weights sum to the factor). The router weight's
     gradient flows through these gathered sigmoid scores (and the renormalisation) only.
     *(checked: the router's weights are, bit for bit, those of `router_logits`)*
- **Block** (`Glm4MoeMoE`): `y = Σ_j w_j · Expert_j(x) + shared_experts(x)`; the shared
  experts are one ungated MLP `mlp.shared_experts.{{gate,up,down}}_proj` of I =
  `moe_intermediate_size · n_shared_experts`, on the same x. Routed experts
  `mlp.experts.<e>.{{gate,up,down}}_proj`; the sum is accumulated in float32
  (`zeros_like(..., dtype=topk_weights.dtype)`, `index_add_` per expert ascending) and cast
  to the hidden dtype. The loop runs over `range(E)` but skips an expert with no token
  (`if token_indices.numel() > 0`): an idle expert's grad is **None** (as Mixtral/Qwen).
{checked}
- **Loss** (`Glm4MoeForCausalLM.forward`): `loss = self.loss_function(...)`, the plain CE
  of above; **no aux loss** and no router logits in any output (`_can_record_outputs`
  has none). `output_router_logits=True` is accepted (swallowed by `**kwargs`) and changes
  nothing, so the fixtures do not pass it. *(checked)* In `fixture.safetensors`:
  `router_aux_loss_coef` "0.0", `aux_loss` 0, `loss` (transformers') = `ce_loss` (the
  script's CE; checked to 1e-6 relative, {loss_bits} in these files),
  `router_logits.<layer>` = the raw logits x·Wᵀ [B·S,E] recomputed from the router's
  input (captured by a hook) as step 1 does. *(checked)*
- **Routing margins**: a seed is used only if, recomputed in float64 from the router's
  input, (a) its choice is transformers', (b) for every token of every MoE layer the gap
  between the topk_group-th and the next group score (where n_group > topk_group) and the
  gap between the k-th and (k+1)-th masked choice score are at least {margin}, (c) in
  every MoE layer the choice without the bias, and (`glm4_moe`) without the group limit,
  differs for some token, and (`glm4_moe`) exactly one routed expert is idle. A masked
  expert (0.0) is then never chosen (it would tie with another masked one), so these
  fixtures cannot tell 0.0 from -inf: `router_group/` (`negative`) does.
"""


def glm_notes(rows):
    """GLM_NOTES with the rows of the GLM-4.5 fixtures ("" if none)."""
    rows = [r for r in rows if r["family"] == "glm4_moe"]
    if not rows:
        return ""
    lines = []
    for r in rows:
        c = r["cfg"]
        hd = r["head_dim"]
        lines.append(
            f"| {r['name']} | {c.num_hidden_layers} | {r['moe_layers']} | {c.n_group} / {c.topk_group} | {hd} | "
            f"{int(hd * c.partial_rotary_factor)} | {'yes' if c.attention_bias else 'no'} | "
            f"{'yes' if c.use_qk_norm else 'no'} | "
            f"{c.n_shared_experts} ({c.n_shared_experts * c.moe_intermediate_size}) | "
            f"{'yes' if c.norm_topk_prob else 'no'} | {c.routed_scaling_factor:g} | {c.rope_theta:g} | {r['seed']} | "
            f"{r['margin']:.2e} | {', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | "
            f"{', '.join(f'({l},{e})' for l, e in r['dead']) or '-'} |")
    which = {}
    for r in rows:
        for w in group_wrong_variants(r["cfg"]):
            which.setdefault(w, []).append(r["name"])
    wrong = [w if len(ns) == len(rows) else f"{w} ({', '.join(ns)})" for w, ns in sorted(which.items())]
    checked = textwrap.fill(
        "*(checked: fp64 reference within 1e-5 of the block output in every MoE layer; and more than 1e-3 away "
        f"from it with each of these wrong blocks: {'; '.join(wrong)})*", 88, initial_indent="  ",
        subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    same = all(r["loss"] == r["ce"] for r in rows)
    return GLM_NOTES.format(rows="\n".join(lines), init_std=INIT_STD, margin=f"{MIN_ROUTING_MARGIN:g}",
                            checked=checked, loss_bits="the same float32" if same else "not the same bits")


DS_NOTES = """
## DeepSeek-V3 (`deepseek_v3*`: `DeepseekV3ForCausalLM`, `modeling_deepseek_v3.py`)

| name | layers | MoE layers | n_group / topk_group | q path | kv_lora_rank | q/k head (nope + rope) | v head | rope_interleave | rope_scaling | rope_theta | softmax scale | shared experts (I) | norm_topk_prob | routed_scaling_factor | rms_norm_eps | seed | min margin | idle experts (layer, e) | zero-grad experts |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Both: H=32, 4 heads and **4 kv heads**, vocab 64, E = `n_routed_experts` = 8, k = 2, expert
I = `moe_intermediate_size` = 16, dense I = `intermediate_size` = 20, pad_token_id None,
no attention bias, no `router_aux_loss_coef` (`DeepseekV3Config` has none; not passed, not
in config.json). The `e_score_correction_bias` buffers are random as GLM-4.5's.
- **Router, MoE block, dense layers, loss, margins**: GLM-4.5's, above, word for word
  (`DeepseekV3TopkRouter`, `DeepseekV3MoE`, `DeepseekV3MLP`, `DeepseekV3DecoderLayer`
  `first_k_dense_replace`, `DeepseekV3ForCausalLM.forward`: the same lines, checked in both
  files): sigmoid scores, choice on scores + bias, group score = sum of the top 2, masked
  experts 0.0, weights = scores (no bias), `/ (sum + 1e-20)` iff `norm_topk_prob`, then
  `· routed_scaling_factor`; shared experts ungated, I = `moe_intermediate_size ·
  n_shared_experts`; an idle expert's grad is None; **no aux loss**, no router logits
  (`_can_record_outputs` has none; `output_router_logits=True` is swallowed) *(checked)*;
  metadata `router_aux_loss_coef` "0.0", `frozen`, `after.<bias>` = initial as there.
  One difference: the bias buffer is `torch.zeros(self.n_routed_experts)`, the default
  dtype (GLM-4.5 names float32): F32 in these files.
{checked_moe}
- **Config** (`DeepseekV3Config.__init__`): `qk_head_dim = qk_nope_head_dim +
  qk_rope_head_dim` and **`head_dim = qk_rope_head_dim`** are set as attributes, and
  `save_pretrained` writes both to config.json; a `head_dim` or `qk_head_dim` key in a
  config.json overrides the attribute (RoPE reads `head_dim` as the number of rotated dims;
  the attention takes `qk_head_dim` for q's head and the scale). `head_dim` is not the
  attention head size.
  `rope_interleave` defaults to **true**, `rms_norm_eps` to 1e-6, `attention_bias` to false.
  A `rope_scaling` "type" is copied to "rope_type"; its `factor`, `beta_fast`, `beta_slow`
  are cast to float (config.json then holds both "type" and "rope_type").
- **num_key_value_heads must equal num_attention_heads**: k and v have a head each from
  `kv_b_proj`, yet `eager_attention_forward` still `repeat_kv`s them by `heads /
  kv_heads`; fewer kv heads give a shape error. The published configs have them equal.
- **MLA** (`DeepseekV3Attention`), x = the input_layernorm output [B,S,H]; heads n:
  1. q = `q_proj(x)` [n·qk_head_dim] when `q_lora_rank` is null, else
     `q_b_proj(q_a_layernorm(q_a_proj(x)))` (`q_a_proj` H → q_lora_rank, `q_b_proj`
     q_lora_rank → n·qk_head_dim); per head **[q_nope (qk_nope_head_dim) | q_rope
     (qk_rope_head_dim)]**.
  2. `kv_a_proj_with_mqa(x)` [kv_lora_rank + qk_rope_head_dim] = **[c | k_rope]**: k_rope is
     one head that every head uses; `kv_b_proj(kv_a_layernorm(c))` [n·(qk_nope_head_dim +
     v_head_dim)], per head **[k_nope | v]**.
  3. RoPE on q_rope and k_rope only; q = [q_nope | RoPE(q_rope)], k = [k_nope | RoPE(k_rope)]
     (nope first).
  4. scores `q·kᵀ · scale`, causal mask, softmax fp32, `@ v` [n·v_head_dim], `o_proj`
     (n·v_head_dim → H).
  - `q_a_layernorm` / `kv_a_layernorm` are RMSNorms (weight after the cast back) with eps
    **1e-6 whatever `rms_norm_eps`** (`DeepseekV3RMSNorm(config.q_lora_rank)`: the default
    eps); the decoder norms take `rms_norm_eps` (`deepseek_v3_noq`: 1e-5). *(checked on the
    modules; too small a difference to show in the outputs)*
  - Bias iff `attention_bias`: `q_a_proj`, `kv_a_proj_with_mqa`, `o_proj`; never `q_proj`,
    `q_b_proj`, `kv_b_proj`.
- **RoPE** (`DeepseekV3RotaryEmbedding`, `modeling_rope_utils.py`): rot = `head_dim` =
  qk_rope_head_dim; `inv_freq = 1/θ^(2i/rot)`, i < rot/2 (rot in the exponent, not
  qk_head_dim); cos/sin = `cat(freqs, freqs)` · attention_factor (1 without YaRN).
  `rope_interleave` true (`apply_rotary_pos_emb_interleave`): each rope slice is first
  permuted to [x0, x2, …, x1, x3, …], then rotated by `rotate_half`: pair **(2i, 2i+1)**
  turns by position·inv_freq[i]; the result stays in the permuted order (q and k alike,
  so the scores are those of the pairs turned in place). false (`apply_rotary_pos_emb`):
  pair **(i, i + rot/2)**.
- **YaRN** (`_compute_yarn_parameters`, rope_scaling type "yarn"): f = `factor`, L =
  `original_max_position_embeddings` (or max_position_embeddings), β_fast (default 32),
  β_slow (default 1); `corr(r) = rot·ln(L / (2π r)) / (2 ln θ)`; low = max(floor(corr(β_fast)),
  0), high = min(ceil(corr(β_slow)), rot − 1) (`truncate` default true; high += 0.001 if
  equal); ramp_i = clamp((i − low)/(high − low), 0, 1) over i < rot/2; e_i = 1 − ramp_i;
  `inv_freq_i = (1/θ^(2i/rot))/f · (1 − e_i) + 1/θ^(2i/rot) · e_i`. attention_factor (on
  cos and sin) = mscale(f, `mscale`) / mscale(f, `mscale_all_dim`) when both are set and
  non-zero, else mscale(f, 1); mscale(f, m) = `0.1·m·ln f + 1` (1 if f ≤ 1). With mscale =
  mscale_all_dim (DeepSeek-V3, Kimi-K2, `deepseek_v3_noq`) it is 1.
  `deepseek_v3_noq` (θ {noq_theta:g}, rot {noq_rot}, f {noq_f:g}, L {noq_L}): low {noq_low}, high {noq_high},
  inv_freq {noq_inv} (plain: {noq_plain}).
- **Softmax scale** (`DeepseekV3Attention.__init__`): `qk_head_dim^-0.5` (the q/k head,
  not v_head_dim), times **mscale(factor, mscale_all_dim)²** when `rope_scaling` has a
  non-zero `mscale_all_dim` (any rope type). `deepseek_v3_noq`: (0.1·ln 4 + 1)² / √12;
  DeepSeek-V3 (f 40): (0.1·ln 40 + 1)² / √192 = {ds_scale:.6g}.
{checked_mla}
"""


def ds_notes(rows):
    """DS_NOTES with the rows of the DeepSeek-V3 fixtures ("" if none)."""
    rows = [r for r in rows if r["family"] == "deepseek_v3"]
    if not rows:
        return ""
    lines = []
    for r in rows:
        c = r["cfg"]
        rs = c.rope_scaling
        lines.append(
            f"| {r['name']} | {c.num_hidden_layers} | {r['moe_layers']} | {c.n_group} / {c.topk_group} | "
            + (f"q_proj | " if c.q_lora_rank is None else f"q_a_proj ({c.q_lora_rank}), q_a_layernorm, q_b_proj | ")
            + f"{c.kv_lora_rank} | {c.qk_head_dim} ({c.qk_nope_head_dim} + {c.qk_rope_head_dim}) | {c.v_head_dim} | "
            f"{'yes' if c.rope_interleave else 'no'} | "
            + ("- | " if rs is None else
               f"yarn: factor {rs['factor']:g}, original {rs['original_max_position_embeddings']}, beta_fast "
               f"{rs['beta_fast']:g}, beta_slow {rs['beta_slow']:g}, mscale {rs['mscale']:g}, mscale_all_dim "
               f"{rs['mscale_all_dim']:g} | ")
            + f"{c.rope_theta:g} | {mla_scale(c):.6g} | "
            f"{c.n_shared_experts} ({c.n_shared_experts * c.moe_intermediate_size}) | "
            f"{'yes' if c.norm_topk_prob else 'no'} | {c.routed_scaling_factor:g} | {c.rms_norm_eps:g} | {r['seed']} | "
            f"{r['margin']:.2e} | {', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | "
            f"{', '.join(f'({l},{e})' for l, e in r['dead']) or '-'} |")

    def wrong_list(variants):
        which = {}
        for r in rows:
            for w in variants(r):
                which.setdefault(w, []).append(r["name"])
        return [w if len(ns) == len(rows) else f"{w} ({', '.join(ns)})" for w, ns in sorted(which.items())]

    def para(text):
        return textwrap.fill(text, 88, initial_indent="  ", subsequent_indent="  ", break_long_words=False,
                             break_on_hyphens=False)

    checked_moe = para("*(checked: fp64 reference within 1e-5 of the block output in every MoE layer; and more than "
                       "1e-3 away from it with each of these wrong blocks: "
                       f"{'; '.join(wrong_list(lambda r: group_wrong_variants(r['cfg'])))})*")
    checked_mla = para("*(checked: transformers' inv_freq and attention_factor are these, its scale this; an fp64 "
                       "reference of every layer's attention output (o_proj's) from the layer's parameters and input "
                       "is within 1e-5 of it, and more than 1e-3 away from it with each of these wrong attentions: "
                       f"{'; '.join(wrong_list(lambda r: r['attn_wrong']))})*")
    noq = next((r["cfg"] for r in rows if r["cfg"].rope_scaling is not None), None)
    need(noq is not None, "no DeepSeek-V3 fixture with YaRN")
    rs, rot = noq.rope_scaling, noq.qk_rope_head_dim
    corr = lambda b: rot * math.log(rs["original_max_position_embeddings"] / (b * 2 * math.pi)) / (  # noqa: E731
        2 * math.log(noq.rope_theta))
    ds_ref = DeepseekV3Config()  # DeepSeek-V3's dims with its published rope_scaling
    ds_ref.rope_scaling = {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return DS_NOTES.format(
        rows="\n".join(lines), checked_moe=checked_moe, checked_mla=checked_mla, noq_theta=noq.rope_theta,
        noq_rot=rot, noq_f=rs["factor"], noq_L=rs["original_max_position_embeddings"],
        noq_low=max(math.floor(corr(rs["beta_fast"])), 0), noq_high=min(math.ceil(corr(rs["beta_slow"])), rot - 1),
        noq_inv=[float(f"{v:.6g}") for v in mla_rope(noq)[0].tolist()],
        noq_plain=[float(f"{v:.6g}") for v in mla_rope(noq, yarn=False)[0].tolist()], ds_scale=mla_scale(ds_ref))


GPT_OSS_NOTES = """
## gpt-oss (`gpt_oss*`: `GptOssForCausalLM`, `modeling_gpt_oss.py`)

| name | layer_types | sliding_window | rope_scaling | rope_theta | RoPE inv_freq (attention factor) | seed | min margin (logit) | idle experts (layer, e) | zero-grad experts | clamped per MoE layer: gate > 7 / up > 7 / up < -7 (gate < -7, unclamped) of n | loss | ce | aux |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

Both: H=32, 4 heads / 2 kv heads, head_dim 8 (passed: `GptOssConfig`'s default is 64),
vocab 64, E = `num_local_experts` = 8, k = 2, expert I = `intermediate_size` = 16, 2
layers, every layer MoE, `rms_norm_eps` 1e-5 (the default), `router_aux_loss_coef` 0.01
(`GptOssConfig`'s default and the published value are 0.9), pad_token_id None. Weights as
above except
{init}
(so that the SwiGLU's clamps are reached); the sinks, attention biases, router bias and
expert biases are drawn like the other weights ({init_std}·N(0,1); transformers'
`_init_weights` would zero the attention and expert biases).
- **Config** (`GptOssConfig.__init__`): `head_dim` as given (null: H/heads); `layer_types`
  default: layer i is `sliding_attention` iff i is even (the published files list them).
  `attention_bias` is set to true before `**kwargs` are applied: it is not an argument, yet a
  config.json `"attention_bias": false` does remove the q/k/v/o biases. There is **no
  `swiglu_limit`** argument and nothing reads one: the published config.json's
  `"swiglu_limit": 7.0` stays an unread attribute; the limit is `GptOssExperts.limit = 7.0`
  and alpha `1.702`, constants of the module. `sliding_window` must be set even when no
  layer slides (`gpt_oss_nosw`): `GptOssModel.forward` builds the sliding mask always and
  `create_sliding_window_causal_mask` raises on a null window. `hidden_act` is not read by
  the experts. *(checked)*
- **RMSNorm** (`GptOssRMSNorm.forward`): `(weight · x32 · rsqrt(mean(x32²) + eps)).to(input_dtype)`:
  the weight multiplies **before** the cast back (Mixtral's after); the same in fp32.
- **Attention** (`GptOssAttention`, `eager_attention_forward`): q/k/v_proj **and o_proj** have
  biases; RoPE on q and k; scores `q·kᵀ · head_dim^-0.5` + mask; then per head h a learnt
  **sink** logit `self_attn.sinks[h]` is appended to every row as one more column, the row
  max subtracted, softmax, the sink column dropped: `p[s,t] = exp(a[s,t]) / (Σ_t' exp(a[s,t'])
  + exp(sinks[h]))` (a row sums to less than 1; the sinks get a gradient); `@ v` (GQA by
  `repeat_kv`), `o_proj`. Masks: causal; on a `sliding_attention` layer (`self_attn.sliding_window`
  = `sliding_window`, None on `full_attention`) key t is visible from query s iff also
  **t > s − sliding_window** (`masking_utils.sliding_window_overlay`; window 3: s−2, s−1, s).
- **RoPE** (`GptOssRotaryEmbedding`, `_apply_rotary_emb`): cos/sin have head_dim/2 columns
  (`emb = freqs`, no `cat`) times the attention factor; each head is cut in halves, `(x1, x2)
  → (x1·cos − x2·sin, x2·cos + x1·sin)`: pair (i, i + head_dim/2) turns by position·inv_freq[i]
  (what `rotate_half` does).
- **YaRN** (`_compute_yarn_parameters`): DeepSeek-V3's above, with two differences in the
  published configs: **`truncate` false**, so the correction range [low, high] is not
  floored / ceiled (only clamped to [0, rot − 1]); no `mscale` keys, so attention_factor =
  0.1·ln(factor) + 1 (1.3466 at the published factor 32), on cos and sin (the scores get its
  square); the softmax scale stays head_dim^-0.5 (no mscale² as DeepSeek's).
  `gpt_oss` (θ {yarn_theta:g}, rot {yarn_rot}, f {yarn_f:g}, L {yarn_L}): low {yarn_low:.4f}, high {yarn_high:.4f}
  (truncated they would be {yarn_tlow}, {yarn_thigh}).
{checked_attn}
- **Router** (`GptOssTopKRouter`): `mlp.router.weight` [E,H] and `mlp.router.bias` [E]
  (Parameters of a plain module). logits = `F.linear(x, W, b)` in the model dtype (no fp32
  upcast), x = the post_attention_layernorm output; experts = `topk(logits, k)` (descending);
  weights = **softmax over the k chosen logits** (= Mixtral's renormalised top-k in exact
  arithmetic); `router_scores` = those weights scattered into zeros [T,E].
- **Experts** (`GptOssExperts.forward`, the training / CPU path): one fused tensor each,
  `mlp.experts.gate_up_proj` [E,H,2I], `gate_up_proj_bias` [E,2I], `down_proj` [E,I,H],
  `down_proj_bias` [E,H], applied as `x @ W` ([in, out], not nn.Linear's [out, in]).
  gate = `gate_up[..., 0::2]`, up = `gate_up[..., 1::2]` (**interleaved** columns);
  `gate = min(gate, 7)` (**no lower clamp**), `up = clamp(up, −7, 7)`;
  `h = (up + 1) · gate · sigmoid(1.702 · gate)`; `out = h @ down_proj[e] + down_proj_bias[e]`;
  `y += w · out` (the bias inside the routing weight), over the experts hit (`expert_hit`),
  `index_add_`.
{checked_moe}
- **Gradients**: every parameter has a gradient (`no_grad` is empty). An idle expert's slice
  [e] of the four expert tensors is all zero (AdamW decays it: `p·(1 − lr·wd)`), and so are
  `mlp.router.weight[e]` and `mlp.router.bias[e]`: the router's gradient reaches only the
  chosen logits (the scores are scattered into a constant `zeros_like`, and the aux loss is
  computed from the scores). A zero-grad expert (tokens that reach no counted target, as
  above) has all-zero expert slices but a router row that is not (the aux loss reaches it).
  Metadata `expert_grad_rule`. *(checked: exactly these slices and rows are all zero)*
- **Loss** (`GptOssForCausalLM.forward`): `loss = CE + router_aux_loss_coef · aux_loss` with
  labels and `output_router_logits` (config default false; the fixtures pass true). But the
  aux loss is **not computed from the router logits**: `_can_record_outputs["router_logits"] =
  OutputRecorder(GptOssTopKRouter, index=0)` records the routers' first output, the
  **router_scores**, and `load_balancing_loss_func` takes those: p = softmax(scores) over all
  E (the E − k zeros included), f = mean one-hot of topk(p, k) (the chosen experts again),
  `aux = E · Σ_j Σ_e f[j,e] · mean_n p[n,e]`, MoE layers pooled. With scores in [0, 1], p is
  close to uniform (p ≤ e / (e + E − 1)), so aux moves little with the routing (k under
  uniform routing; {aux}). `out.router_logits` are these
  scores; `router_logits.<layer>` in fixture.safetensors are the raw logits x·Wᵀ + b
  (recomputed from the router's input, as the router computes them); metadata
  `aux_loss_rule`. *(checked: the routers' scores and choice are, bit for bit, those of the
  logits; the recorded router_logits are the scores; aux is the pooled formula on the scores,
  and more than 1e-3 away from the same formula on the logits)*
- **Routing margins**: a seed is used only if, recomputed in float64 from the router's input,
  (a) its choice is transformers', (b) for every token of every MoE layer the k-th and
  (k+1)-th logit (bias included) differ by at least {margin}, (c) in every MoE layer the
  choice without the router bias differs, and (`gpt_oss`) exactly one expert is idle.
"""


def gpt_oss_notes(rows):
    """GPT_OSS_NOTES with the rows of the gpt-oss fixtures ("" if none)."""
    rows = [r for r in rows if r["family"] == "gpt_oss"]
    if not rows:
        return ""
    lines = []
    for r in rows:
        c = r["cfg"]
        rs = c.rope_scaling
        inv, af = rope_freqs(c.head_dim, c.rope_theta, rs, c.max_position_embeddings)
        clamps = r["moe_checked"][0]
        lines.append(
            f"| {r['name']} | {', '.join(c.layer_types)} | {c.sliding_window} | "
            + ("- | " if rs is None else
               f"yarn: factor {rs['factor']:g}, original {rs['original_max_position_embeddings']}, beta_fast "
               f"{rs['beta_fast']:g}, beta_slow {rs['beta_slow']:g}, truncate {str(rs['truncate']).lower()} | ")
            + f"{c.rope_theta:g} | {[float(f'{v:.6g}') for v in inv.tolist()]} ({af:.6g}) | {r['seed']} | "
            f"{r['margin']:.2e} | {', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | "
            f"{', '.join(f'({l},{e})' for l, e in r['dead']) or '-'} | "
            + "; ".join(f"{li}: {n['gate > limit']} / {n['up > limit']} / {n['up < -limit']} ({n['gate < -limit']}) "
                        f"of {n['elements']}" for li, n in sorted(clamps.items()))
            + f" | {r['loss']:.5f} | {r['ce']:.5f} | {r['aux']:.5f} |")

    def wrong_list(variants):
        which = {}
        for r in rows:
            for w in variants(r):
                which.setdefault(w, []).append(r["name"])
        return [w if len(ns) == len(rows) else f"{w} ({', '.join(ns)})" for w, ns in sorted(which.items())]

    def para(text):
        return textwrap.fill(text, 88, initial_indent="  ", subsequent_indent="  ", break_long_words=False,
                             break_on_hyphens=False)

    checked_moe = para("*(checked: fp64 reference within 1e-5 of the block output in every MoE layer, every clamp "
                       "(gate above, up above and below) reached in each, gate below -7 too; and more than 1e-3 away "
                       "from it with each of these wrong blocks: "
                       f"{'; '.join(wrong_list(lambda r: r['moe_checked'][1]))}. Clamping gate below at -7 as well "
                       "is not among them: gate·sigmoid(1.702·gate) is within 5e-5 of 0 there either way)*")
    checked_attn = para("*(checked: transformers' inv_freq and attention factor are these, its scale and windows "
                        "these; an fp64 reference of every layer's attention output (o_proj's) from the layer's "
                        "parameters and input is within 1e-5 of it, and more than 1e-3 away from it with each of "
                        f"these wrong attentions: {'; '.join(wrong_list(lambda r: r['attn_wrong']))})*")
    yc = next((r["cfg"] for r in rows if r["cfg"].rope_scaling is not None), None)
    need(yc is not None, "no gpt-oss fixture with YaRN")
    rs, rot = yc.rope_scaling, yc.head_dim
    corr = lambda b: rot * math.log(rs["original_max_position_embeddings"] / (b * 2 * math.pi)) / (  # noqa: E731
        2 * math.log(yc.rope_theta))
    init = ", ".join(f"`{k}` N(0, {v:g}²)" for k, v in sorted(GPT_OSS_INIT_STD.items(), reverse=True))
    return GPT_OSS_NOTES.format(
        rows="\n".join(lines), init=init, init_std=INIT_STD, checked_moe=checked_moe, checked_attn=checked_attn,
        yarn_theta=yc.rope_theta, yarn_rot=rot, yarn_f=rs["factor"], yarn_L=rs["original_max_position_embeddings"],
        yarn_low=max(corr(rs["beta_fast"]), 0), yarn_high=min(corr(rs["beta_slow"]), rot - 1),
        yarn_tlow=max(math.floor(corr(rs["beta_fast"])), 0), yarn_thigh=min(math.ceil(corr(rs["beta_slow"])), rot - 1),
        margin=f"{MIN_ROUTING_MARGIN:g}", aux=", ".join(f"`{r['name']}` {r['aux']:.4f}" for r in rows))


def dead_earlier(rows):
    """The fixtures (and layers) whose zero-grad experts sit in a layer before the last, for NOTES."""
    found = [(r["name"], sorted({l for l, _ in r["dead"] if l != r["layers"] - 1})) for r in rows]
    return ", ".join(f"`{n}`: layer {', '.join(map(str, ls))}" for n, ls in found if ls) or "none in these fixtures"


def write_notes(outdir, rows):
    table = "\n".join(
        f"| {r['name']} | {r['family']} | {r['moe_layers']} | {'yes' if r['norm_topk'] else 'no'} | "
        f"{r['head_dim']} | {r['rope_theta']:g} | {r['eps']:g} | {r['seed']} | "
        f"{', '.join(f'({l},{e})' for l, e in r['idle']) or '-'} | {r['no_grad']} | "
        f"{', '.join(f'({l},{e})' for l, e in r['dead']) or '-'} | "
        f"{r['loss']:.5f} | {r['ce']:.5f} | {r['aux']:.5f} |" for r in rows)
    text = NOTES.format(
        tf=transformers.__version__, torch=torch.__version__.split("+")[0], rows=table,
        nt=rows[0]["n_targets"], margin=f"{MIN_ROUTING_MARGIN:g}", adam="< 1e-6", glm=glm_notes(rows),
        ds=ds_notes(rows), gpt_oss=gpt_oss_notes(rows), dead_earlier=dead_earlier(rows))
    with open(os.path.join(outdir, "NOTES.md"), "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------- driver
def generate(outdir):
    os.makedirs(outdir, exist_ok=True)
    rows = [make_fixture(fx, outdir) for fx in FIXTURES]
    write_notes(outdir, rows)
    return rows


def compare(ref_dir, new_dir, names=None, files=("config.json", "model.safetensors", "fixture.safetensors")):
    """The fixtures of ref_dir against new_dir: `files` of each of `names` (default: FIXTURES'),
    byte-identical, or fixture.safetensors within CHECK_RTOL/CHECK_ATOL; NOTES.md identical."""
    ok = True
    names = names if names is not None else [fx["name"] for fx in FIXTURES]
    for n in names:
        for f in files:
            a, b = os.path.join(ref_dir, n, f), os.path.join(new_dir, n, f)
            if not os.path.exists(a):
                print(f"MISSING {n}/{f}")
                ok = False
                continue
            if filecmp.cmp(a, b, shallow=False):
                print(f"identical {n}/{f}")
                continue
            if f != "fixture.safetensors":
                print(f"DIFFERS  {n}/{f}")
                ok = False
                continue
            (ta, ma), (tb, mb) = read_st(a), read_st(b)
            bad = [k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k) and k != "min_routing_margin"]
            if set(ta) != set(tb) or bad:
                print(f"DIFFERS  {n}/{f}: names or metadata {sorted(bad)}")
                ok = False
                continue
            worst = ("", 0.0)
            for k in sorted(ta):
                x, y = ta[k], tb[k]
                if x.dtype != y.dtype or x.shape != y.shape:
                    print(f"DIFFERS  {n}/{f}: {k} dtype/shape")
                    ok = False
                    continue
                if x.dtype.kind == "i":
                    if not np.array_equal(x, y):
                        print(f"DIFFERS  {n}/{f}: {k}")
                        ok = False
                    continue
                if not np.allclose(x, y, rtol=CHECK_RTOL, atol=CHECK_ATOL):
                    print(f"DIFFERS  {n}/{f}: {k} max |diff| {np.abs(x - y).max():.3g}")
                    ok = False
                d = float(np.abs(x.astype(np.float64) - y).max()) if x.size else 0.0
                if d > worst[1]:
                    worst = (k, d)
            print(f"close    {n}/{f} (not byte-identical; largest |diff| {worst[1]:.3g} in {worst[0]})")
    a, b = os.path.join(ref_dir, "NOTES.md"), os.path.join(new_dir, "NOTES.md")
    if os.path.exists(a) and filecmp.cmp(a, b, shallow=False):
        print("identical NOTES.md")
    else:
        print("DIFFERS  NOTES.md")
        ok = False
    return ok


def deterministic_torch():
    """One thread, ATen's baseline kernels (set before torch loaded), deterministic algorithms, fp32."""
    torch.set_num_threads(1)
    need(torch.backends.cpu.get_cpu_capability() == "DEFAULT",
         f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}: torch was imported before make_fixtures")
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    transformers.logging.set_verbosity_error()


def start(doc, default_out, out_name, **packages):
    """A fixture script's start (this one's, make_lora_fixtures', make_qlora_fixtures'): its command
    line (--out, default out_name; --check; --any-version), the installed versions against the
    pinned ones (PINNED, and packages: name=(pinned, installed)), deterministic_torch(). Returns
    the parsed arguments."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=default_out, help=f"fixture directory (default {out_name})")
    ap.add_argument("--check", action="store_true", help="regenerate into a temp dir and compare with --out")
    ap.add_argument("--any-version", action="store_true", help="do not insist on the pinned versions")
    args = ap.parse_args()

    pinned = dict(PINNED, **{p: v[0] for p, v in packages.items()})
    have = dict({"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__},
                **{p: v[1] for p, v in packages.items()})
    if have != pinned and not args.any_version:
        fail(f"versions {have}, pinned {pinned} (tools/requirements-fixtures.txt); --any-version to go on")
    deterministic_torch()
    return args


def write_or_check(args, generate, compare, summary):
    """With --check: generate(tmp) into a temporary directory, compare(args.out, tmp), exit 0 if
    they agree, else 1. Otherwise generate(args.out) and print summary(row) of each fixture."""
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            ok = compare(args.out, tmp)
        print("check: OK" if ok else "check: FAILED")
        sys.exit(0 if ok else 1)

    rows = generate(args.out)
    for r in rows:
        print(summary(r))
    print(f"facts: see {os.path.join(args.out, 'NOTES.md')}")


def summary(r):
    """A fixture's line on the console."""
    return (f"{r['name']:18s} {r['family']:10s} seed {r['seed']} params {r['n_params']} MoE layers "
            f"{r['moe_layers']} loss {r['loss']:.6f} ce {r['ce']:.6f} aux {r['aux']:.6f} "
            f"(per layer {', '.join(f'{a:.4f}' for a in r['aux_per_layer'])}) idle {r['idle']} "
            f"no_grad {r['no_grad']} margin {r['margin']:.2e} adam err {r['adam_err']:.1e}"
            + (f" attention err {r['attn_err']:.1e} (wrong variants >= {min(r['attn_wrong'].values()):.2e})"
               if r["attn_err"] is not None else ""))


def main():
    args = start(__doc__, DEFAULT_OUT, "tests/fixtures")
    check_sources()
    write_or_check(args, generate, compare, summary)


if __name__ == "__main__":
    main()
