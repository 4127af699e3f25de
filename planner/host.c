/* Host memory of a plan and its NVMe spill (see host.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/host.h"

#include "src/core/env.h"
#include "src/core/hostbuf.h"

mf_status mf_host_account(const mf_program *p, const mf_schedule *s, uint64_t pinned_bytes,
                          const mf_config_memory *mem, const mf_hwprofile *hw, mf_host_usage *out) {
  if (!p || !hw || !out) return MF_ERR(MF_ERR_INVALID_ARG, "host memory: NULL argument");
  if (s && s->prog != p) return MF_ERR(MF_ERR_INVALID_ARG, "host memory: the schedule belongs to another program");
  mf_host_usage u;
  memset(&u, 0, sizeof u);
  /* m + v per parameter: train.adam_moments, as the config copies it into mem */
  const uint64_t moment = mem && mem->adam_moments == MF_CONFIG_MOMENTS_BF16 ? 4 : 8;
  /* LoRA with bf16 storage on one rank: the frozen base is at home only in
   * its bf16 working copy (params.h mf_lora_base_bf16) */
  const int base_bf16 = mf_lora_base_bf16(p->params, p->storage, p->ranks);
  for (int64_t i = 0; i < p->params->n; i++) {
    const uint64_t numel = (uint64_t)p->params->params[i].numel;
    /* a weight stored quantized is its blob alone (the working bytes below) */
    if (!(base_bf16 && p->params->params[i].frozen) && !p->params->params[i].quant) u.master_bytes += 4 * numel;
    /* A working copy in another dtype than the master's: the first fill of a
     * device-updated weight reads it too, and the weights come home into it. */
    const mf_ptensor *w = &p->tensors[p->param_tensor[i]];
    if (w->dtype != MF_DTYPE_F32) u.working_bytes += w->bytes;
    /* The optimizer on the device: the weights come home for evaluations and
     * the final save (master), but no gradient comes home and the moments
     * live on the device. */
    if (s && s->optim_device && s->optim_device[i]) {
      u.cold_master_bytes += 4 * numel;
      continue;
    }
    if (!p->forward_only && !p->params->params[i].frozen) { /* a frozen weight has neither */
      u.grad_bytes += 4 * numel;
      u.moment_bytes += moment * numel;
    }
  }
  /* The ranks of a node share one copy of the state above; each has its own
   * offloaded activations and pinned staging. */
  const uint64_t per_node = p->node_ranks > 1 ? (uint64_t)p->node_ranks : 1;
  u.act_bytes = (s ? s->host_act_bytes : 0) * per_node;
  u.pinned_bytes = pinned_bytes * per_node;
  u.pinned_per_node = per_node;
  u.total_bytes =
      u.master_bytes + u.working_bytes + u.grad_bytes + u.moment_bytes + u.act_bytes + u.pinned_bytes;
  u.host_limit = mem && mem->host_limit != MF_CONFIG_SIZE_AUTO ? mem->host_limit : hw->host_memory;
  u.pinned_limit = mem ? mem->pinned_limit : 0;
  u.pinned_fits = u.pinned_limit == 0 || pinned_bytes <= u.pinned_limit; /* a process's */
  u.host_fits = u.total_bytes <= u.host_limit;
  u.nvme = mem && mem->nvme_dir && hw->nvme_bandwidth > 0;
  if (!u.host_fits) {
    uint64_t excess = u.total_bytes - u.host_limit;
    if (u.nvme) {
      u.spill_cold_master_bytes = excess < u.cold_master_bytes ? excess : u.cold_master_bytes;
      excess -= u.spill_cold_master_bytes;
      u.spill_moment_bytes = excess < u.moment_bytes ? excess : u.moment_bytes;
      excess -= u.spill_moment_bytes;
      const uint64_t warm = u.master_bytes - u.cold_master_bytes;
      u.spill_master_bytes = excess < warm ? excess : warm;
      excess -= u.spill_master_bytes;
      /* The working copy: written once by the optimizer, read once by the uploads. */
      u.spill_working_bytes = excess < u.working_bytes ? excess : u.working_bytes;
      excess -= u.spill_working_bytes;
      /* Gradient sums that land home once a step (no copy adds into them:
       * layer-major order, or kept on the device) are written once and read
       * once by the optimizer, like the states above. */
      int once = !p->forward_only && (s || p->order == MF_ORDER_LAYER_MAJOR || p->G == 1);
      for (int32_t i = 0; s && i < s->n_instr && once; i++) {
        const mf_instr *in = &s->instr[i];
        if (in->kind == MF_I_D2H && in->accumulate && p->tensors[s->slots[in->slot].tensor].kind == MF_T_GRAD) once = 0;
      }
      if (once) {
        u.spill_grad_bytes = excess < u.grad_bytes ? excess : u.grad_bytes;
        excess -= u.spill_grad_bytes;
      }
    }
    u.unplaced_bytes = excess;
  }
  *out = u;
  return MF_OK;
}

void mf_host_set_pinned_home(mf_host_usage *u, uint64_t bytes) {
  u->pinned_home_bytes = bytes;
  const uint64_t per_node = u->pinned_per_node ? u->pinned_per_node : 1;
  u->pinned_fits = u->pinned_limit == 0 || u->pinned_bytes / per_node + bytes <= u->pinned_limit;
}

uint64_t mf_host_spill_traffic_bytes(const mf_host_usage *u) {
  return 2 * (u->spill_moment_bytes + u->spill_master_bytes + u->spill_working_bytes + u->spill_grad_bytes);
}

double mf_host_spill_seconds(const mf_host_usage *u, const mf_hwprofile *hw) {
  if (u->unplaced_bytes > 0) return INFINITY;
  const uint64_t traffic = mf_host_spill_traffic_bytes(u);
  if (traffic == 0) return 0.0;
  return hw->nvme_bandwidth > 0 ? (double)traffic / hw->nvme_bandwidth : INFINITY;
}

const char *mf_host_unplaced_why(const mf_host_usage *u, const mf_config_memory *mem) {
  if (!u->nvme)
    return mem && mem->nvme_dir ? "the hardware profile has no NVMe bandwidth" : "memory.nvme_dir is not set";
  return "only moments, master weights, the working copy and gradient sums that land home once a step spill";
}

uint64_t mf_host_spill_bytes(const mf_host_usage *u) {
  return u->spill_moment_bytes + u->spill_master_bytes + u->spill_cold_master_bytes + u->spill_working_bytes +
         u->spill_grad_bytes;
}

uint64_t mf_host_resident_bytes(const mf_host_usage *u) { return u->total_bytes - mf_host_spill_bytes(u); }

mf_status mf_host_machine_memory(uint64_t *bytes, char *source, size_t source_cap) {
  *bytes = 0;
  MF_CHECK(mf_env_check(MF_ENV_HOST_MEMORY));
  if (mf_env_bytes(MF_ENV_HOST_MEMORY, bytes)) {
    snprintf(source, source_cap, "MF_HOST_MEMORY");
    return MF_OK;
  }
  *bytes = mf_hostbuf_machine_memory(1, source, source_cap);
  return MF_OK;
}
