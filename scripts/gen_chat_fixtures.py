#!/usr/bin/env python3
"""gen_chat_fixtures.py — the expected renderings that tests/chat/test_chat_template.c
compares loom's chat template interpreter with.

For every template named in tests/data/chat/conversations.json it loads the model
directory third_party/tokenizers/<name> (tokenizer.json + tokenizer_config.json, as
scripts/fetch_tokenizers.sh leaves them) and renders every conversation:

    apply_chat_template(messages, tools=tools, add_generation_prompt=...,
                        tokenize=False, **extra)

where extra is the conversation's "extra" over the file's template_extra[<name>]. It
writes tests/data/chat/expected_<name>.json:

    {"generator": "...", "template": "<name>",
     "cases": {"<conversation id>": {"text": "..."}
                                  | {"error": "<message>", "error_type": "TemplateError"}}}

A conversation whose rendering raises is recorded as an error: error_type
"TemplateError" is the template's own raise_exception (the test requires loom's error
to carry the same message); other types (TypeError, UndefinedError, ...) only require
loom to fail too.

Modes:
  (default)      transformers: AutoTokenizer.from_pretrained(dir, local_files_only=True),
                 no network. THE COMMITTED FIXTURES COME FROM THIS MODE (transformers 5.x).
  --jinja-only   a development stand-in for machines without transformers: Jinja2 in an
                 environment rebuilt the way transformers builds it (ImmutableSandbox,
                 trim_blocks, lstrip_blocks, loop controls, a pass-through {% generation %}
                 tag, transformers' tojson / raise_exception / strftime_now, the special
                 tokens of tokenizer_config.json as variables). Its files are stand-ins
                 until the transformers mode regenerates them.

Usage: python3 scripts/gen_chat_fixtures.py [--jinja-only] [--root DIR] [--out DIR]
                                            [--templates qwen3,llama3,...]
Each case is rendered on its own (an exception never stops the run); a summary per
template is printed, and the exit status is 1 when a template could not be loaded.
"""
import argparse
import copy
import json
import os
import sys
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def token_text(v):
    """A special token of tokenizer_config.json: a string or an AddedToken object."""
    if isinstance(v, dict):
        return v.get("content")
    return v if isinstance(v, str) else None


# ---- transformers mode ---------------------------------------------------------------------
def transformers_renderer(model_dir):
    import transformers
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # a tokenizer class transformers cannot build: the fast one from tokenizer.json
        print(f"  AutoTokenizer failed ({type(e).__name__}: {e}); trying PreTrainedTokenizerFast", file=sys.stderr)
        tok = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir, local_files_only=True)

    def render(messages, tools, add_generation_prompt, extra):
        kwargs = dict(add_generation_prompt=add_generation_prompt, tokenize=False, **extra)
        if tools is not None:
            kwargs["tools"] = tools
        try:
            out = tok.apply_chat_template(messages, return_dict=False, **kwargs)
        except TypeError as e:
            if "return_dict" not in str(e):
                raise
            out = tok.apply_chat_template(messages, **kwargs)
        if not isinstance(out, str):
            raise RuntimeError(f"apply_chat_template returned {type(out).__name__}, not str")
        return out

    return render, f"transformers {transformers.__version__}"


# ---- --jinja-only mode ---------------------------------------------------------------------
def jinja_renderer(model_dir):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """{% generation %}...{% endgeneration %}: transformers tracks the span; the text is the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    source = cfg.get("chat_template")
    if isinstance(source, list):
        source = {t["name"]: t["template"] for t in source}.get("default")
    jinja_file = os.path.join(model_dir, "chat_template.jinja")
    if os.path.isfile(jinja_file):
        with open(jinja_file, encoding="utf-8") as f:
            source = f.read()
    if not isinstance(source, str):
        raise RuntimeError(f"{model_dir}: no chat_template")
    special = {k: token_text(cfg.get(k)) for k in SPECIAL_KEYS}
    special = {k: v for k, v in special.items() if v is not None}
    if cfg.get("additional_special_tokens"):
        special["additional_special_tokens"] = [token_text(t) for t in cfg["additional_special_tokens"]]

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)

    def render(messages, tools, add_generation_prompt, extra):
        kwargs = {**special, **extra}
        return template.render(messages=messages, tools=tools, documents=None,
                               add_generation_prompt=add_generation_prompt, **kwargs)

    return render, f"jinja2 {jinja2.__version__} (--jinja-only: transformers' environment rebuilt; a stand-in)"


# ---- driver ------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jinja-only", action="store_true", help="render with Jinja2 only (development stand-in)")
    ap.add_argument("--root", default=ROOT, help="repository root (default: this script's)")
    ap.add_argument("--out", default=None, help="output directory (default: <root>/tests/data/chat)")
    ap.add_argument("--templates", default=None, help="comma-separated subset of the templates")
    args = ap.parse_args()

    data_dir = os.path.join(args.root, "tests", "data", "chat")
    out_dir = args.out or data_dir
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(data_dir, "conversations.json"), encoding="utf-8") as f:
        spec = json.load(f)
    names = args.templates.split(",") if args.templates else spec["templates"]
    failed_templates = []
    for name in names:
        model_dir = os.path.join(args.root, "third_party", "tokenizers", name)
        print(f"{name}: {model_dir}")
        try:
            render, generator = (jinja_renderer if args.jinja_only else transformers_renderer)(model_dir)
        except Exception as e:
            print(f"  cannot load: {type(e).__name__}: {e}")
            failed_templates.append(name)
            continue
        cases, n_text, n_error = {}, 0, 0
        for conv in spec["conversations"]:
            if "templates" in conv and name not in conv["templates"]:
                continue
            extra = {**spec.get("template_extra", {}).get(name, {}), **conv.get("extra", {})}
            try:
                text = render(copy.deepcopy(conv["messages"]), copy.deepcopy(conv.get("tools")),
                              bool(conv.get("add_generation_prompt", False)), copy.deepcopy(extra))
                cases[conv["id"]] = {"text": text}
                n_text += 1
            except Exception as e:  # the template raised: that is the expected outcome
                cases[conv["id"]] = {"error": str(e), "error_type": type(e).__name__}
                n_error += 1
                print(f"  {conv['id']}: {type(e).__name__}: {e}")
        out = {"generator": generator, "template": name, "cases": cases}
        path = os.path.join(out_dir, f"expected_{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"  wrote {path}: {n_text} renderings, {n_error} errors ({generator})")
    if failed_templates:
        print(f"could not load: {', '.join(failed_templates)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
