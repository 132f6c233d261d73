/* Tests for the chat template interpreter (include/loom/chat.h).
 *
 * 1. The expression and statement language: a table of small templates whose expected
 *    output was produced by Jinja2 3.1.6 in transformers' environment (trim_blocks,
 *    lstrip_blocks, immutable sandbox, transformers' tojson), checked byte for byte.
 * 2. Errors: unsupported and unknown constructs are named with line:column at parse
 *    time; raise_exception's message reaches lm_last_error(); bad JSON inputs.
 * 3. Hostile templates: nesting, loop, range, string, memory and call-depth limits
 *    fail cleanly; a deterministic mutation loop over the real templates must never
 *    crash or leak (it runs under ASan/UBSan in the sanitize build); injected
 *    allocation failures leak nothing.
 * 4. Loading (tokenizer_config.json string / list forms, AddedToken specials,
 *    chat_template.jinja) and concurrent renders.
 * 5. The real templates (third_party/tokenizers/<name>, fetched by
 *    scripts/fetch_tokenizers.sh) rendered over tests/data/chat/conversations.json
 *    must equal tests/data/chat/expected_<name>.json (scripts/gen_chat_fixtures.py,
 *    from transformers) byte for byte. When the templates are absent the test runs
 *    everything else and then exits 77 (skipped).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include "loom/chat.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const k_templates[] = {"qwen2_5", "qwen3", "llama3", "llama3_2", "deepseek_v3"};
enum { N_TEMPLATES = 5 };

/* ---- helpers ------------------------------------------------------------------------------------ */
/* Prints a byte string with control characters escaped. */
static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') printf("\\n");
        else if (ch == '\t') printf("\\t");
        else if (ch == '\r') printf("\\r");
        else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
        else putchar(ch);
    }
}

/* 1 when got == want; otherwise prints the first differing offset with context. */
static int same_text(const char *what, const char *got, const char *want) {
    if (strcmp(got, want) == 0) return 1;
    size_t i = 0, gn = strlen(got), wn = strlen(want);
    while (i < gn && i < wn && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    printf("  %s: first difference at byte %zu (got %zu bytes, want %zu)\n    got : ...", what, i, gn, wn);
    print_escaped(got + from, gn - from < 100 ? gn - from : 100);
    printf("...\n    want: ...");
    print_escaped(want + from, wn - from < 100 ? wn - from : 100);
    printf("...\n");
    return 0;
}

/* Parses src and renders it over messages (default one user message) and extra;
 * returns the text (caller frees with lm_free) or NULL with *status set. */
static char *render(const char *src, const char *messages, const char *tools, int agp, const char *extra,
                    lm_status *status) {
    lm_chat_template *t = NULL;
    char *out = NULL;
    lm_status s = lm_chat_template_parse(src, NULL, NULL, &t);
    if (s == LM_OK)
        s = lm_chat_template_render(t, messages ? messages : "[{\"role\":\"user\",\"content\":\"hi\"}]", tools, agp,
                                    extra, &out);
    lm_chat_template_destroy(t);
    if (status) *status = s;
    return out;
}

/* The render must fail with status want and a detail containing each of the needles
 * (NULL-terminated list). */
static void expect_fail(const char *src, const char *messages, const char *extra, lm_status want, const char *n1,
                        const char *n2, int line) {
    lm_status s;
    char *out = render(src, messages, NULL, 0, extra, &s);
    if (s != want) lt_fail(__FILE__, line, "'%s': got %s (%s), want %s", src, lm_status_name(s), lm_last_error(), lm_status_name(want));
    else if ((n1 && !strstr(lm_last_error(), n1)) || (n2 && !strstr(lm_last_error(), n2)))
        lt_fail(__FILE__, line, "'%s': detail '%s' lacks '%s' / '%s'", src, lm_last_error(), n1 ? n1 : "", n2 ? n2 : "");
    lm_free(out);
}
#define EXPECT_FAIL(src, want, n1, n2) expect_fail(src, NULL, NULL, want, n1, n2, __LINE__)

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The chat_template of a real model directory, or NULL. */
static char *real_template_source(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "third_party/tokenizers/%s/tokenizer_config.json", name);
    json_error_t err;
    json_t *cfg = json_load_file(path, 0, &err);
    const char *s = json_string_value(json_object_get(cfg, "chat_template"));
    char *copy = s ? strdup(s) : NULL;
    json_decref(cfg);
    return copy;
}

static int real_files_present(void) {
    for (int i = 0; i < N_TEMPLATES; i++) {
        char path[256];
        snprintf(path, sizeof path, "third_party/tokenizers/%s/tokenizer_config.json", k_templates[i]);
        if (!file_exists(path)) return 0;
    }
    return 1;
}

/* ---- 1. the language ------------------------------------------------------------------------------ */
typedef struct lang_case {
    const char *name, *src, *want;
} lang_case;

/* Rendered with messages = [{"role": "user", "content": "hi"}], no tools,
 * add_generation_prompt false and k_vars; expected outputs from Jinja2 3.1.6 in
 * transformers' environment (tests/data/chat is built the same way). */
static const char k_vars[] = "{\"s\": \"hello World\", \"n\": 3, \"f\": 2.5, \"l\": [1, 2, 3], \"d\": {\"a\": 1, \"b\": [2]},"
                             " \"e\": [], \"m\": {\"role\": \"user\", \"content\": \"x\"}}";

