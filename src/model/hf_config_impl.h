/*
 * Private to src/io (not part of its API): what the config.json reader
 * (hf_config_read.c) and writer (hf_config_write.c) share.
 */
#ifndef MF_MODEL_HF_CONFIG_IMPL_H
#define MF_MODEL_HF_CONFIG_IMPL_H

#include <stddef.h>

#include "src/core/core.h"

/* What Python's json.dumps writes for a float (its repr): the shortest digits
 * that read back exactly; fixed notation for exponents -4..15, else 1e-05. */
void mf_hf_format_double(double x, char *buf, size_t cap);

/* DIR/config.json in a malloc'ed string the caller frees. */
mf_status mf_hf_config_in_dir(const char *dir, char **out);

#endif /* MF_MODEL_HF_CONFIG_IMPL_H */
