#!/usr/bin/env python3
"""Reference logits and greedy continuations from Hugging Face transformers for loom's model tests.

Usage: gen_model_refs.py [--models DIR] [--only NAME ...] [--out DIR] [--device auto|cpu|cuda]
       gen_model_refs.py --check-files        (numpy only: checkpoints vs config, prompts)
For every model directory tests/data/models/<name> (scripts/make_reference_models.sh) it loads
AutoModelForCausalLM in float32 with eager attention (TF32 off, matmul precision "highest"), runs
three fixed prompts (PROMPT_LENGTHS ids drawn from a seeded RNG below the vocabulary) and records,
in <name>/refs.lmfx (scripts/lmfx.py): promptK_ids [T], promptK_logits [T, V] (every position),
promptK_greedy [S] (model.generate, greedy, S new tokens, never stopping at an eos), promptK_margin
[S] (best minus second-best logit at each greedy step: tests trust a decision only when its margin
exceeds their tolerance) and prompt0_greedy_logits [S, V] (the KV-cache decode steps' logits).
<name>/refs.json holds versions, device and the checks below. Without --out the files go into the
model directories; with --out DIR everything goes into DIR/model_refs.tar (paths relative to the
repository root: `tar -xf model_refs.tar -C <repo>`) plus DIR/model_refs_summary.json.
Checks, each failing the run (exit 1, outputs still written, the summary names the problem): the
loading info reports no missing/unexpected/mismatched key; every parameter equals the checkpoint
value read back here (lm_head equals the embedding when tied); all parameters are float32;
generate's tokens equal a cache-free recompute loop's; the official safetensors reader (when
installed) agrees with ours. Runs where torch + transformers are installed (the GPU machine).
"""
import argparse
import json
import os
import sys
import tarfile
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import lmfx  # noqa: E402
from make_random_model import read_checkpoint, tensor_specs  # noqa: E402

PROMPT_LENGTHS = (12, 1, 40)
PROMPT_SEED = 20250
NEW_TOKENS = 16
NEAR_TIE = 1e-3


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=os.path.join(ROOT, "tests", "data", "models"),
                   help="folder of model directories (default tests/data/models)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="just these model directories")
    p.add_argument("--out", help="write DIR/model_refs.tar + DIR/model_refs_summary.json instead of in place")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="greedy steps per prompt")
    p.add_argument("--check-files", action="store_true",
                   help="only check the checkpoints against their configs and print the prompts (numpy only)")
    a = p.parse_args(argv)
    if a.new_tokens < 1:
        p.error("--new-tokens must be positive")
    return a


def discover(models_dir, only):
    """-> sorted names of subdirectories holding a config.json (restricted to `only`)."""
    if not os.path.isdir(models_dir):
        raise SystemExit(f"{models_dir}: no such folder (run scripts/make_reference_models.sh)")
    names = sorted(n for n in os.listdir(models_dir) if os.path.isfile(os.path.join(models_dir, n, "config.json")))
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            raise SystemExit(f"--only: no model directory named {missing} in {models_dir}")
        names = [n for n in names if n in only]
    if not names:
        raise SystemExit(f"{models_dir}: no model directories")
    return names


def read_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def prompt_ids(k, length, vocab):
    """Prompt k: `length` ids uniform below `vocab`, from a seed fixed per prompt index."""
    return np.random.default_rng(PROMPT_SEED + k).integers(0, vocab, size=length, dtype=np.int64)


def check_checkpoint(model_dir, cfg):
    """Checkpoint tensors vs the names/shapes the config implies -> (tensors, problems)."""
    tensors = read_checkpoint(model_dir)
    want = {name: shape for name, shape, _ in tensor_specs(cfg)}
    problems = [f"tensor {n!r} missing from the checkpoint" for n in sorted(set(want) - set(tensors))]
    problems += [f"unexpected tensor {n!r} in the checkpoint" for n in sorted(set(tensors) - set(want))]
    for name in sorted(set(want) & set(tensors)):
        if tuple(tensors[name][1]) != tuple(want[name]):
            problems.append(f"tensor {name!r}: shape {list(tensors[name][1])} != expected {list(want[name])}")
    return tensors, problems


