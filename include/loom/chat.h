/* loom/chat.h — Hugging Face chat templates: the Jinja subset that model chat
 * templates are written in, rendered the way transformers' apply_chat_template renders
 * them (tokenize=False).
 *
 * The environment matches transformers' one: trim_blocks and lstrip_blocks on, a single
 * trailing newline of the source dropped, loop controls ({% break %}, {% continue %}),
 * the {% generation %} tag (rendered as its body), the immutable sandbox (lists and
 * dicts cannot be mutated; namespace() objects can), Jinja's default Undefined (falsy,
 * renders as "", errors when used in arithmetic, attribute access or calls), and the
 * globals raise_exception(msg), strftime_now(fmt) (local time), range (at most 100000
 * items, as the sandbox), dict and namespace. `tojson` is json.dumps with
 * ensure_ascii=False and its indent / separators / sort_keys arguments; values print as
 * Python's str() does ({{ 1.0 }} -> "1.0", {{ none }} -> "None", lists and dicts as
 * their repr).
 *
 * Variables of a render: messages, tools (None when not given), documents (None),
 * add_generation_prompt, bos_token / eos_token (when the template has them), and the
 * keys of extra_json (they win over bos_token / eos_token, as template kwargs win over
 * special tokens in transformers).
 *
 * Supported statements: if/elif/else, for (tuple targets, inline `if` filter, else,
 * loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/depth/
 * cycle()/changed()), set (names, tuples, ns.attr, block set with filters), macro
 * (defaults, varargs, kwargs, caller) and call blocks, filter blocks, with, print,
 * raw, break/continue, generation. Expressions: Jinja's whole grammar (literals,
 * lists, dicts, tuples, slices, ., [], calls, | filters, is tests, ~, arithmetic,
 * comparisons, in, and/or/not, `a if c else b`) except *args and **kwargs in calls.
 * Filters: abs attr capitalize center count d default dictsort first float indent int
 * items join last length list lower map max min reject rejectattr replace reverse
 * round safe select selectattr sort string sum title tojson trim unique upper
 * wordcount. Tests: boolean callable defined divisibleby eq equalto even false float
 * ge gt greaterthan in integer iterable le lessthan lower lt mapping ne none number
 * odd sameas sequence string true undefined upper (and == != > >= < <=). Methods:
 * str (split rsplit strip lstrip rstrip startswith endswith replace find rfind index
 * rindex count join partition rpartition removeprefix removesuffix splitlines upper
 * lower title capitalize swapcase casefold center ljust rjust zfill and the is*()
 * predicates), dict (items keys values get copy), list and tuple (count index copy).
 * Anything else — an unknown or unimplemented tag, filter or test, a call of a global
 * loom does not provide — fails at parse time naming it with line:column; a method
 * loom does not implement can only be seen when it is called, and fails the render
 * naming it. Known differences from Python: integers are 64-bit (overflow is an
 * error), printf-style `'...' % x` and str.format are refused, `safe` returns a plain
 * string (no Markup), case mappings are utf8proc's (plus the common one-to-many ones
 * such as 'ß' -> 'SS'), and generators print as "<generator object>" (CPython adds
 * an address).
 *
 * Limits guard against hostile templates: parse nesting, macro call depth, loop
 * iterations, string/output size and working memory (lm_chat_template_set_limit).
 *
 * Thread safety: a parsed template is immutable; any number of threads may render
 * it at once. lm_chat_template_set_limit must not run concurrently with renders.
 */
#ifndef LOOM_CHAT_H
#define LOOM_CHAT_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_chat_template lm_chat_template;

/* Parses Jinja source (UTF-8, NUL-terminated). bos_token / eos_token may be NULL:
 * then the variables are undefined in the template. Errors name line:column and the
 * construct: LM_PARSE_ERROR for syntax errors and names Jinja itself does not know
 * ("chat template 3:14: unknown filter 'foo'"), LM_UNSUPPORTED for Jinja constructs
 * loom does not implement ("chat template 3:14: unsupported filter 'wordwrap'"),
 * LM_INVALID_ARGUMENT for invalid UTF-8, LM_OUT_OF_RANGE for a source over 1 MiB or
 * nested too deeply. The caller owns *out. */