static const lang_case k_lang[] = {
    {"trim_blocks_removes_newline_after_block",
     "{% if true %}\nyes\n{% endif %}\nend",
     "yes\nend"},
    {"lstrip_blocks_removes_indent_before_block",
     "a\n    {% if true %}\n    b\n    {% endif %}\nc",
     "a\n    b\nc"},
    {"lstrip_blocks_spares_variable_tags",
     "a\n    {{ 'v' }}\nb",
     "a\n    v\nb"},
    {"plus_disables_lstrip_and_trim",
     "a\n  {%+ if true +%}\nb{% endif %}",
     "a\n  \nb"},
    {"minus_strips_all_whitespace",
     "a \n\t {%- if true -%} \n b {{- 'c' -}} \n d {%- endif %}",
     "abcd"},
    {"comments_are_removed_with_whitespace_rules",
     "a\n  {# note #}\nb {#- x -#}  c",
     "a\nbc"},
    {"raw_blocks_keep_tags",
     "{% raw %}{{ x }}{% if %}{% endraw %}",
     "{{ x }}{% if %}"},
    {"newlines_normalized_and_one_trailing_dropped",
     "a\r\nb\rc\n\n",
     "a\nb\nc\n"},
    {"lstrip_at_template_start_and_unicode_space",
     "\t {% if 1 %}　x{% endif %}",
     "　x"},
    {"inline_tags_keep_surrounding_text",
     "x {% if true %}y{% endif %} z",
     "x y z"},
    {"python_str_of_scalars",
     "{{ 1 }}|{{ 1.0 }}|{{ -0.0 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 1.5e-5 }}|{{ 0.1 + 0.2 }}|{{ true }}|{{ none }}|{{ 10 / 4 }}",
     "1|1.0|-0.0|1e+16|1000000000000000.0|1.5e-05|0.30000000000000004|True|None|2.5"},
    {"python_repr_of_containers",
     "{{ [1, 'a', none, true, 1.5, [], {}] }}|{{ {'k': 'v', 'n': [1]} }}|{{ (1,) }}|{{ () }}|{{ ('a', 'b') }}",
     "[1, 'a', None, True, 1.5, [], {}]|{'k': 'v', 'n': [1]}|(1,)|()|('a', 'b')"},
    {"python_repr_quotes_and_escapes",
     "{{ [\"it's\", 'say \"x\"', 'both \\' \"', '\\\\', '\\t\\n\\r', '\\x00\\x1b\\x7f', 'é😀\\u200b\\xa0'] }}",
     "[\"it's\", 'say \"x\"', 'both \\' \"', '\\\\', '\\t\\n\\r', '\\x00\\x1b\\x7f', 'é😀\\u200b\\xa0']"},
    {"string_escapes_in_literals",
     "{{ 'a\\tb\\x41\\u00e9\\101\\q' }}|{{ \"x\" 'y' }}",
     "a\tbAéA\\q|xy"},
    {"dict_views_and_range_repr",
     "{{ {'a': 1}.items() }}{{ {'a': 1}.keys() }}{{ {'a': 1}.values() }}{{ range(3) }}{{ range(1, 5, 2) }}{{ namespace(a=1) }}",
     "dict_items([('a', 1)])dict_keys(['a'])dict_values([1])range(0, 3)range(1, 5, 2)<Namespace {'a': 1}>"},
    {"integer_literal_forms",
     "{{ 1_000 }} {{ 0x1f }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }}",
     "1000 31 5 15 1500.0"},
    {"arithmetic_follows_python",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -2 }} {{ 1 / 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }}",
     "3 -4 2 -2 3.0 0.5 1024 0.25 0.3333333333333333 4 64"},
    {"concat_and_precedence",
     "{{ 1 + 2 * 3 }} {{ 2 * 3 ~ 4 }} {{ 'a' ~ 'b' * 2 }} {{ 'a' ~ none ~ 1 ~ true }} {{ - - 1 }}",
     "7 64 abb aNone1True 1"},
    {"sequence_operators",
     "{{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'ab' * 2 }} {{ 2 * 'ab' }} {{ [0] * 3 }} {{ 'x' * -1 }}|{{ true + true }}",
     "[1, 2] (1, 2) abab abab [0, 0, 0] |2"},
    {"comparisons_chain_and_membership",
     "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' in 'cat' }} {{ 2 not in [1] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }} {{ (1,) == [1] }} {{ x == y }}",
     "True False True True True True False True"},
    {"and_or_return_operands",
     "{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or '' }}|{{ 'a' or 'b' }} {{ not 1 }} {{ none or [] }}",
     "2 0 |a False []"},
    {"conditional_expression",
     "{{ 'x' if true else 'y' }} {{ 'x' if false else 'y' if true else 'z' }} [{{ 'x' if false }}] {{ ('x' if false) is defined }}",
     "x y [] False"},
    {"attribute_and_item_access",
     "{{ m.role }} {{ m['content'] }} {{ d.b[0] }} {{ l.0 }} {{ l[-1] }} {{ 'abc'[1] }} [{{ l[9] }}] [{{ m.nope }}] [{{ none.x }}]",
     "user x 2 1 3 b [] [] []"},
    {"slices_follow_python",
     "{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[5:1:-2] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ 'héllo'[1:3] }} {{ range(10)[2:8:3]|list }} {{ l[5:] }}",
     "bcd fedcba fd [2, 3] [1, 2] [1, 3] él [2, 5] []"},
    {"dict_methods_win_over_keys",
     "{{ {'items': 1}.items()|list }} {{ d.get('a') }} {{ d.get('z', 0) }} {{ d.keys()|list }}",
     "[('items', 1)] 1 0 ['a', 'b']"},
    {"undefined_is_falsy_and_empty",
     "[{{ u }}] {{ u is defined }} {{ u|length }} {{ u|default('D') }} {{ u ~ 'a' }} {{ not u }}{% for x in u %}X{% else %} empty{% endfor %} {{ 'a' in u }}",
     "[] False 0 D a True empty False"},
    {"filter_trim_case_and_replace",
     "[{{ '  x '|trim }}] [{{ 'xxyxx'|trim('x') }}] {{ 'hello WORLD'|capitalize }} {{ 'hello-world (foo) x_y'|title }} {{ 'Abc'|lower }}{{ 'Abc'|upper }} {{ 'aaa'|replace('a', 'b', 2) }}",
     "[x] [y] Hello world Hello-World (Foo) X_y abcABC bba"},
    {"filter_length_first_last_list_join",
     "{{ l|length }} {{ 'héllo'|count }} {{ l|first }} {{ l|last }} {{ 'abc'|list }} {{ d|list }} {{ l|join('-') }} {{ [{'a': 'x'}, {'a': 'y'}]|join(',', attribute='a') }} [{{ []|first }}]",
     "3 5 1 3 ['a', 'b', 'c'] ['a', 'b'] 1-2-3 x,y []"},
    {"filter_default_and_conversions",
     "{{ u|d('z') }} {{ 0|default(5, true) }} {{ none|default(5) }} {{ '42'|int }} {{ ' 4_2 '|int }} {{ '3.9'|int }} {{ 'x'|int(7) }} {{ -3.9|int }} {{ '1.5'|float }} {{ 'x'|float }} {{ 1.5|string }} {{ -2|abs }}",
     "z 5 None 42 42 3 7 -3 1.5 0.0 1.5 2"},
    {"filter_round_is_python_round",
     "{{ 2.5|round }} {{ 3.5|round }} {{ 0.125|round(2) }} {{ 2.675|round(2) }} {{ 1250|round(-2) }} {{ 1350|round(-2) }} {{ 2.5|round(method='ceil') }} {{ 2.5|round(0, 'floor') }} {{ 3|round(1) }}",
     "2.0 4.0 0.12 2.67 1200 1400 3.0 2.0 3"},
    {"filter_sort_unique_reverse_dictsort",
     "{{ ['b', 'A', 'c']|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }} {{ ['a', 'B', 'A']|unique|list }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}",
     "['A', 'b', 'c'] [3, 2, 1] [{'n': 1}, {'n': 2}] ['a', 'B'] [3, 2, 1] cba [('a', 2), ('b', 1)] [('b', 1), ('a', 2)]"},
    {"filter_min_max_sum",
     "{{ [1, 5, 3]|max }} {{ ['b', 'A']|min }} {{ [{'a': 3}, {'a': 7}]|max(attribute='a') }} {{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ [1]|sum(start=10) }}",
     "5 A {'a': 7} 6 3.5 11"},
    {"filter_select_reject_map",
     "{{ [1, 2, 3]|select('odd')|list }} {{ [1, 2, 3]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|select('>', 1)|list }} {{ [{'r': 'a', 'x': 1}, {'r': 'b'}]|selectattr('x')|list }} {{ [{'r': 'a'}, {'r': 'b'}]|rejectattr('r', 'equalto', 'a')|list }} {{ [{'a': {'b': 1}}]|map(attribute='a.b')|list }} {{ [{'a': 1}, {}]|map(attribute='a', default=9)|list }} {{ [1, 2]|map('string')|list }}",
     "[1, 3] [2] [1, 'a'] [2, 3] [{'r': 'a', 'x': 1}] [{'r': 'b'}] [1] [1, 9] ['1', '2']"},
    {"generators_are_read_once",
     "{% set g = [1, 2, 3]|select %}{{ g|first }}{{ g|list }}{{ g|list }} {{ (l|map('string')) is sequence }}",
     "1[2, 3][] False"},
    {"filter_items_and_indent",
     "{{ {'a': 1}|items|list }} [{{ 'a\nb\n\nc'|indent(2) }}] [{{ 'a\nb'|indent(2, true) }}] [{{ 'a\n\nb'|indent(2, blank=true) }}]",
     "[('a', 1)] [a\n  b\n\n  c] [  a\n  b] [a\n  \n  b]"},
    {"filter_tojson_like_json_dumps",
     "{{ {'a': [1, 2.5, {'b': none, 'c': true}], 'd': 'é\"\\\\\\n\\x01'}|tojson }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ (1, 'x')|tojson }}|{{ {1: 2, true: 3, none: 4}|tojson }}|{{ (1e300 * 1e300)|tojson }}",
     "{\"a\": [1, 2.5, {\"b\": null, \"c\": true}], \"d\": \"é\\\"\\\\\\n\\u0001\"}|\"\\u00e9\\ud83d\\ude00\"|[1, \"x\"]|{\"1\": 3, \"null\": 4}|Infinity"},
    {"filter_tojson_indent_separators_sort_keys",
     "{{ {'a': {'b': [1, {'c': 2}]}, 'd': []}|tojson(indent=2) }}|{{ [1, [2]]|tojson(indent='\\t') }}|{{ {'a': 1}|tojson(indent=0) }}|{{ [1, {'k': 2}]|tojson(separators=(',', ':')) }}|{{ {'b': 1, 'a': {'d': 1, 'c': 2}}|tojson(sort_keys=true) }}",
     "{\n  \"a\": {\n    \"b\": [\n      1,\n      {\n        \"c\": 2\n      }\n    ]\n  },\n  \"d\": []\n}|[\n\t1,\n\t[\n\t\t2\n\t]\n]|{\n\"a\": 1\n}|[1,{\"k\":2}]|{\"a\": {\"c\": 2, \"d\": 1}, \"b\": 1}"},
    {"tests_types",
     "{{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is number }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ u is sequence }} {{ u is iterable }} {{ none is none }} {{ false is false }} {{ 0 is false }} {{ true is boolean }}",
     "True False True True True True True True False True True True True False True"},
    {"tests_values",
     "{{ 1 is odd }} {{ 2 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 1 is lessthan 0 }} {{ 'a' is in 'abc' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ u is callable }} {{ none is sameas none }} {{ x is not defined }}",
     "True True True True True False True True True True True True True"},
    {"str_split_and_strip",
     "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ ' a  b '.split(None, 1) }} {{ ' a b  c '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ ''.split() }} [{{ '  x  '.lstrip() }}] [{{ 'xyhixy'.strip('xy') }}] [{{ '\\u3000hi\\xa0'.strip() }}]",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b '] [' a b', 'c'] ['a,b', 'c'] [] [x  ] [hi] [hi]"},
    {"str_search_methods",
     "{{ 'hello'.startswith('he') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('l', 0, 4) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'héllo'.find('l') }} {{ 'hello'.count('l') }} {{ 'aaa'.count('') }} {{ 'hello'.find('l', 3) }}",
     "True True True 2 3 2 2 4 3"},
    {"str_other_methods",
     "{{ ', '.join(['a', 'b']) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'ab'.center(6, '*') }} {{ '-42'.zfill(6) }} {{ 'Hello World'.swapcase() }} {{ \"they're bill's\".title() }} {{ 'ß'.upper() }} {{ '123'.isdigit() }} {{ 'abc'.replace('', '-') }}",
     "a, b ('a', '=', 'b=c') ('a=b', '=', 'c') x ['a', 'b', 'c'] **ab** -00042 hELLO wORLD They'Re Bill'S SS True -a-b-c-"},
    {"list_methods",
     "{{ [1, 2, 1].count(1) }} {{ [1, 2, 1].index(2) }} {{ (1, 2).index(2) }} {{ [1, 2].copy() }} {{ range(5).index(3) }}",
     "2 1 1 [1, 2] 3"},
    {"for_loop_variables",
     "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}|{{ loop.nextitem }}]{{ loop.cycle('x', 'y') }} {% endfor %}",
     "1032TrueFalse3[|b]x 2121FalseFalse3[a|c]y 3210FalseTrue3[b|]x "},
    {"for_filter_else_break_continue",
     "{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}|{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "1/2:2 2/2:4 |empty|0134"},
    {"for_unpacking",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}",
     "a=1;b=[2];12xy[h][é]"},
    {"loop_changed_and_nested_loops",
     "{% for i in range(4) %}{{ loop.changed(i // 2) }}{% endfor %} {% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }}{% endfor %}",
     "TrueFalseTrueFalse 1x2y11x2y2"},
    {"set_scoping_like_jinja",
     "{% set x = 1 %}{% for i in [1] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}|{% for i in range(3) %}{% if i == 0 %}{% set y = 'a' %}{% endif %}[{{ y }}]{% endfor %}",
     "1213|[a][][]"},
    {"namespace_assignment",
     "{% set ns = namespace(a=1, items=[]) %}{% for x in [1, 2] %}{% set ns.a = ns.a + x %}{% set ns.items = ns.items + [x] %}{% endfor %}{{ ns.a }} {{ ns.items }} {{ ns }} [{{ ns.missing }}]",
     "4 [1, 2] <Namespace {'a': 4, 'items': [1, 2]}> []"},
    {"set_tuple_and_block_set",
     "{% set a, b = 'xy' %}{{ a }}{{ b }}{% set c %}[{{ 1 + 1 }}]{% endset %}{{ c }}{% set t | upper | trim %} hi {% endset %}{{ t }}",
     "xy[2]HI"},
    {"macros_defaults_varargs_kwargs_caller",
     "{% macro g(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ g('A') }} {{ g(greeting='Yo', name='C') }} {% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, a=2) }} {% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %} {% macro each(xs) %}{% for i in xs %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}",
     "Hello, A! Yo, C! (1,){'a': 2} [in] <1><2>"},
    {"macro_recursion",
     "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"filter_with_print_generation_blocks",
     "{% filter upper %}a{{ 'b' }}{% endfilter %} {% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}] {% print 'p', 1 %} {% generation %}G{% endgeneration %}",
     "AB 3[] p1 G"},
    {"globals",
     "{{ range(3)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1) }} {{ dict([['a', 1]], b=2) }} {{ namespace({'x': 1}).x }} {{ strftime_now is defined }} {{ raise_exception is defined }}",
     "[0, 1, 2] [5, 3, 1] {'a': 1} {'a': 1, 'b': 2} 1 True True"},
    {"render_variables",
     "{{ messages }} {{ tools }} {{ documents }} {{ add_generation_prompt }} {{ tools is defined }} {{ bos_token is defined }}",
     "[{'role': 'user', 'content': 'hi'}] None None False True False"},
};