def top2_margin(step_logits):
    """[S, V] -> [S] best minus second-best logit."""
    part = np.sort(np.asarray(step_logits, dtype=np.float64), axis=-1)
    return part[:, -1] - part[:, -2]


def setup_torch(device_arg):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    if device_arg == "cuda" or (device_arg == "auto" and torch.cuda.is_available()):
        dev = torch.device("cuda")
        return torch, dev, f"cuda ({torch.cuda.get_device_name(0)})"
    return torch, torch.device("cpu"), "cpu"


def version_at_least(version, major, minor):
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return tuple(parts) >= (major, minor)


def load_model(torch, transformers, model_dir, device):
    """-> (model, loading-info dict). transformers >= 4.56 takes `dtype`, older ones `torch_dtype`."""
    key = "dtype" if version_at_least(transformers.__version__, 4, 56) else "torch_dtype"
    kwargs = {key: torch.float32, "attn_implementation": "eager"}
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True, **kwargs)
    except TypeError:  # no loading info in this version: the parameter-by-parameter check still runs
        model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, **kwargs), {}
    model.to(device)
    model.eval()
    listed = {}
    for field, value in info.items():
        if isinstance(value, (list, tuple, set, frozenset)):
            listed[field] = sorted(str(x) for x in value)
        elif field != "error_msgs":
            listed[field] = str(value)
    return model, listed


def check_loaded(torch, model, tensors, cfg, info):
    """Loaded parameters vs the checkpoint -> problems."""
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = [k for k in info.get(key, []) if not (cfg["tie_word_embeddings"] and k == "lm_head.weight")]
        if keys:
            problems.append(f"loading info {key}: {keys}")
    buffers = {n for n, _ in model.named_buffers()}
    state = {n: v for n, v in model.state_dict().items() if n not in buffers}
    for name, value in state.items():
        if value.is_floating_point() and value.dtype != torch.float32:
            problems.append(f"parameter {name!r} is {value.dtype}, not float32")
        src = name
        if name not in tensors:
            if name == "lm_head.weight" and cfg["tie_word_embeddings"]:
                src = "model.embed_tokens.weight"
            else:
                problems.append(f"parameter {name!r} has no checkpoint tensor (initialised at random)")
                continue
        got = value.detach().float().cpu().numpy()
        if got.shape != tensors[src][2].shape or not np.array_equal(got, tensors[src][2]):
            problems.append(f"parameter {name!r} differs from checkpoint tensor {src!r}")
    problems += [f"checkpoint tensor {n!r} is not a model parameter" for n in sorted(set(tensors) - set(state))]
    return problems


