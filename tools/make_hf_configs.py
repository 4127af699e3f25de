#!/usr/bin/env python3
"""Writes the HF config.json fixtures of tests/hf_config/data from real transformers.

Run it in a venv that has transformers 4.57 (torch is not needed; this script
installs nothing itself):

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install 'transformers==4.57.*'
    /tmp/hfvenv/bin/python tools/make_hf_configs.py            # rewrite the fixtures
    /tmp/hfvenv/bin/python tools/make_hf_configs.py --check    # only compare

For each family it writes
  <family>_default.json  XConfig().to_dict(): every key with its transformers default
                         (architectures null, so the loader must use model_type);
  <family>_tiny.json     a tiny model in the layout save_pretrained writes
                         (E=8, k=2, kv_heads < heads, a Qwen dense
                         layer through mlp_only_layers / decoder_sparse_step=2,
                         norm_topk_prob true, non-default rope_theta / eps / aux coef;
                         GLM-4.5: a first dense layer, head_dim != hidden / heads,
                         attention bias, qk-norm, two expert groups, two shared
                         experts, routed_scaling_factor 2.5; DeepSeek-V3: the same
                         MoE under MLA, q/k head != v head, RoPE in halves, YaRN;
                         gpt-oss: sinks, sliding_window with sliding layers that do
                         not alternate, head_dim != hidden / heads, YaRN with
                         truncate false and every term off its default);
<model>_hub.json       shaped like published checkpoints' config.json (HUB below;
                         Kimi-K2's model_type kimi_k2 is not one transformers knows:
                         that file is read as the DeepseekV3Config its architectures
                         and auto_map name; gpt-oss's carry their mxfp4
                         quantization_config and keys transformers does not read,
                         swiglu_limit among them);
and expected.json: what transformers resolves from each file - the config
attributes as the modeling code reads them (num_key_value_heads, head_dim by each
family's own rule, the dims RoPE rotates, which layers are MoE, the router) in
moefit's spec terms.

How configs written by moefit (mf_hf_config_write) are checked against
transformers: the test `//tests/hf_config:hf_config_test` compares the bytes that
mf_hf_config_write produces for each <family>_tiny.json spec against the checked-in
<family>_written.json (regenerate them with
`MF_HF_GOLDEN_DIR=$PWD/tests/hf_config/data bazel run //tests/hf_config:hf_config_test
-- --gtest_filter='*Golden*'`). This script then loads every <family>_written.json
through `AutoConfig.from_pretrained(<dir holding it as config.json>)` and
requires that transformers resolves it to exactly the values of the matching tiny
config (and to the torch_dtype written), that every key written is one
transformers reads (declared by the config class or read by the family's
modeling code: a misspelt key would be ignored in silence), and that each keeps
the value written. So: C writes -> checked-in golden -> transformers reads it
back -> same model as the fixture moefit loaded. A family in WRITTEN_PENDING
(none now) may lack its golden: reported as missing, not counted as a problem.

--check changes nothing: it regenerates every fixture with transformers and
compares it with the checked-in file, then checks the <family>_written.json
golden files as above; exit status 0 only when all agree. The test
//tests/hf_config:transformers_check runs it (skipped, saying so, without a
python that has transformers: tools/test passes MF_HF_PYTHON, by default
~/.cache/moefit/hfvenv/bin/python, which .ci/run makes with
    python3 -m venv ~/.cache/moefit/hfvenv
    ~/.cache/moefit/hfvenv/bin/pip install transformers==4.57.6
the version of tools/requirements-fixtures.txt).

Parameter counts are not recorded: computing them from transformers needs torch
(instantiating the models). tests/hf_config checks mf_model_spec_param_count
against the published figures instead; for GLM-4.5 and GLM-4.5-Air, whose
published totals count a multi-token-prediction layer that transformers does not
build, against counts taken once with torch on the meta device (the command is
in the test, ModelSpecParamCount.Glm45AsTransformersBuildsIt).
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: nothing here needs the hub
try:
    import transformers
    from transformers import (AutoConfig, DeepseekV3Config, Glm4MoeConfig, GptOssConfig, MixtralConfig,
                              OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
except ImportError as e:
    sys.exit("tools/make_hf_configs.py needs transformers 4.57 (see its docstring for a venv): %s" % e)

PINNED = "4.57"
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "hf_config", "data")

FAMILIES = {
    "mixtral": (MixtralConfig, "MixtralForCausalLM"),
    "qwen2_moe": (Qwen2MoeConfig, "Qwen2MoeForCausalLM"),
    "qwen3_moe": (Qwen3MoeConfig, "Qwen3MoeForCausalLM"),
    "olmoe": (OlmoeConfig, "OlmoeForCausalLM"),
    "glm4_moe": (Glm4MoeConfig, "Glm4MoeForCausalLM"),
    "deepseek_v3": (DeepseekV3Config, "DeepseekV3ForCausalLM"),
    "gpt_oss": (GptOssConfig, "GptOssForCausalLM"),
}

# Families whose <family>_written.json golden the C test does not write yet: a
# missing one is reported ("missing ... (run the C test's golden update)") but not
# counted as a problem; once the file exists it is checked like the others.
# None now (gpt_oss's golden exists since mf_hf_config_write knows it).
WRITTEN_PENDING = set()

TINY = {
    "mixtral": dict(
        vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-6,
        router_aux_loss_coef=0.02, router_jitter_noise=0.0, tie_word_embeddings=False),
    "qwen2_moe": dict(
        vocab_size=99, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=36, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
        mlp_only_layers=[1], norm_topk_prob=True, qkv_bias=True, max_position_embeddings=512,
        rope_theta=1000000.0, rms_norm_eps=1e-6, router_aux_loss_coef=0.001,
        tie_word_embeddings=False),
    "qwen3_moe": dict(
        vocab_size=99, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[],
        norm_topk_prob=True, max_position_embeddings=512, rope_theta=1000000.0,
        rms_norm_eps=1e-6, router_aux_loss_coef=0.001, tie_word_embeddings=False),
    "olmoe": dict(
        vocab_size=99, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, clip_qkv=8.0, max_position_embeddings=512, rms_norm_eps=1e-5,
        router_aux_loss_coef=0.01, eos_token_id=2, pad_token_id=1, tie_word_embeddings=True),
    # head_dim 16 (hidden / heads is 8), RoPE on int(16 * 0.5) = 8 dims of it;
    # layer 0 dense, layers 1-2 MoE; top-2 among the 4 experts of topk_group 1
    # of n_group 2 groups; a shared MLP of 2 * 16.
    "glm4_moe": dict(
        vocab_size=99, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        partial_rotary_factor=0.5, first_k_dense_replace=1, attention_bias=True, use_qk_norm=True,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=512,
        rope_theta=500000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    # MLA: q through q_a_proj (q_lora_rank 24) -> q_b_proj, kv_lora_rank 16, q/k head
    # 8 + 4 = 12 != v head 6, RoPE in halves (rope_interleave false, the default is
    # true); YaRN with every term off its default (so a swapped key shows); layer 0
    # dense, layers 1-2 MoE; top-2 among the 4 experts of topk_group 1 of n_group 2
    # groups; a shared MLP of 2 * 16; kv heads = heads (as MLA needs).
    "deepseek_v3": dict(
        vocab_size=99, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, rope_interleave=False,
        first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        n_shared_experts=2, routed_scaling_factor=2.5, norm_topk_prob=True,
        max_position_embeddings=512, rope_theta=50000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                      "beta_fast": 24.0, "beta_slow": 2.0, "mscale": 0.8, "mscale_all_dim": 0.6}),
    # Sinks, q/k/v/o biases, router and expert biases (all fixed by the family);
    # head_dim 16 (hidden / heads is 8); window 4 on layers 1 and 2 only (not the
    # default alternation, which slides the even layers); YaRN with truncate false and
    # factor, original context and betas off the published 32 / 4096 / 32 / 1.
    "gpt_oss": dict(
        vocab_size=99, hidden_size=32, intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=4,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=512, rope_theta=50000.0, rms_norm_eps=1e-6, router_aux_loss_coef=0.05,
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                      "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False}),
}

# The keys zai-org/GLM-4.5 and zai-org/GLM-4.5-Air share in their config.json:
# head_dim 128 (hidden / heads is 42 or 53), num_nextn_predict_layers (the MTP
# layer, which transformers does not build), a list of eos ids.
GLM45_COMMON = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "hidden_act": "silu",
    "head_dim": 128, "partial_rotary_factor": 0.5, "initializer_range": 0.02,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "norm_topk_prob": True,
    "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.54.0", "use_cache": True,
    "vocab_size": 151552,
}

# The keys DeepSeek-V3's remote code (configuration_deepseek.py) wrote, which the
# MLA checkpoints below share: auto_map to that code, the aux loss weight and
# sequence-wise flag of DeepSeek's training (transformers' model has no aux loss),
# moe_layer_freq (1: transformers does not read it), scoring_func / topk_method
# (sigmoid / noaux_tc: transformers' only router), ep_size, pretraining_tp.
DEEPSEEK_REMOTE = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "hidden_act": "silu", "initializer_range": 0.02, "moe_layer_freq": 1,
    "norm_topk_prob": True, "pretraining_tp": 1, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
}
# Block-FP8 weights (e4m3, 128x128 scales) as DeepSeek-V3 and Kimi-K2 ship them.
FP8_BLOCK = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
             "weight_block_size": [128, 128]}
# moonshotai/Moonlight-16B-A3B(-Instruct): q_proj (no q_lora_rank), no rope_scaling
# key, rms_norm_eps 1e-5, 2 shared experts, no group limit, BF16.
MOONLIGHT = dict(DEEPSEEK_REMOTE, **{
    "bos_token_id": 163584, "ep_size": 1, "first_k_dense_replace": 1, "hidden_size": 2048,
    "intermediate_size": 11264, "kv_lora_rank": 512, "max_position_embeddings": 8192,
    "model_type": "deepseek_v3", "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
    "num_key_value_heads": 16, "num_nextn_predict_layers": 0, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_theta": 50000.0, "routed_scaling_factor": 2.446,
    "topk_group": 1, "transformers_version": "4.46.3", "v_head_dim": 128, "vocab_size": 163840})

# The keys openai/gpt-oss-20b and openai/gpt-oss-120b share in their config.json
# (https://huggingface.co/openai/gpt-oss-{20b,120b}/raw/main/config.json): the
# experts MXFP4 (quant_method mxfp4; attention, router, embeddings and lm_head left
# in BF16), YaRN factor 32 over 4096 with truncate false, window 128 on the even
# layers, and keys transformers does not read (experts_per_token,
# initial_context_length, swiglu_limit: GptOssExperts' limit is a constant 7).
# No torch_dtype key (the unquantized tensors are BF16).
GPT_OSS_COMMON = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_key_value_heads": 8, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"],
                            "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


def gpt_oss_hub(layers, experts):
    """GPT_OSS_COMMON with the layer and expert counts of one checkpoint (layer_types: sliding, full, ...)."""
    return dict(GPT_OSS_COMMON, num_hidden_layers=layers, num_local_experts=experts,
                layer_types=["sliding_attention", "full_attention"] * (layers // 2))


# Configs shaped like the published checkpoints' config.json (the keys those
# files carry, with the published dims), to exercise what real files hold:
# ints where floats are meant, Qwen1.5's sliding_window with use_sliding_window
# false, Qwen3's and GLM-4.5's head_dim != hidden / heads, old
# transformers_version strings.
HUB = {
    "mixtral_8x7b_hub.json": ("mixtral", {
        "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
        "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000}),
    "qwen1_5_moe_a2_7b_hub.json": ("qwen2_moe", {
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
        "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60,
        "norm_topk_prob": False, "output_router_logits": False, "router_aux_loss_coef": 0.001}),
    "qwen3_30b_a3b_hub.json": ("qwen3_moe", {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
        "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
        "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
        "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}),
    "olmoe_1b_7b_hub.json": ("olmoe", {
        "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
        "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
        "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
        "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": True,
        "vocab_size": 50304}),
    "glm4_5_air_hub.json": ("glm4_moe", dict(GLM45_COMMON, **{
        "first_k_dense_replace": 1, "hidden_size": 4096, "intermediate_size": 10944,
        "moe_intermediate_size": 1408, "n_routed_experts": 128, "num_hidden_layers": 46,
        "routed_scaling_factor": 1.0, "use_qk_norm": False})),
    "glm4_5_hub.json": ("glm4_moe", dict(GLM45_COMMON, **{
        "first_k_dense_replace": 3, "hidden_size": 5120, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "n_routed_experts": 160, "num_hidden_layers": 92,
        "routed_scaling_factor": 2.5, "use_qk_norm": True})),
    # deepseek-ai/DeepSeek-V3 (671B): q_lora_rank 1536, YaRN factor 40 (ints where
    # floats are meant: transformers casts factor and the betas), 8 groups of 32
    # experts, 4 kept, 3 dense layers, one MTP layer (num_nextn_predict_layers: its
    # weights are model.layers.61.*, which transformers does not build), FP8 blocks.
    "deepseek_v3_hub.json": ("deepseek_v3", dict(DEEPSEEK_REMOTE, **{
        "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_size": 7168,
        "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "model_type": "deepseek_v3", "moe_intermediate_size": 2048, "n_group": 8, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "quantization_config": FP8_BLOCK, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "topk_group": 4, "transformers_version": "4.33.1",
        "v_head_dim": 128, "vocab_size": 129280})),
    "moonlight_16b_a3b_hub.json": ("deepseek_v3", dict(MOONLIGHT, eos_token_id=163585)),
    "moonlight_16b_a3b_instruct_hub.json": ("deepseek_v3", dict(MOONLIGHT, eos_token_id=163586)),
    # moonshotai/Kimi-K2-Instruct: DeepSeek-V3's shape with 384 experts, 64 heads, no
    # group limit, one dense layer, YaRN factor 32 with beta_fast = beta_slow = 1, and
    # model_type "kimi_k2", which transformers does not know (AutoConfig refuses the
    # file; its architectures and auto_map name DeepseekV3): read as DeepseekV3Config.
    "kimi_k2_hub.json": ("deepseek_v3", dict(DEEPSEEK_REMOTE, **{
        "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_size": 7168,
        "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 131072,
        "model_type": "kimi_k2", "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 384,
        "n_shared_experts": 1, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "quantization_config": FP8_BLOCK, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_group": 1, "transformers_version": "4.48.3",
        "v_head_dim": 128, "vocab_size": 163840})),
    # openai/gpt-oss-20b: 24 layers, 32 experts; openai/gpt-oss-120b: 36 layers, 128 experts.
    "gpt_oss_20b_hub.json": ("gpt_oss", gpt_oss_hub(24, 32)),
    "gpt_oss_120b_hub.json": ("gpt_oss", gpt_oss_hub(36, 128)),
}

# The lines of transformers' modeling code that the rules below copy; checked to
# be present so a version with different rules fails here instead of silently.
MODELING_RULES = {
    "mixtral": [
        'self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads',
    ],
    "qwen2_moe": [
        'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
        "if (layer_idx not in config.mlp_only_layers) and (",
        "config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0",
        "bias=self.config.qkv_bias",
    ],
    "qwen3_moe": [
        'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
        "if (layer_idx not in config.mlp_only_layers) and (",
        "config.num_experts > 0 and (layer_idx + 1) % config.decoder_sparse_step == 0",
        "self.q_norm = Qwen3MoeRMSNorm(self.head_dim",
    ],
    "olmoe": [
        "self.head_dim = self.hidden_size // self.num_heads",
        "self.q_norm = OlmoeRMSNorm(self.hidden_size",
        "if self.config.clip_qkv is not None:",
    ],
    "glm4_moe": [
        'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
        "if layer_idx >= config.first_k_dense_replace:",
        "rotary_dim = cos.shape[-1]",
        "config.hidden_size, config.num_attention_heads * self.head_dim, bias=config.attention_bias",
        "self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)",
        "if self.use_qk_norm:",
        "self.q_norm = Glm4MoeRMSNorm(self.head_dim",
        "intermediate_size=config.moe_intermediate_size * config.n_shared_experts",
        'self.register_buffer("e_score_correction_bias"',
        "scores = router_logits.sigmoid()",
        "topk_weights = topk_weights * self.routed_scaling_factor",
    ],
    "deepseek_v3": [
        "if layer_idx >= config.first_k_dense_replace:",
        "self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.qk_head_dim, bias=False)",
        "self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=config.attention_bias)",
        "self.kv_lora_rank + self.qk_rope_head_dim,",
        "self.num_heads * (self.qk_nope_head_dim + self.v_head_dim),",
        "self.scaling = self.qk_head_dim ** (-0.5)",
        'mscale_all_dim = self.config.rope_scaling.get("mscale_all_dim", 0)',
        "self.scaling = self.scaling * mscale * mscale",
        "if self.config.rope_interleave:",
        "self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads",
        "intermediate_size=config.moe_intermediate_size * config.n_shared_experts",
        'self.register_buffer("e_score_correction_bias"',
        "scores = router_logits.sigmoid()",
        "topk_weights = topk_weights * self.routed_scaling_factor",
    ],
    "gpt_oss": [
        'self.head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
        "config.num_attention_heads * self.head_dim, config.hidden_size, bias=config.attention_bias",
        'self.sliding_window = config.sliding_window if config.layer_types[layer_idx] == "sliding_attention" else None',
        "self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))",
        "self.mlp = GptOssMLP(config)",
        '"full_attention": create_causal_mask(**mask_kwargs),',
        '"sliding_attention": create_sliding_window_causal_mask(**mask_kwargs),',
        "self.bias = nn.Parameter(torch.empty(self.num_experts))",
        "router_logits = F.linear(hidden_states, self.weight, self.bias)",
        "router_top_value = torch.nn.functional.softmax(router_top_value, dim=1, dtype=router_top_value.dtype)",
        "self.gate_up_proj_bias = nn.Parameter(torch.empty(self.num_experts, 2 * self.expert_dim))",
        "self.down_proj_bias = nn.Parameter(torch.empty(self.num_experts, self.hidden_size))",
        "self.alpha = 1.702",
        "self.limit = 7.0",
        "gate = gate.clamp(min=None, max=self.limit)",
        "up = up.clamp(min=-self.limit, max=self.limit)",
        "gated_output = (up + 1) * glu",
        "first_half, second_half = torch.chunk(x, 2, dim=-1)",
        "loss += self.router_aux_loss_coef * aux_loss.to(loss.device)",
    ],
}

# configuration_<family>.py lines the rules below copy: DeepseekV3Config sets
# head_dim to qk_rope_head_dim (what RoPE reads: rope_dim), qk_head_dim to the q/k
# head (the head_dim of the spec), and takes a rope_scaling "type" as its rope_type.
CONFIG_RULES = {
    "deepseek_v3": [
        "self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim",
        "self.head_dim = qk_rope_head_dim",
        'self.rope_scaling["rope_type"] = self.rope_scaling["type"]',
    ],
    # gpt_oss: attention_bias is set True before **kwargs (a config.json key still
    # overrides it); layer_types default to sliding on the even layers; no swiglu_limit.
    "gpt_oss": [
        "self.head_dim = head_dim if head_dim is not None else self.hidden_size // self.num_attention_heads",
        "self.attention_bias = True",
        '"sliding_attention" if bool((i + 1) % 2) else "full_attention" for i in range(self.num_hidden_layers)',
    ],
}

# The lines of modeling_rope_utils.py (the default RoPE of every family) that
# rope_dim copies: the dims of each head RoPE rotates. cos has 2 * ceil(dim / 2)
# of them, which apply_rotary_pos_emb rotates (glm4_moe: rotary_dim =
# cos.shape[-1]; the others rotate the whole head, dim = head_dim).
ROPE_RULES = [
    'partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)',
    'head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads',
    "dim = int(head_dim * partial_rotary_factor)",
]

# The lines of _compute_yarn_parameters that the yarn_* spec terms copy: their
# defaults (the betas 32 and 1 when missing or 0, the original context
# max_position_embeddings, truncate true: the correction range floored / ceiled)
# and that mscale and mscale_all_dim act only together (else the attention factor
# is mscale(factor)).
YARN_RULES = [
    'head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)',
    'config.rope_scaling.get("original_max_position_embeddings") or config.max_position_embeddings',
    "if mscale and mscale_all_dim:",
    'beta_fast = config.rope_scaling.get("beta_fast") or 32',
    'beta_slow = config.rope_scaling.get("beta_slow") or 1',
    'truncate = config.rope_scaling.get("truncate", True)',
    "if truncate:",
    "attention_factor = get_mscale(factor)",
]


def modeling_source(fam):
    path = os.path.join(os.path.dirname(transformers.__file__), "models", fam, "modeling_%s.py" % fam)
    with open(path) as f:
        return path, f.read()


def config_source(fam):
    path = os.path.join(os.path.dirname(transformers.__file__), "models", fam, "configuration_%s.py" % fam)
    with open(path) as f:
        return path, f.read()


def rope_utils_source():
    path = os.path.join(os.path.dirname(transformers.__file__), "modeling_rope_utils.py")
    with open(path) as f:
        return path, f.read()


def check_modeling_rules():
    sources = [(modeling_source(fam), needles) for fam, needles in MODELING_RULES.items()]
    sources += [(config_source(fam), needles) for fam, needles in CONFIG_RULES.items()]
    sources.append((rope_utils_source(), ROPE_RULES + YARN_RULES))
    for (path, src), needles in sources:
        for n in needles:
            if n not in src:
                sys.exit("transformers %s changed %s: missing %r" % (transformers.__version__, path, n))


def rope_dim(cfg):
    """int(head_dim * partial_rotary_factor), head_dim by RoPE's own rule (ROPE_RULES)."""
    partial = getattr(cfg, "partial_rotary_factor", 1.0)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return int(head_dim * partial)