static void test_language_matches_jinja(void) {
    for (size_t i = 0; i < sizeof k_lang / sizeof k_lang[0]; i++) {
        lm_status s;
        char *out = render(k_lang[i].src, NULL, NULL, 0, k_vars, &s);
        if (!out) {
            lt_fail(__FILE__, __LINE__, "%s: %s: %s", k_lang[i].name, lm_status_name(s), lm_last_error());
            continue;
        }
        LT_CHECK_MSG(same_text(k_lang[i].name, out, k_lang[i].want), "%s: output differs from Jinja", k_lang[i].name);
        lm_free(out);
    }
}

static void test_strftime_now_formats_local_time(void) {
    time_t before = time(NULL);
    char *out = render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%%') }}|{{ strftime_now('%z%Z') }}", NULL, NULL, 0,
                       NULL, NULL);
    time_t after = time(NULL);
    char want1[64], want2[64], d[32];
    struct tm tm;
    localtime_r(&before, &tm);
    strftime(d, sizeof d, "%d %b %Y", &tm);
    snprintf(want1, sizeof want1, "%s|%%|", d);
    localtime_r(&after, &tm);
    strftime(d, sizeof d, "%d %b %Y", &tm);
    snprintf(want2, sizeof want2, "%s|%%|", d);
    LT_CHECK(out && (strcmp(out, want1) == 0 || strcmp(out, want2) == 0));
    lm_free(out);
}

