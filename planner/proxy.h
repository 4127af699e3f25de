/*
 * Private to planner/: the proxy program the planner scores its candidates on.
 *
 * A real-size model repeats a few kinds of layer (MoE, dense) dozens of times,
 * and a change to one layer's decisions saves about the same time wherever the
 * layer sits in the middle of the step. So instead of simulating the whole
 * step once per candidate, the planner simulates a short model: one
 * representative of each kind of layer, each between two layers of the most
 * common kind, with the full model's embedding, head and batch:
 *
 *   kinds in order of first appearance c1, c2, ...; majority kind M:
 *   proxy layers  M  c1  M  c2  M ...        (all-MoE: M M M, the middle one scored)
 *
 * except GLM-4.5's, whose dense layers are its first ones: the same layers
 * with the dense first (D M M M M), as the full model has them.
 *
 * Each proxy layer stands for a full layer of its kind (`full_layer`), and
 * each full layer is represented by the proxy layer of its kind (`rep`). A
 * kind here is everything that decides a layer's tensors: MoE or dense (the
 * spec's only per-layer difference); the builder checks that the proxy layer
 * and the full layer it stands for have the same parameters, byte for byte,
 * and gives no proxy otherwise. Scores on the proxy are estimates; the planner
 * checks the chosen decisions on the full program.
 */
#ifndef MF_PLANNER_PROXY_H
#define MF_PLANNER_PROXY_H

#include <stdint.h>

#include "src/core/core.h"
#include "src/model/params.h"
#include "src/model/program.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mf_plan_proxy {
  mf_param_table *params;
  mf_program *prog;
  int32_t n_layers;     /* proxy layers */
  int32_t *full_layer;  /* [n_layers] the full layer each proxy layer stands for */
  int32_t *rep;         /* [full layers] the proxy layer scored for full layer l */
  int32_t *param_full;  /* [proxy params] the full parameter a proxy parameter stands for */
  int32_t *tensor_full; /* [proxy tensors] the full tensor a proxy tensor stands for, or -1 */
} mf_plan_proxy;

/* Builds the proxy of `full`; *out = NULL (and MF_OK) when a proxy would not
 * be smaller than the full program or cannot stand for it. */
mf_status mf_plan_proxy_build(const mf_program *full, mf_plan_proxy **out);
void mf_plan_proxy_free(mf_plan_proxy *x); /* NULL is fine */

/* The name of full tensor `name` at full layer `from` as the proxy names it at
 * proxy layer `to` ("mb1.model.layers.17.mlp.x" -> "mb1.model.layers.1.mlp.x"),
 * or the name itself for a tensor outside the layers. 0 when it does not fit. */
int mf_plan_proxy_rename(const char *name, int32_t from, int32_t to, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* MF_PLANNER_PROXY_H */