LM_API lm_status lm_chat_template_parse(const char *source, const char *bos_token, const char *eos_token,
                                        lm_chat_template **out);

/* Reads the chat template of a model. path is a model directory or a
 * tokenizer_config.json file. In a directory, a chat_template.jinja file wins over
 * tokenizer_config.json's "chat_template" (as in transformers); bos_token / eos_token
 * always come from tokenizer_config.json (a string, or an AddedToken object
 * {"content": ...}). "chat_template" is a string or a list of {"name", "template"}
 * (the one named "default" is used). Errors: LM_IO_ERROR, LM_PARSE_ERROR (bad JSON or
 * template), LM_NOT_FOUND when the model has no chat template, and those of
 * lm_chat_template_parse. */
LM_API lm_status lm_chat_template_load(const char *path, lm_chat_template **out);
/* The same for the template called name: additional_chat_templates/<name>.jinja in a
 * directory, else the entry of a list-form "chat_template" (a string-form one is
 * "default"). transformers renders requests that carry tools with the "tool_use"
 * template when a model has one: load it too and render those requests with it. */
LM_API lm_status lm_chat_template_load_named(const char *path, const char *name, lm_chat_template **out);

LM_API void lm_chat_template_destroy(lm_chat_template *t); /* accepts NULL */

/* Renders a conversation. messages_json: a JSON array of message objects as the OpenAI
 * API and transformers take them (role, content and optionally tool_calls, name,
 * tool_call_id, reasoning_content, ...). tools_json: a JSON array or NULL (then
 * `tools` is None). extra_json: a JSON object of extra template variables (e.g.
 * {"enable_thinking": false, "date_string": "26 Jul 2024"}) or NULL; keys messages,
 * tools, documents and add_generation_prompt are refused (LM_INVALID_ARGUMENT), as
 * transformers refuses them twice. The JSON must not contain NUL characters.
 *
 * *out is NUL-terminated, allocated with lm_malloc (the caller frees it with lm_free).
 * Errors: LM_PARSE_ERROR (JSON that does not parse), LM_INVALID_ARGUMENT (JSON of the
 * wrong shape; a render error: raise_exception — the detail carries the template's
 * message verbatim — or a type error such as adding a string to None, worded as
 * Python words it), LM_UNSUPPORTED (a method or feature loom does not implement,
 * reached at render time), LM_OUT_OF_RANGE (a limit was exceeded),
 * LM_OUT_OF_MEMORY. Render error details read "chat template L:C: message". */
LM_API lm_status lm_chat_template_render(const lm_chat_template *t, const char *messages_json, const char *tools_json,
                                         int add_generation_prompt, const char *extra_json, char **out);

/* Resource limits of renders; a render that exceeds one fails with LM_OUT_OF_RANGE
 * naming it. Parsing has fixed ones: expressions nest at most 200 deep, statements 100
 * deep. */
typedef enum lm_chat_limit {
    LM_CHAT_LIMIT_STRING_BYTES = 0,    /* longest string, the output included (default 64 MiB) */
    LM_CHAT_LIMIT_MEMORY_BYTES = 1,    /* working memory of one render (default 512 MiB) */
    LM_CHAT_LIMIT_LOOP_ITERATIONS = 2, /* loop iterations of one render, all loops together (default 10^7) */
    LM_CHAT_LIMIT_CALL_DEPTH = 3,      /* nested macro calls (default 64) */
    LM_CHAT_LIMIT_WORK = 4             /* steps of one render (default 10^8): each expression and
                                          statement, each item a filter, test or `in` visits, each
                                          64 bytes a string method scans */
} lm_chat_limit;

/* Sets one limit (value >= 1) for later renders of t. Errors: LM_INVALID_ARGUMENT. */
LM_API lm_status lm_chat_template_set_limit(lm_chat_template *t, lm_chat_limit which, int64_t value);

#ifdef __cplusplus
}
#endif
#endif