/* ---- 2. errors ---------------------------------------------------------------------------------------- */
static void test_unsupported_constructs_are_named_at_parse_time(void) {
    EXPECT_FAIL("{{ 1 }}\n{{ x | wordwrap }}", LM_UNSUPPORTED, "chat template 2:8:", "unsupported filter 'wordwrap'");
    EXPECT_FAIL("{{ x | nosuchfilter }}", LM_PARSE_ERROR, "1:8:", "unknown filter 'nosuchfilter'");
    EXPECT_FAIL("{{ x is escaped }}", LM_UNSUPPORTED, "1:9:", "unsupported test 'escaped'");
    EXPECT_FAIL("{{ x is nosuchtest }}", LM_PARSE_ERROR, "1:9:", "unknown test 'nosuchtest'");
    EXPECT_FAIL("a\n  {% include 'x.j2' %}", LM_UNSUPPORTED, "2:6:", "unsupported tag 'include'");
    EXPECT_FAIL("{% do x.append(1) %}", LM_PARSE_ERROR, "1:4:", "unknown tag 'do'");
    EXPECT_FAIL("{% for x in y recursive %}{% endfor %}", LM_UNSUPPORTED, "1:15:", "recursive");
    EXPECT_FAIL("{{ cycler('a') }}", LM_UNSUPPORTED, "1:4:", "unsupported global function 'cycler'");
    EXPECT_FAIL("{{ foo(1) }}", LM_UNSUPPORTED, "1:4:", "unknown function 'foo'");
    EXPECT_FAIL("{{ f(*args) }}", LM_UNSUPPORTED, "1:6:", "*args");
    EXPECT_FAIL("{% break %}", LM_PARSE_ERROR, "1:4:", "'break' outside a for loop");
    EXPECT_FAIL("{{ '\\N{BULLET}' }}", LM_UNSUPPORTED, "1:5:", "\\N{...}");
    /* a macro or a bound name may be called; so may the globals */
    lm_status s;
    char *out = render("{% macro m() %}M{% endmacro %}{% set f = m %}{{ f() }}{{ range(2)|list }}", NULL, NULL, 0, NULL, &s);
    LT_CHECK(out && strcmp(out, "M[0, 1]") == 0);
    lm_free(out);
}

static void test_syntax_errors_name_the_position(void) {
    EXPECT_FAIL("{{ x", LM_PARSE_ERROR, "1:5:", "expected '}}'");
    EXPECT_FAIL("ok\n{% if x %}\nyes", LM_PARSE_ERROR, "the 'if' at 2:4 is not closed", "'endif'");
    EXPECT_FAIL("{% for x in y %}{% endif %}", LM_PARSE_ERROR, "1:20:", "'endif'");
    EXPECT_FAIL("{# unterminated", LM_PARSE_ERROR, "1:1:", "end of comment");
    EXPECT_FAIL("{{ 'abc }}", LM_PARSE_ERROR, "1:4:", "unterminated string");
    EXPECT_FAIL("{% raw %}never closed", LM_PARSE_ERROR, "1:1:", "endraw");
    EXPECT_FAIL("{{ (1 + 2 }}", LM_PARSE_ERROR, "1:11:", "unexpected '}'");
    EXPECT_FAIL("{{ 1 + }}", LM_PARSE_ERROR, "1:8:", "unexpected '}}'");
    EXPECT_FAIL("{% set 1 = 2 %}", LM_PARSE_ERROR, "1:8:", "cannot assign");
    EXPECT_FAIL("{% macro m(a=1, b) %}{% endmacro %}", LM_PARSE_ERROR, "1:17:", "non-default argument");
    EXPECT_FAIL("{{ x is is }}", LM_PARSE_ERROR, "1:9:", "");
    EXPECT_FAIL("{% endfor %}", LM_PARSE_ERROR, "1:4:", "endfor");
    EXPECT_FAIL("{% %}", LM_PARSE_ERROR, "1:4:", "tag name");
    EXPECT_FAIL("{{ 99999999999999999999 }}", LM_UNSUPPORTED, "1:4:", "64 bits");
    EXPECT_FAIL("{{ 1 ! 2 }}", LM_PARSE_ERROR, "1:6:", "unexpected character '!'");
}