def check_official_reader(model_dir, tensors):
    """Our reader vs safetensors.torch.load_file -> (status string, problems)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        return "not installed", []
    problems, seen = [], set()
    for fname in sorted(os.listdir(model_dir)):
        if not fname.endswith(".safetensors"):
            continue
        for name, value in load_file(os.path.join(model_dir, fname)).items():
            seen.add(name)
            if name not in tensors or not np.array_equal(value.float().numpy(), tensors[name][2]):
                problems.append(f"{fname}: tensor {name!r} reads differently with the safetensors library")
    if seen != set(tensors):
        problems.append("safetensors library sees a different tensor set")
    return ("agrees" if not problems else "DISAGREES"), problems


def greedy_generate(torch, model, x, steps, never):
    """model.generate greedy -> (tokens [S], step logits [S, V]). `never` is an id past the
    vocabulary, used as eos and pad so decoding never stops early and never pads."""
    model.generation_config.eos_token_id = never
    model.generation_config.pad_token_id = never
    kwargs = dict(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, num_beams=1,
                  max_new_tokens=steps, eos_token_id=never, pad_token_id=never, return_dict_in_generate=True)
    try:
        out = model.generate(output_logits=True, **kwargs)
        steps_logits = out.logits
    except (TypeError, ValueError):
        out = model.generate(output_scores=True, **kwargs)
        steps_logits = out.scores
    tokens = out.sequences[0, x.shape[1]:].cpu().numpy().astype(np.int64)
    logits = torch.stack([s[0] for s in steps_logits]).double().cpu().numpy()
    return tokens, logits


def greedy_recompute(torch, model, x, steps):
    """Greedy decoding by re-running the whole sequence each step (no KV cache)."""
    seq, tokens, logits = x, [], []
    for _ in range(steps):
        last = model(input_ids=seq).logits[0, -1]
        nxt = int(torch.argmax(last))
        tokens.append(nxt)
        logits.append(last.double().cpu().numpy())
        seq = torch.cat([seq, torch.tensor([[nxt]], dtype=seq.dtype, device=seq.device)], dim=1)
    return np.array(tokens, dtype=np.int64), np.stack(logits)


def run_prompt(torch, model, ids, steps, vocab, device):
    """One prompt -> (lmfx tensors without the prefix, report dict, problems)."""
    x = torch.tensor(ids[None, :], dtype=torch.long, device=device)
    with torch.no_grad():
        logits = model(input_ids=x).logits[0].double().cpu().numpy()
        ref_tokens, ref_logits = greedy_recompute(torch, model, x, steps)
        problems, source = [], "generate"
        try:
            tokens, step_logits = greedy_generate(torch, model, x, steps, vocab)
        except Exception as e:  # report the failure and fall back on the recompute loop
            problems.append(f"generate failed: {type(e).__name__}: {e}")
            tokens, step_logits, source = ref_tokens, ref_logits, "recompute"
    if len(tokens) != steps or step_logits.shape != (steps, vocab):
        problems.append(f"generate returned {len(tokens)} tokens / logits {step_logits.shape}, wanted {steps}")
        tokens, step_logits, source = ref_tokens, ref_logits, "recompute"
    agree = bool(np.array_equal(tokens, ref_tokens))
    if not agree:
        problems.append(f"generate {tokens.tolist()} != recompute {ref_tokens.tolist()}")
    if not np.array_equal(np.argmax(step_logits, axis=-1), tokens):
        problems.append("greedy tokens are not the argmax of their step logits")
    # Step logits are comparable up to and including the first step whose tokens differ:
    # until then both loops saw the same context.
    differ = np.nonzero(tokens != ref_tokens)[0]
    upto = int(differ[0]) + 1 if len(differ) else steps
    cache_diff = float(np.max(np.abs(step_logits[:upto] - ref_logits[:upto])))
    margin = top2_margin(step_logits)
    tensors = {"ids": ids, "logits": logits, "greedy": tokens, "margin": margin, "greedy_logits": step_logits}
    report = {"length": int(len(ids)), "greedy_source": source, "generate_matches_recompute": agree,
              "cache_vs_recompute_max_abs": cache_diff, "min_margin": float(margin.min()),
              "logit_std": float(logits.std()), "logit_max_abs": float(np.abs(logits).max())}
    return tensors, report, problems


def run_model(torch, transformers, name, model_dir, device, device_name, steps):
    """-> (lmfx tensors, refs.json dict)."""
    cfg = read_config(model_dir)
    tensors, problems = check_checkpoint(model_dir, cfg)
    reader_status, reader_problems = check_official_reader(model_dir, tensors)
    problems += reader_problems
    model, info = load_model(torch, transformers, model_dir, device)
    problems += check_loaded(torch, model, tensors, cfg, info)
    out, prompts = {}, []
    for k, length in enumerate(PROMPT_LENGTHS):
        ids = prompt_ids(k, length, cfg["vocab_size"])
        t, report, p = run_prompt(torch, model, ids, steps, cfg["vocab_size"], device)
        problems += [f"prompt{k}: {msg}" for msg in p]
        for key in ("ids", "logits", "greedy", "margin"):
            out[f"prompt{k}_{key}"] = t[key]
        if k == 0:
            out["prompt0_greedy_logits"] = t["greedy_logits"]
        prompts.append(report)
    refs = {"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
            "device": device_name, "compute_dtype": "float32", "attn_implementation": "eager", "tf32": False,
            "prompt_seed": PROMPT_SEED, "new_tokens": steps, "prompts": prompts, "loading_info": info,
            "safetensors_library": reader_status, "problems": problems}
    return out, refs


def table(rows):
    head = ("model", "arch", "V", "margins p0/p1/p2", "cache-recompute", "greedy", "problems")
    lines = [head] + [(r["model"], r["arch"], str(r["vocab"]),
                       "/".join(f"{p['min_margin']:.3g}" for p in r["prompts"]),
                       f"{max(p['cache_vs_recompute_max_abs'] for p in r['prompts']):.2e}",
                       "ok" if all(p["generate_matches_recompute"] for p in r["prompts"]) else "DIFFERS",
                       str(len(r["problems"]))) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)


def check_files(args, names):
    bad = 0
    for name in names:
        d = os.path.join(args.models, name)
        cfg = read_config(d)
        tensors, problems = check_checkpoint(d, cfg)
        bad += bool(problems)
        prompts = " ".join(f"p{k}={prompt_ids(k, n, cfg['vocab_size'])[:4].tolist()}..."
                           for k, n in enumerate(PROMPT_LENGTHS))
        print(f"{name}: {cfg['model_type']} {len(tensors)} tensors {'OK' if not problems else problems} {prompts}")
    return 1 if bad else 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = discover(args.models, args.only)
    if args.check_files:
        return check_files(args, names)
    torch, device, device_name = setup_torch(args.device)
    import transformers
    rows, outputs = [], []
    for name in names:
        d = os.path.join(args.models, name)
        tensors, refs = run_model(torch, transformers, name, d, device, device_name, args.new_tokens)
        cfg = read_config(d)
        rows.append(dict(refs, arch=cfg["model_type"], vocab=cfg["vocab_size"]))
        outputs.append((name, tensors, refs))
    write_outputs(args, outputs)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {device_name}")
    print(table(rows))
    for r in rows:
        for msg in r["problems"]:
            print(f"PROBLEM {r['model']}: {msg}")
    near = [(r["model"], k) for r in rows for k, p in enumerate(r["prompts"]) if p["min_margin"] < NEAR_TIE]
    if near:
        print(f"note: greedy steps closer than {NEAR_TIE} (near-ties) in {near}")
    return 1 if any(r["problems"] for r in rows) else 0


def write_outputs(args, outputs):
    """In place (model directories) or one tar + summary under --out."""
    if not args.out:
        for name, tensors, refs in outputs:
            d = os.path.join(args.models, name)
            lmfx.write(os.path.join(d, "refs.lmfx"), tensors)
            with open(os.path.join(d, "refs.json"), "w") as f:
                json.dump(refs, f, indent=1)
                f.write("\n")
        return
    os.makedirs(args.out, exist_ok=True)
    rel = os.path.relpath(os.path.abspath(args.models), ROOT)
    if rel.startswith(".."):
        rel = os.path.join("tests", "data", "models")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(os.path.join(args.out, "model_refs.tar"), "w") as tar:
        for name, tensors, refs in outputs:
            lmfx.write(os.path.join(tmp, f"{name}.lmfx"), tensors)
            with open(os.path.join(tmp, f"{name}.json"), "w") as f:
                json.dump(refs, f, indent=1)
                f.write("\n")
            tar.add(os.path.join(tmp, f"{name}.lmfx"), arcname=os.path.join(rel, name, "refs.lmfx"))
            tar.add(os.path.join(tmp, f"{name}.json"), arcname=os.path.join(rel, name, "refs.json"))
    with open(os.path.join(args.out, "model_refs_summary.json"), "w") as f:
        json.dump([refs for _, _, refs in outputs], f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