def resolve(fam, cfg):
    """The config as the family's modeling code reads it, in moefit spec terms."""
    H, heads = cfg.hidden_size, cfg.num_attention_heads
    if fam == "mixtral":
        head_dim = getattr(cfg, "head_dim", None) or H // heads
    elif fam == "olmoe":
        head_dim = H // heads
    elif fam == "deepseek_v3":  # the q/k head (config.head_dim is qk_rope_head_dim: RoPE's)
        head_dim = cfg.qk_head_dim
    else:
        head_dim = getattr(cfg, "head_dim", H // heads)
    L = cfg.num_hidden_layers
    if fam in ("qwen2_moe", "qwen3_moe"):
        moe = [l for l in range(L)
               if l not in cfg.mlp_only_layers and cfg.num_experts > 0
               and (l + 1) % cfg.decoder_sparse_step == 0]
    elif fam in ("glm4_moe", "deepseek_v3"):
        moe = [l for l in range(L) if l >= cfg.first_k_dense_replace]
    else:
        moe = list(range(L))
    e = {
        "family": fam,
        "hidden": H,
        "layers": L,
        "heads": heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "vocab": cfg.vocab_size,
        "max_seq": cfg.max_position_embeddings,
        "rope_theta": float(cfg.rope_theta),
        "norm_eps": float(cfg.rms_norm_eps),
        # glm4_moe, deepseek_v3: the ForCausalLM's loss has no aux term (nor the config
        # the key; DeepSeek's aux_loss_alpha is its remote code's, unread)
        "router_aux_loss_coef": 0.0 if fam in ("glm4_moe", "deepseek_v3") else float(cfg.router_aux_loss_coef),
        "top_k": cfg.num_experts_per_tok,
        "tie_embeddings": bool(cfg.tie_word_embeddings),
        "moe_layers": moe,
        "router_jitter": 0.0,
        "clip_qkv": 0.0,
        "qkv_bias": False,
        "shared_ffn": 0,
        "dense_ffn": 0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "qk_norm": {"mixtral": "none", "qwen2_moe": "none", "qwen3_moe": "per_head", "olmoe": "full",
                    "glm4_moe": "none", "deepseek_v3": "none", "gpt_oss": "none"}[fam],
        "partial_rotary": float(getattr(cfg, "partial_rotary_factor", 1.0)),
        "rope_dim": rope_dim(cfg),
        # the router: softmax top-k, or (glm4_moe, deepseek_v3) sigmoid scores,
        # group-limited top-k on scores + e_score_correction_bias, weights scaled by
        # routed_scaling_factor, or (gpt_oss) "topk_softmax": top-k of the logits (router
        # bias included), weights a softmax over those k, and the aux loss computed from
        # the router scores (those weights scattered into zeros [T,E]), not the logits
        "router": "softmax",
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling": 1.0,
        "first_dense": 0,
        # multi-head latent attention (deepseek_v3; 0 / false elsewhere: kv_lora_rank 0
        # is no MLA): q_lora_rank 0 = q_proj, else q_a_proj -> q_a_layernorm -> q_b_proj;
        # kv_a_proj_with_mqa -> [kv_lora_rank | qk_rope_head_dim]; per head q/k =
        # [qk_nope_head_dim | qk_rope_head_dim] (head_dim, the sum), v = v_head_dim;
        # rope_interleave: RoPE on pairs (2i, 2i+1) instead of (i, i + rope_dim/2)
        "q_lora_rank": 0,
        "kv_lora_rank": 0,
        "qk_nope_head_dim": 0,
        "qk_rope_head_dim": 0,
        "v_head_dim": 0,
        "rope_interleave": False,
        # rope_scaling yarn as transformers reads it (_compute_yarn_parameters, and the
        # softmax scale of DeepseekV3Attention): factor 1 and the rest 0 without it (yarn
        # with factor 1 is plain RoPE); with it the betas default to 32 / 1, the original
        # context to max_seq, and a missing mscale / mscale_all_dim is 0 (unset)
        "yarn_factor": 1.0,
        "yarn_original_max": 0,
        "yarn_beta_fast": 0.0,
        "yarn_beta_slow": 0.0,
        "yarn_mscale": 0.0,
        "yarn_mscale_all_dim": 0.0,
        # yarn: rope_scaling truncate (transformers' default true: the correction range
        # floored / ceiled; gpt-oss publishes false)
        "yarn_truncate": True,
        # gpt_oss (off / 0 / [] elsewhere): attn_sinks, a learnt per-head logit in each
        # softmax row (self_attn.sinks); sliding_window and the layers it applies to
        # (sliding_layers: layer_types "sliding_attention"; key t visible from query s
        # iff t > s - sliding_window; transformers wants the window set even when no
        # layer slides); o_bias, o_proj's bias (qkv_bias: q/k/v's); router_bias
        # (mlp.router.bias); expert_bias (gate_up_proj_bias, down_proj_bias);
        # swiglu_limit / swiglu_alpha: the expert activation (up + 1) * g * sigmoid(alpha * g)
        # with g = min(gate, limit), up clamped to [-limit, limit] (0 / 0: silu(gate) * up)
        "attn_sinks": False,
        "sliding_window": 0,
        "sliding_layers": [],
        "o_bias": False,
        "router_bias": False,
        "expert_bias": False,
        "swiglu_limit": 0.0,
        "swiglu_alpha": 0.0,
    }
    if fam == "mixtral":
        e.update(experts=cfg.num_local_experts, expert_ffn=cfg.intermediate_size,
                 router_jitter=float(cfg.router_jitter_noise), norm_topk_prob=True)
    elif fam in ("qwen2_moe", "qwen3_moe"):
        e.update(experts=cfg.num_experts, expert_ffn=cfg.moe_intermediate_size,
                 dense_ffn=cfg.intermediate_size, decoder_sparse_step=cfg.decoder_sparse_step,
                 mlp_only_layers=list(cfg.mlp_only_layers), norm_topk_prob=bool(cfg.norm_topk_prob))
        if fam == "qwen2_moe":
            e.update(shared_ffn=cfg.shared_expert_intermediate_size, qkv_bias=bool(cfg.qkv_bias))
    elif fam == "glm4_moe":
        e.update(experts=cfg.n_routed_experts, expert_ffn=cfg.moe_intermediate_size,
                 dense_ffn=cfg.intermediate_size,
                 shared_ffn=cfg.moe_intermediate_size * cfg.n_shared_experts,
                 norm_topk_prob=bool(cfg.norm_topk_prob), qkv_bias=bool(cfg.attention_bias),
                 qk_norm="per_head" if cfg.use_qk_norm else "none", router="sigmoid_group",
                 n_group=cfg.n_group, topk_group=cfg.topk_group,
                 routed_scaling=float(cfg.routed_scaling_factor),
                 first_dense=cfg.first_k_dense_replace)
    elif fam == "deepseek_v3":
        e.update(experts=cfg.n_routed_experts, expert_ffn=cfg.moe_intermediate_size,
                 dense_ffn=cfg.intermediate_size,
                 shared_ffn=cfg.moe_intermediate_size * cfg.n_shared_experts,
                 norm_topk_prob=bool(cfg.norm_topk_prob), router="sigmoid_group",
                 n_group=cfg.n_group, topk_group=cfg.topk_group,
                 routed_scaling=float(cfg.routed_scaling_factor),
                 first_dense=cfg.first_k_dense_replace, q_lora_rank=cfg.q_lora_rank or 0,
                 kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                 qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                 rope_interleave=bool(cfg.rope_interleave))
        # MLA's k and v have a head each (kv_b_proj); fewer kv heads fail in repeat_kv
        assert cfg.num_key_value_heads == heads
    elif fam == "gpt_oss":
        # GptOssExperts' alpha and limit are constants (MODELING_RULES): a config's
        # swiglu_limit is not read. attention_bias: q/k/v and o alike.
        assert all(t in ("full_attention", "sliding_attention") for t in cfg.layer_types), cfg.layer_types
        assert cfg.sliding_window is not None  # create_sliding_window_causal_mask raises
        e.update(experts=cfg.num_local_experts, expert_ffn=cfg.intermediate_size, norm_topk_prob=True,
                 router="topk_softmax", qkv_bias=bool(cfg.attention_bias), o_bias=bool(cfg.attention_bias),
                 attn_sinks=True, sliding_window=cfg.sliding_window,
                 sliding_layers=[l for l, t in enumerate(cfg.layer_types) if t == "sliding_attention"],
                 router_bias=True, expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702)
    else:
        e.update(experts=cfg.num_experts, expert_ffn=cfg.intermediate_size,
                 norm_topk_prob=bool(cfg.norm_topk_prob),
                 clip_qkv=float(cfg.clip_qkv) if cfg.clip_qkv is not None else 0.0)
    rs = getattr(cfg, "rope_scaling", None)
    if fam in ("deepseek_v3", "gpt_oss") and rs is not None:
        assert rs["rope_type"] == "yarn" and "attention_factor" not in rs, rs
        e.update(yarn_factor=float(rs["factor"]),
                 yarn_original_max=rs.get("original_max_position_embeddings") or cfg.max_position_embeddings,
                 yarn_beta_fast=float(rs.get("beta_fast") or 32), yarn_beta_slow=float(rs.get("beta_slow") or 1),
                 yarn_mscale=float(rs.get("mscale") or 0.0),
                 yarn_mscale_all_dim=float(rs.get("mscale_all_dim") or 0.0),
                 yarn_truncate=bool(rs.get("truncate", True)))
    # What moefit cannot run must be off in every fixture.
    assert fam == "gpt_oss" or cfg.hidden_act == "silu"  # (gpt_oss: not read; its SwiGLU is fixed)
    assert fam in ("deepseek_v3", "gpt_oss") or rs is None
    assert fam == "gpt_oss" or getattr(cfg, "sliding_window", None) is None
    if fam not in ("glm4_moe", "gpt_oss"):  # glm4_moe: q/k/v biases (qkv_bias above); gpt_oss: q/k/v/o
        assert not getattr(cfg, "attention_bias", False)
        assert e["partial_rotary"] == 1.0
    return e


def load_via_autoconfig(path):
    """AutoConfig.from_pretrained on a directory holding `path` as config.json."""
    d = tempfile.mkdtemp()
    try:
        shutil.copy(path, os.path.join(d, "config.json"))
        return AutoConfig.from_pretrained(d)
    finally:
        shutil.rmtree(d)


def unread_or_changed_keys(fam, written, cfg):
    """Keys of a written config.json that transformers ignores or does not keep.

    A key counts as read when the family's config class declares it or its
    modeling code reads it (config.KEY, or "KEY" in a getattr/hasattr); each
    must come back from the loaded config with the value written. torch_dtype
    is the name transformers 4.57 still reads for its dtype."""
    cls = FAMILIES[fam][0]
    declared = set(cls().to_dict())
    _, src = modeling_source(fam)
    loaded = cfg.to_dict()
    problems = []
    for key, value in sorted(written.items()):
        if key == "transformers_version":
            continue
        if key == "torch_dtype":
            if str(cfg.dtype).replace("torch.", "") != value:
                problems.append("torch_dtype %r loads as dtype %r" % (value, cfg.dtype))
            continue
        if key not in declared and not re.search(r'config\.%s\b|"%s"' % (re.escape(key), re.escape(key)), src):
            problems.append("%s: neither %s nor modeling_%s.py reads it" % (key, cls.__name__, fam))
        elif loaded.get(key, "<absent>") != value:
            problems.append("%s: written %r, transformers holds %r" % (key, value, loaded.get(key, "<absent>")))
    return problems


def dump(obj):
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    ap.add_argument("--data", default=DATA)
    args = ap.parse_args()
    if not transformers.__version__.startswith(PINNED + "."):
        sys.exit("need transformers %s.x, have %s" % (PINNED, transformers.__version__))
    check_modeling_rules()

    files, family_of = {}, {}
    expected = {"transformers_version": transformers.__version__, "configs": {}}
    for fam, (cls, arch) in FAMILIES.items():
        default = cls()
        files["%s_default.json" % fam] = dump(default.to_dict())
        expected["configs"]["%s_default.json" % fam] = resolve(fam, default)
        tiny = cls(architectures=[arch], **TINY[fam])
        files["%s_tiny.json" % fam] = tiny.to_json_string(use_diff=True)
        expected["configs"]["%s_tiny.json" % fam] = resolve(fam, tiny)
        family_of["%s_default.json" % fam] = family_of["%s_tiny.json" % fam] = fam
    for name, (fam, d) in HUB.items():
        files[name] = dump(d)
        family_of[name] = fam
        expected["configs"][name] = resolve(fam, FAMILIES[fam][0](**d))
    files["expected.json"] = dump(expected)

    # Every file as written must read back, through AutoConfig, to the same values; a
    # model_type transformers does not know (Kimi-K2's kimi_k2) is refused by AutoConfig
    # (it wants the checkpoint's own code) and read through the config class its
    # architectures name instead.
    for name, text in files.items():
        if name == "expected.json":
            continue
        fam = family_of[name]
        d = tempfile.mkdtemp()
        try:
            with open(os.path.join(d, "config.json"), "w") as f:
                f.write(text)
            if json.loads(text).get("model_type", fam) in CONFIG_MAPPING_NAMES:
                cfg = AutoConfig.from_pretrained(d)
            else:
                try:
                    AutoConfig.from_pretrained(d, trust_remote_code=False)  # (None: it would ask on stdin)
                    raise AssertionError("%s: AutoConfig read an unknown model_type" % name)
                except ValueError as e:
                    # (with auto_map, as Kimi-K2's: it asks for trust_remote_code)
                    assert "trust_remote_code" in str(e) or "does not recognize" in str(e), (name, e)
                assert json.loads(text)["architectures"] == [FAMILIES[fam][1]], name
                verbosity = transformers.logging.get_verbosity()
                transformers.logging.set_verbosity_error()  # ("a model of type kimi_k2 to instantiate ...")
                try:
                    cfg = FAMILIES[fam][0].from_pretrained(d)
                finally:
                    transformers.logging.set_verbosity(verbosity)
        finally:
            shutil.rmtree(d)
        assert resolve(fam, cfg) == expected["configs"][name], name

    bad = 0
    for name, text in files.items():
        path = os.path.join(args.data, name)
        if args.check:
            with open(path) as f:
                if f.read() != text:
                    print("differs: %s" % path)
                    bad += 1
        else:
            os.makedirs(args.data, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)

    # Configs written by mf_hf_config_write (golden files of the C test).
    for fam, (cls, arch) in FAMILIES.items():
        path = os.path.join(args.data, "%s_written.json" % fam)
        if not os.path.exists(path):
            print("missing %s (run the C test's golden update)" % path)
            bad += fam not in WRITTEN_PENDING
            continue
        cfg = load_via_autoconfig(path)
        with open(path) as f:
            written = json.load(f)
        if type(cfg) is not cls or cfg.architectures != [arch]:
            print("%s: AutoConfig gave %s %s" % (path, type(cfg).__name__, cfg.architectures))
            bad += 1
            continue
        got = resolve(fam, cfg)
        want = expected["configs"]["%s_tiny.json" % fam]
        keys = unread_or_changed_keys(fam, written, cfg)
        if keys:
            print("%s: %s" % (path, "; ".join(keys)))
            bad += 1
        elif got != want:
            diff = {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}
            print("%s: transformers reads it differently from %s_tiny.json: %s" % (path, fam, diff))
            bad += 1
        else:
            print("ok: %s loads through AutoConfig to the tiny %s model (dtype %s)" % (
                os.path.basename(path), fam, cfg.dtype))
    if bad:
        sys.exit("%d problem(s)" % bad)


if __name__ == "__main__":
    main()