static void test_render_errors_carry_the_message(void) {
    /* raise_exception: the template's message verbatim, at the call's position */
    EXPECT_FAIL("{% if messages|length < 5 %}\n  {{- raise_exception('Need at least ' ~ 5 ~ ' messages!') }}\n{% endif %}",
                LM_INVALID_ARGUMENT, "chat template 2:7: Need at least 5 messages!", NULL);
    /* Python's wording for type errors and Jinja's for Undefined */
    EXPECT_FAIL("{{ 'a' + none }}", LM_INVALID_ARGUMENT, "1:4:", "can only concatenate str (not \"NoneType\") to str");
    EXPECT_FAIL("{{ x.y }}", LM_INVALID_ARGUMENT, "1:4:", "'x' is undefined");
    EXPECT_FAIL("{{ messages[0].nope + 1 }}", LM_INVALID_ARGUMENT, "1:4:", "'dict object' has no attribute 'nope'");
    EXPECT_FAIL("{{ messages[3].role }}", LM_INVALID_ARGUMENT, "1:4:", "list object has no element 3");
    EXPECT_FAIL("{{ 1 // 0 }}", LM_INVALID_ARGUMENT, "1:4:", "integer division or modulo by zero");
    EXPECT_FAIL("{{ [1].append(2) }}", LM_INVALID_ARGUMENT, "1:4:", "access to attribute 'append' of 'list' object is unsafe.");
    EXPECT_FAIL("{% set x = 1 %}{% set x.y = 2 %}", LM_INVALID_ARGUMENT, "1:23:", "non-namespace");
    EXPECT_FAIL("{{ x|tojson }}", LM_INVALID_ARGUMENT, "1:6:", "Object of type Undefined is not JSON serializable");
    /* a method loom does not implement is only seen when it runs */
    EXPECT_FAIL("{% if false %}{{ 'x'.format(1) }}{% endif %}ok{{ '{}'.format(1) }}", LM_UNSUPPORTED, "1:50:",
                "unsupported method str.format()");
}

static void test_bad_inputs_are_refused(void) {
    lm_chat_template *t = NULL;
    char *out = (char *)1;
    LT_CHECK_OK(lm_chat_template_parse("{{ messages[0].content }}", NULL, NULL, &t));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{\"role\": ", NULL, 0, NULL, &out), LM_PARSE_ERROR);
    LT_CHECK(out == NULL && strstr(lm_last_error(), "messages is not valid JSON"));
    LT_CHECK_STATUS(lm_chat_template_render(t, "{\"role\": \"user\"}", NULL, 0, NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "messages must be a JSON array"));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[]", NULL, 0, NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", "{}", 0, NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "tools must be a JSON array"));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, "[1]", &out), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, "{\"messages\": []}", &out), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "'messages'"));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{\"content\": \"a\\u0000b\"}]", NULL, 0, NULL, &out), LM_PARSE_ERROR);
    LT_CHECK_STATUS(lm_chat_template_render(NULL, "[{}]", NULL, 0, NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_render(t, NULL, NULL, 0, NULL, &out), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, NULL), LM_INVALID_ARGUMENT);
    /* tools "null" is None; messages without content render Undefined as "" */
    LT_CHECK_OK(lm_chat_template_render(t, "[{\"role\": \"user\"}]", "null", 0, NULL, &out));
    LT_CHECK(out && out[0] == '\0');
    lm_free(out);
    lm_chat_template_destroy(t);
    LT_CHECK_STATUS(lm_chat_template_parse("ok \xff", NULL, NULL, &t), LM_INVALID_ARGUMENT);
    LT_CHECK(t == NULL && strstr(lm_last_error(), "byte offset 3"));
    LT_CHECK_STATUS(lm_chat_template_parse(NULL, NULL, NULL, &t), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_parse("x", "\xc3", NULL, &t), LM_INVALID_ARGUMENT);
    lm_chat_template_destroy(NULL);
}

static void test_bos_eos_and_extra_variables(void) {
    lm_chat_template *t = NULL;
    char *out = NULL;
    const char *src = "{{ bos_token }}|{{ eos_token is defined }}|{{ enable_thinking }}|{{ date_string }}";
    LT_CHECK_OK(lm_chat_template_parse(src, "<s>", NULL, &t));
    LT_CHECK_OK(lm_chat_template_render(t, "[{}]", NULL, 1, "{\"enable_thinking\": false, \"date_string\": \"1 Jan\"}", &out));
    LT_CHECK(out && strcmp(out, "<s>|False|False|1 Jan") == 0);
    lm_free(out);
    /* extra variables win over the special tokens, as template kwargs do in transformers */
    LT_CHECK_OK(lm_chat_template_render(t, "[{}]", NULL, 1, "{\"bos_token\": \"B\", \"unused\": [1]}", &out));
    LT_CHECK(out && strcmp(out, "B|False||") == 0);
    lm_free(out);
    lm_chat_template_destroy(t);
}

/* ---- 3. hostile templates ----------------------------------------------------------------------------- */
static char *repeat(const char *a, int n, const char *mid, const char *b) {
    size_t la = strlen(a), lm = strlen(mid), lb = strlen(b);
    char *s = malloc(la * (size_t)n + lm + lb * (size_t)n + 1), *p = s;
    for (int i = 0; i < n; i++, p += la) memcpy(p, a, la);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < n; i++, p += lb) memcpy(p, b, lb);
    *p = '\0';
    return s;
}

static void test_deep_nesting_fails_cleanly(void) {
    struct {
        const char *a, *mid, *b;
        int n;
    } nests[] = {
        {"(", "1", ")", 20000},  {"[", "1", "]", 20000},     {"not ", "1", "", 20000}, {"-", "1", "", 20000},
        {"", "1", " + 1", 20000}, {"", "x", ".a", 20000},     {"", "x", "|trim", 20000}, {"1 if ", "1", " else 1", 5000},
    };
    for (size_t i = 0; i < sizeof nests / sizeof nests[0]; i++) {
        char *e = repeat(nests[i].a, nests[i].n, nests[i].mid, nests[i].b);
        size_t n = strlen(e);
        char *src = malloc(n + 8);
        snprintf(src, n + 8, "{{ %s }}", e);
        lm_status s;
        char *out = render(src, NULL, NULL, 0, NULL, &s);
        LT_CHECK_MSG(s == LM_OUT_OF_RANGE || s == LM_PARSE_ERROR, "nest %zu: %s %s", i, lm_status_name(s), lm_last_error());
        lm_free(out);
        free(src);
        free(e);
    }
    char *ifs = repeat("{% if true %}", 5000, "x", "{% endif %}");
    lm_status s;
    char *out = render(ifs, NULL, NULL, 0, NULL, &s);
    LT_CHECK(s == LM_OUT_OF_RANGE && strstr(lm_last_error(), "nested more than"));
    lm_free(out);
    free(ifs);
    char *huge = repeat("x", 1 << 20, "y", "");
    LT_CHECK(!render(huge, NULL, NULL, 0, NULL, &s) && s == LM_OUT_OF_RANGE);
    free(huge);
    /* 90 nested ifs are fine */
    ifs = repeat("{% if true %}", 90, "x", "{% endif %}");
    out = render(ifs, NULL, NULL, 0, NULL, &s);
    LT_CHECK(out && strcmp(out, "x") == 0);
    lm_free(out);
    free(ifs);
}

