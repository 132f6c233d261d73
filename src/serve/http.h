/* serve/http.h — what the HTTP server (serve/http.c) needs from its neighbours
 * (never installed): the model directory's text side (serve/text.c) and the
 * embedded chat page (generated from serve/page.html at build time).
 */
#ifndef LOOM_SERVE_HTTP_H
#define LOOM_SERVE_HTTP_H

#include "loom/chat.h"
#include "loom/server.h"
#include "serve/openai.h"

/* Loads model_dir/tokenizer.json (required) and the chat template of
 * model_dir/tokenizer_config.json: *chat = NULL with *chat_error saying why when there
 * is none (a template that does not parse is an error). *bos = the id to put before
 * completion prompts: prepend_bos 1 = the config's bos_token_id, 0 = none (-1), -1 =
 * the first special token of tokenizer.json's TemplateProcessing post-processor, as
 * Hugging Face adds it (none when there is no such processor). */
lm_status lm__serve_load_text(const char *model_dir, const lm_model *m, int prepend_bos, lm_tokenizer **tok,
                              lm_chat_template **chat, char **chat_error, int32_t *bos);

/* The chat page served at "/" (HTML, NUL-terminated; *len excludes the NUL). */
const char *lm__serve_page(size_t *len);

#endif
