/* tools/loom/cmd_info.c — `loom info`: what a model directory holds, as JSON ("weights":
 * "int8", "int4" or "bf16" (float, whatever the dtype), and "quantization": the
 * directory's quantization_config (int4 with its group_size) or null). */
#include "args.h"
#include "commands.h"
#include "common.h"

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    const cli_opt opts[] = {{"model", CLI_STRING, &dir, "DIR: Hugging Face model directory (required)"},
                            {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("info", "--model DIR", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!dir) {
        fprintf(stderr, "loom info: --model DIR is required\n");
        return 2;
    }
    lm_model *m = cli_load_model("info", dir);
    if (!m) return 1;
    const lm_model_config *c = lm_model_get_config(m);
    int64_t params = 0;
    for (int64_t i = 0; i < lm_model_config_tensor_count(c); i++) {
        lm_tensor_spec spec;
        if (lm_model_config_tensor(c, i, &spec) != LM_OK) continue;
        params += spec.ndim == 1 ? spec.shape[0] : spec.shape[0] * spec.shape[1];
    }
    printf("{\"arch\":\"%s\",\"parameters\":%lld,\"weight_dtype\":\"%s\",\"vocab_size\":%lld,\"hidden_size\":%lld,"
           "\"intermediate_size\":%lld,\"layers\":%lld,\"heads\":%lld,\"kv_heads\":%lld,\"head_dim\":%lld,"
           "\"max_position_embeddings\":%lld,\"rope_theta\":%g,\"rope_scaling\":\"%s\",\"tied_embeddings\":%s,"
           "\"qkv_bias\":%s,\"qk_norm\":%s,\"bytes_per_token\":%lld,\"eos_token_ids\":[",
           lm_arch_name(c->arch), (long long)params, lm_dtype_name(c->dtype), (long long)c->vocab_size,
           (long long)c->hidden_size, (long long)c->intermediate_size, (long long)c->num_hidden_layers,
           (long long)c->num_attention_heads, (long long)c->num_key_value_heads, (long long)c->head_dim,
           (long long)c->max_position_embeddings, c->rope_theta, lm_rope_type_name(c->rope_scaling.type),
           c->tie_word_embeddings ? "true" : "false", c->qkv_bias ? "true" : "false", c->qk_norm ? "true" : "false",
           (long long)lm_model_weight_bytes(m));
    for (int i = 0; i < c->n_eos; i++) printf("%s%lld", i ? "," : "", (long long)c->eos_token_ids[i]);
    printf("],\"weights\":\"%s\",\"quantization\":", lm_weights_name(lm_model_weights(m)));
    if (c->quant_format == LM_QUANT_NONE) printf("null");
    else {
        int int4 = c->quant_format == LM_QUANT_INT4;
        printf("{\"format\":\"%s\",\"scheme\":\"%s\",", lm_quant_format_name((lm_quant_format)c->quant_format),
               int4 ? "group-wise symmetric" : "per-output-channel symmetric");
        if (int4) printf("\"group_size\":%d,", (int)c->quant_group);
        printf("\"modules\":[");
        for (int i = 0, k = 0; i < LM_QUANT_MODULE_COUNT; i++)
            if (c->quant_modules & (1 << i)) printf("%s\"%s\"", k++ ? "," : "", lm_quant_module_name(i));
        printf("]}");
    }
    printf("}\n");
    lm_model_destroy(m);
    return 0;
}