static void test_limits_stop_runaway_renders(void) {
    EXPECT_FAIL("{% for i in range(10**9) %}{% endfor %}", LM_OUT_OF_RANGE, "1:13:", "Range too big");
    EXPECT_FAIL("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", LM_OUT_OF_RANGE, "LM_CHAT_LIMIT_CALL_DEPTH", NULL);
    EXPECT_FAIL("{{ 'x' * 1000000000 }}", LM_OUT_OF_RANGE, "LM_CHAT_LIMIT_STRING_BYTES", NULL);
    EXPECT_FAIL("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}", LM_OUT_OF_RANGE, "nested", NULL);
    EXPECT_FAIL("{{ range(100000)|unique|list|length }}", LM_OUT_OF_RANGE, "LM_CHAT_LIMIT_WORK", NULL);
    lm_status st;
    char *quick = render("{{ ([] * 1000000000000)|length }}{{ ('' * 1000000000000)|length }}", NULL, NULL, 0, NULL, &st);
    LT_CHECK(quick && strcmp(quick, "00") == 0);
    lm_free(quick);
    lm_chat_template *t = NULL;
    char *out = NULL;
    /* iterations */
    LT_CHECK_OK(lm_chat_template_parse("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                                       NULL, NULL, &t));
    LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_LOOP_ITERATIONS, 10000));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, &out), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "LM_CHAT_LIMIT_LOOP_ITERATIONS"));
    lm_chat_template_destroy(t);
    /* steps: scanning a long string again and again */
    LT_CHECK_OK(lm_chat_template_parse("{% set s = 'x' * 10000000 %}{% for i in range(100000) %}{{ 'y' in s }}{% endfor %}",
                                       NULL, NULL, &t));
    LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_WORK, 1000000));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, &out), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "LM_CHAT_LIMIT_WORK"));
    lm_chat_template_destroy(t);
    /* output size */
    LT_CHECK_OK(lm_chat_template_parse("{% for i in range(100) %}0123456789{% endfor %}", NULL, NULL, &t));
    LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_STRING_BYTES, 500));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, &out), LM_OUT_OF_RANGE);
    LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_STRING_BYTES, 1000));
    LT_CHECK_OK(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, &out));
    LT_CHECK(out && strlen(out) == 1000);
    lm_free(out);
    lm_chat_template_destroy(t);
    /* working memory: quadratic string building */
    LT_CHECK_OK(lm_chat_template_parse("{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                                       "{% set ns.s = ns.s ~ '0123456789' %}{% endfor %}{{ ns.s|length }}",
                                       NULL, NULL, &t));
    LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_MEMORY_BYTES, 8 << 20));
    LT_CHECK_STATUS(lm_chat_template_render(t, "[{}]", NULL, 0, NULL, &out), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "LM_CHAT_LIMIT_MEMORY_BYTES"));
    LT_CHECK_STATUS(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_CALL_DEPTH, 0), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_set_limit(t, (lm_chat_limit)99, 5), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_chat_template_set_limit(NULL, LM_CHAT_LIMIT_CALL_DEPTH, 5), LM_INVALID_ARGUMENT);
    lm_chat_template_destroy(t);
}

static const char k_mutation_fallback[] =
    "{%- set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'user' %}{{ '<u>' + m.content|trim + '</u>' }}"
    "{% elif m.tool_calls %}{% for t in m.tool_calls %}{{ t.function.name }}{{ t.function.arguments|tojson }}{% endfor %}"
    "{% else %}{{ m['content'].split('</think>')[-1] }}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<a>{{ ns.n }}{% endif %}";

static const char k_mutation_messages[] =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\" hi\\n\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>x</think>ok\"},{\"role\":\"assistant\",\"content\":null,"
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"r\"},{\"role\":\"user\",\"content\":\"again\"}]";
/* The same conversation in a shape every real template accepts (no null content). */
static const char k_alloc_messages[] =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\" hi\\n\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>x</think>ok\"},{\"role\":\"assistant\",\"content\":\"\","
    "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"r\"},{\"role\":\"user\",\"content\":\"again\"}]";
static const char k_mutation_tools[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]";

/* Byte mutations of real templates (or a small stand-in) from a fixed seed: every
 * result must parse or fail cleanly, and render or fail cleanly, within limits. */
static void test_mutated_templates_never_crash(void) {
    const char *alphabet = "{}%#-+()[]'\"|.,:=~ \n\tabx0_!<>*/";
    lt_rng rng = lt_rng_seed(20240726);
    char *sources[N_TEMPLATES + 1];
    int nsrc = 0;
    for (int i = 0; i < N_TEMPLATES; i++)
        if ((sources[nsrc] = real_template_source(k_templates[i]))) nsrc++;
    sources[nsrc++] = strdup(k_mutation_fallback);
    int parsed = 0, rendered = 0, iters = 0;
    const int total = 10000;
    time_t start = time(NULL);
    for (; iters < total && time(NULL) - start < 8; iters++) {
        const char *base = sources[iters % nsrc];
        size_t n = strlen(base);
        char *buf = malloc(n + 64);
        memcpy(buf, base, n + 1);
        int edits = 1 + (int)lt_rng_int(&rng, 0, 3);
        for (int k = 0; k < edits && n > 0; k++) {
            size_t pos = (size_t)lt_rng_int(&rng, 0, (int64_t)n - 1);
            int op = (int)lt_rng_int(&rng, 0, 3);
            char ch = alphabet[lt_rng_int(&rng, 0, (int64_t)strlen(alphabet) - 1)];
            if (op == 0) buf[pos] = ch;                                                    /* replace */
            else if (op == 1) memmove(buf + pos, buf + pos + 1, n - pos), n--;             /* delete */
            else if (op == 2) memmove(buf + pos + 1, buf + pos, n - pos + 1), buf[pos] = ch, n++; /* insert */
            else {                                                                        /* duplicate a span */
                size_t len = (size_t)lt_rng_int(&rng, 1, 8);
                if (pos + len > n || n + len + 1 > n + 64 - 8) continue;
                memmove(buf + pos + len, buf + pos, n - pos + 1);
                n += len;
            }
            if (buf[pos] == '\0') buf[pos] = 'x';
        }
        buf[n] = '\0';
        lm_chat_template *t = NULL;
        if (lm_chat_template_parse(buf, "<s>", "</s>", &t) == LM_OK) {
            parsed++;
            LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_LOOP_ITERATIONS, 20000));
            LT_CHECK_OK(lm_chat_template_set_limit(t, LM_CHAT_LIMIT_MEMORY_BYTES, 16 << 20));
            char *out = NULL;
            lm_status s = lm_chat_template_render(t, k_mutation_messages, iters % 2 ? k_mutation_tools : NULL, iters % 3 == 0,
                                                  "{\"enable_thinking\": false, \"date_string\": \"1 Jan 2025\"}", &out);
            LT_CHECK_MSG(s != LM_INTERNAL, "mutation %d: internal error: %s", iters, lm_last_error());
            if (s == LM_OK) rendered++;
            lm_free(out);
            lm_chat_template_destroy(t);
        } else {
            LT_CHECK_MSG(t == NULL, "failed parse left a template");
            LT_CHECK_MSG(strstr(lm_last_error(), "chat template") != NULL, "parse error without position: %s", lm_last_error());
        }
        free(buf);
    }
    printf("  %d mutations (seed 20240726): %d parsed, %d rendered\n", iters, parsed, rendered);
    LT_CHECK(parsed > 0 && rendered > 0);
    for (int i = 0; i < nsrc; i++) free(sources[i]);
}

static void test_allocation_failures_leak_nothing(void) {
    char *src = real_template_source("qwen3");
    const char *source = src ? src : k_mutation_fallback;
    int64_t needed = 0;
    lt_alloc_track(0);
    lm_chat_template *t = NULL;
    char *out = NULL;
    LT_CHECK_OK(lm_chat_template_parse(source, NULL, "<|im_end|>", &t));
    LT_CHECK_OK(lm_chat_template_render(t, k_alloc_messages, k_mutation_tools, 1, "{\"enable_thinking\": false}", &out));
    char *want = out ? strdup(out) : NULL;
    lm_free(out);
    lm_chat_template_destroy(t);
    needed = lt_alloc_count();
    lt_alloc_untrack();
    LT_CHECK(needed > 2);
    for (int64_t k = 1; k <= needed; k++) {
        lt_alloc_track(k);
        t = NULL;
        out = NULL;
        lm_status s = lm_chat_template_parse(source, NULL, "<|im_end|>", &t);
        if (s == LM_OK)
            s = lm_chat_template_render(t, k_alloc_messages, k_mutation_tools, 1, "{\"enable_thinking\": false}", &out);
        LT_CHECK_MSG(s == LM_OK || s == LM_OUT_OF_MEMORY, "fail at %lld: %s %s", (long long)k, lm_status_name(s), lm_last_error());
        if (s == LM_OK) LT_CHECK(want && out && strcmp(out, want) == 0);
        lm_free(out);
        lm_chat_template_destroy(t);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail at %lld: %lld allocations leaked", (long long)k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    free(want);
    free(src);
}

/* ---- 4. loading and threads -------------------------------------------------------------------------- */
static void write_file(const char *dir, const char *name, const char *text) {
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static char *load_and_render(const char *path, const char *name, lm_status *status) {
    lm_chat_template *t = NULL;
    char *out = NULL;
    lm_status s = name ? lm_chat_template_load_named(path, name, &t) : lm_chat_template_load(path, &t);
    if (s == LM_OK) s = lm_chat_template_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", "[]", 1, NULL, &out);
    lm_chat_template_destroy(t);
    *status = s;
    return out;
}

static void test_load_reads_tokenizer_config(void) {
    char dir[] = "/tmp/loom_chat_XXXXXX";
    if (!mkdtemp(dir)) {
        lt_fail(__FILE__, __LINE__, "mkdtemp failed");
        return;
    }
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    lm_status s;
    char *out;
    /* string template, AddedToken bos, string eos */
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"}, \"eos_token\": \"<E>\","
               " \"chat_template\": \"{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}\\n\"}");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_OK && out && strcmp(out, "<B>hi<E>") == 0);
    lm_free(out);
    out = load_and_render(cfg, NULL, &s); /* the file itself */
    LT_CHECK(s == LM_OK && out && strcmp(out, "<B>hi<E>") == 0);
    lm_free(out);
    /* list form: "default" and a named one */
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": null, \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ bos_token is defined }}\"},"
               " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_OK && out && strcmp(out, "DFalse") == 0);
    lm_free(out);
    out = load_and_render(dir, "tool_use", &s);
    LT_CHECK(s == LM_OK && out && strcmp(out, "T0") == 0);
    lm_free(out);
    out = load_and_render(dir, "rag", &s);
    LT_CHECK(s == LM_NOT_FOUND && strstr(lm_last_error(), "'rag'"));
    /* chat_template.jinja wins over tokenizer_config.json */
    write_file(dir, "chat_template.jinja", "J{{ eos_token }}\n");
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<E>\", \"chat_template\": \"C\"}");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_OK && out && strcmp(out, "J<E>") == 0);
    lm_free(out);
    char jpath[512];
    snprintf(jpath, sizeof jpath, "%s/additional_chat_templates", dir);
    mkdir(jpath, 0700);
    write_file(jpath, "tool_use.jinja", "TU");
    out = load_and_render(dir, "tool_use", &s);
    LT_CHECK(s == LM_OK && out && strcmp(out, "TU") == 0);
    lm_free(out);
    out = load_and_render(dir, "../tool_use", &s);
    LT_CHECK(s == LM_INVALID_ARGUMENT);
    snprintf(jpath, sizeof jpath, "%s/additional_chat_templates/tool_use.jinja", dir);
    unlink(jpath);
    snprintf(jpath, sizeof jpath, "%s/additional_chat_templates", dir);
    rmdir(jpath);
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    unlink(jpath);
    /* no template; bad JSON; a template with an error names the file */
    write_file(dir, "tokenizer_config.json", "{\"eos_token\": \"<E>\"}");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_NOT_FOUND && strstr(lm_last_error(), "no \"chat_template\""));
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": ");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_PARSE_ERROR);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": \"{{ x | wordwrap }}\"}");
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_UNSUPPORTED && strstr(lm_last_error(), "tokenizer_config.json") && strstr(lm_last_error(), "wordwrap"));
    unlink(cfg);
    out = load_and_render(dir, NULL, &s);
    LT_CHECK(s == LM_IO_ERROR);
    rmdir(dir);
    lm_chat_template *t = NULL;
    LT_CHECK_STATUS(lm_chat_template_load("/nonexistent/dir/x.json", &t), LM_IO_ERROR);
    LT_CHECK_STATUS(lm_chat_template_load(NULL, &t), LM_INVALID_ARGUMENT);
}

typedef struct thread_arg {
    const lm_chat_template *t;
    const char *want;
    int ok;
} thread_arg;

static void *render_many(void *p) {
    thread_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200 && a->ok; i++) {
        char *out = NULL;
        if (lm_chat_template_render(a->t, k_mutation_messages, k_mutation_tools, 1, NULL, &out) != LM_OK ||
            strcmp(out, a->want) != 0)
            a->ok = 0;
        lm_free(out);
    }
    return NULL;
}

static void test_concurrent_renders_agree(void) {
    lm_chat_template *t = NULL;
    char *want = NULL;
    LT_CHECK_OK(lm_chat_template_parse(k_mutation_fallback, NULL, NULL, &t));
    LT_CHECK_OK(lm_chat_template_render(t, k_mutation_messages, k_mutation_tools, 1, NULL, &want));
    if (!want) return;
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, want, 0};
        pthread_create(&th[i], NULL, render_many, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        LT_CHECK(args[i].ok);
    }
    lm_free(want);
    lm_chat_template_destroy(t);
}

/* ---- 5. the real templates ----------------------------------------------------------------------------- */
/* The error a real template raised in transformers must be an error here too; its own
 * raise_exception message (error_type TemplateError) must be carried verbatim. */
static void check_case(const char *name, const lm_chat_template *t, json_t *conv, json_t *extra_all, json_t *expected) {
    const char *id = json_string_value(json_object_get(conv, "id"));
    json_t *want = json_object_get(expected, id);
    if (!want) return; /* not rendered for this template */
    char *messages = json_dumps(json_object_get(conv, "messages"), JSON_COMPACT);
    json_t *tools_j = json_object_get(conv, "tools");
    char *tools = tools_j ? json_dumps(tools_j, JSON_COMPACT) : NULL;
    json_t *extra = json_deep_copy(json_object_get(extra_all, name));
    if (!extra) extra = json_object();
    json_object_update(extra, json_object_get(conv, "extra"));
    char *extra_s = json_dumps(extra, JSON_COMPACT);
    int agp = json_is_true(json_object_get(conv, "add_generation_prompt"));
    char *out = NULL;
    lm_status s = lm_chat_template_render(t, messages, tools, agp, extra_s, &out);
    const char *text = json_string_value(json_object_get(want, "text"));
    char what[160];
    snprintf(what, sizeof what, "%s/%s", name, id);
    if (text) {
        if (s != LM_OK) lt_fail(__FILE__, __LINE__, "%s: %s: %s", what, lm_status_name(s), lm_last_error());
        else LT_CHECK_MSG(same_text(what, out, text), "%s: output differs from transformers", what);
    } else {
        const char *msg = json_string_value(json_object_get(want, "error"));
        const char *type = json_string_value(json_object_get(want, "error_type"));
        if (s == LM_OK) {
            lt_fail(__FILE__, __LINE__, "%s: rendered, but transformers raised %s: %s", what, type ? type : "?", msg ? msg : "");
        } else if (type && strcmp(type, "TemplateError") == 0) {
            LT_CHECK_MSG(msg && strstr(lm_last_error(), msg), "%s: error '%s' lacks the template's message '%s'", what,
                         lm_last_error(), msg ? msg : "");
        } else if (msg && !strstr(lm_last_error(), msg)) {
            printf("  note %s: transformers raised %s: %s; loom: %s\n", what, type ? type : "?", msg, lm_last_error());
        }
    }
    lm_free(out);
    free(messages);
    free(tools);
    free(extra_s);
    json_decref(extra);
}

static void test_real_templates_match_transformers(void) {
    json_error_t err;
    json_t *spec = json_load_file("tests/data/chat/conversations.json", 0, &err);
    if (!spec) {
        lt_fail(__FILE__, __LINE__, "tests/data/chat/conversations.json: %s", err.text);
        return;
    }
    json_t *convs = json_object_get(spec, "conversations"), *extra_all = json_object_get(spec, "template_extra");
    int compared = 0;
    for (int i = 0; i < N_TEMPLATES; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/data/chat/expected_%s.json", k_templates[i]);
        json_t *exp = json_load_file(path, 0, &err);
        json_t *cases = json_object_get(exp, "cases");
        if (!cases) {
            lt_fail(__FILE__, __LINE__, "%s: %s", path, exp ? "no \"cases\"" : err.text);
            json_decref(exp);
            continue;
        }
        snprintf(path, sizeof path, "third_party/tokenizers/%s", k_templates[i]);
        lm_chat_template *t = NULL;
        LT_CHECK_OK(lm_chat_template_load(path, &t));
        if (t) {
            size_t k;
            json_t *conv;
            json_array_foreach(convs, k, conv) check_case(k_templates[i], t, conv, extra_all, cases);
            compared += (int)json_object_size(cases);
        }
        printf("  %s: %zu cases (%s)\n", k_templates[i], json_object_size(cases),
               json_string_value(json_object_get(exp, "generator")));
        lm_chat_template_destroy(t);
        json_decref(exp);
    }
    LT_CHECK(compared >= 50);
    json_decref(spec);
}

static void test_llama3_2_without_date_string_uses_today(void) {
    lm_chat_template *t = NULL;
    LT_CHECK_OK(lm_chat_template_load("third_party/tokenizers/llama3_2", &t));
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char today[64], *out = NULL;
    strftime(today, sizeof today, "Today Date: %d %b %Y", &tm);
    LT_CHECK_OK(lm_chat_template_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 1, NULL, &out));
    LT_CHECK(out && strstr(out, today));
    lm_free(out);
    lm_chat_template_destroy(t);
}

int main(void) {
    LT_RUN(test_language_matches_jinja);
    LT_RUN(test_strftime_now_formats_local_time);
    LT_RUN(test_unsupported_constructs_are_named_at_parse_time);
    LT_RUN(test_syntax_errors_name_the_position);
    LT_RUN(test_render_errors_carry_the_message);
    LT_RUN(test_bad_inputs_are_refused);
    LT_RUN(test_bos_eos_and_extra_variables);
    LT_RUN(test_deep_nesting_fails_cleanly);
    LT_RUN(test_limits_stop_runaway_renders);
    LT_RUN(test_mutated_templates_never_crash);
    LT_RUN(test_allocation_failures_leak_nothing);
    LT_RUN(test_load_reads_tokenizer_config);
    LT_RUN(test_concurrent_renders_agree);
    if (!real_files_present()) {
        if (lt_finish() != 0) return 1;
        lt_skip("third_party/tokenizers/{qwen2_5,qwen3,llama3,llama3_2,deepseek_v3}/tokenizer_config.json absent: run "
                "scripts/fetch_tokenizers.sh to compare the real chat templates with transformers");
    }
    LT_RUN(test_real_templates_match_transformers);
    LT_RUN(test_llama3_2_without_date_string_uses_today);
    return lt_finish();
}
