#!/bin/sh
# The recipe of loom's default model (models/default): corpus -> tokenizer -> token
# shards -> training on one NVIDIA GPU -> bf16 export -> evaluation. docs/DEFAULT_MODEL.md
# describes the data, the model and the results.
#
#   scripts/train_default_model.sh [--stages LIST] [--loom BIN] [--work DIR] [--out DIR]
#
# Stages (comma-separated, in this order; default: all of them):
#   corpus     build/corpus/{train,valid}.txt with scripts/prepare_corpus.sh (network)
#   tokenizer  byte-level BPE, 8,192 tokens, <|endoftext|> as id 0 -> WORK/tokenizer.json
#   data       token shards WORK/train.bin and WORK/valid.bin
#   train      loom train --device cuda from scripts/default_model/config.json -> WORK/run
#   export     the checkpoint with the lowest validation loss, as bf16, with the tokenizer
#              and the files of scripts/default_model -> OUT
#   evaluate   validation loss and perplexity of OUT (WORK/eval.json), sample
#              continuations (WORK/samples.txt), the loss curve (WORK/loss.svg)
# The corpus, tokenizer and data stages run on any machine (the corpus needs the
# network); train needs a CUDA build of loom and a GPU (about 2.5 minutes on an H200).
# Everything is seeded: the tokenizer and shards are identical on every machine, and the
# training run is deterministic on a given GPU and build.
set -eu
cd "$(dirname "$0")/.."

stages=corpus,tokenizer,data,train,export,evaluate
loom=build/release/loom
work=build/default-model
out=models/default
while [ $# -gt 0 ]; do
  case $1 in
    --stages) stages=$2; shift 2 ;;
    --loom) loom=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "train_default_model.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for s in $(echo "$stages" | tr ',' ' '); do
  case $s in corpus|tokenizer|data|train|export|evaluate) ;;
    *) echo "train_default_model.sh: unknown stage '$s'" >&2; exit 2 ;; esac
done
has() { case ",$stages," in *",$1,"*) return 0 ;; esac; return 1; }
[ -x "$loom" ] || { echo "train_default_model.sh: no loom binary at '$loom' (build first, or --loom BIN)" >&2; exit 1; }
mkdir -p "$work"
recipe=scripts/default_model
corpus=build/corpus

# ---- the recipe's settings (docs/DEFAULT_MODEL.md explains them). The environment may
# override them for a quick trial (e.g. DEVICE=cpu STEPS=4 BATCH=2 SEQ=64); the shipped
# model is made with these values.
: "${VOCAB:=8192}"
: "${SEQ:=1024}"
: "${BATCH:=64}"          # 65,536 tokens per step
: "${STEPS:=1800}"        # about 8 passes over the 14.6M training tokens
: "${LR:=1e-3}"
: "${MIN_LR:=1e-4}"
: "${WARMUP:=200}"
: "${WEIGHT_DECAY:=0.1}"
: "${VAL_EVERY:=150}"
: "${VAL_BATCHES:=2}"
: "${SAVE_EVERY:=300}"
: "${SEED:=1}"
: "${DEVICE:=cuda}"

if has corpus; then
  echo "== corpus"
  sh scripts/prepare_corpus.sh "$corpus"
fi
if has tokenizer; then
  echo "== tokenizer"
  "$loom" tokenizer train --vocab $VOCAB --special "<|endoftext|>" "$corpus/train.txt" -o "$work/tokenizer.json"
fi
if has data; then
  echo "== data"
  "$loom" data prepare --tokenizer "$work/tokenizer.json" "$corpus/train.txt" -o "$work/train.bin"
  "$loom" data prepare --tokenizer "$work/tokenizer.json" "$corpus/valid.txt" -o "$work/valid.bin"
fi
if has train; then
  echo "== train"
  rm -rf "$work/run"
  "$loom" train --config "$recipe/config.json" --data "$work/train.bin" --val-data "$work/valid.bin" \
    --out "$work/run" --device $DEVICE --seed $SEED --steps $STEPS --batch $BATCH --seq $SEQ --lr $LR \
    --min-lr $MIN_LR --warmup $WARMUP --weight-decay $WEIGHT_DECAY --val-every $VAL_EVERY --val-batches $VAL_BATCHES \
    --save-every $SAVE_EVERY --tokenizer "$work/tokenizer.json"
fi
if has export; then
  echo "== export"
  # the saved checkpoint (every SAVE_EVERY steps, and final) with the lowest validation loss
  best=$(python3 - "$work/run" $SAVE_EVERY $STEPS <<'EOF'
import json, sys
run, every, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
best = None
for line in open(run + "/log.jsonl"):
    r = json.loads(line)
    if "val_loss" in r and (r["step"] % every == 0 or r["step"] == steps):
        if best is None or r["val_loss"] < best[1]:
            best = (r["step"], r["val_loss"])
if best is None:
    sys.exit("no validation loss at a checkpoint step in " + run + "/log.jsonl")
name = "final" if best[0] == steps else "checkpoint-%06d" % best[0]
print(run + "/" + name)
print("chose %s (step %d, validation loss %.4f)" % (name, best[0], best[1]), file=sys.stderr)
EOF
)
  rm -rf "$out.tmp"
  mkdir -p "$(dirname "$out")"
  "$loom" convert --model "$best" --dtype bf16 -o "$out.tmp"
  cp "$recipe/generation_config.json" "$recipe/tokenizer_config.json" "$recipe/NOTICE" "$out.tmp/"
  cp "$work/tokenizer.json" "$out.tmp/tokenizer.json"
  echo "$best" > "$work/exported_from.txt"
  rm -rf "$out" && mv "$out.tmp" "$out"
  ls -l "$out"
fi
if has evaluate; then
  echo "== evaluate"
  dev=cpu
  if "$loom" version | grep -q "cuda on" && command -v nvidia-smi >/dev/null 2>&1; then dev=cuda; fi
  "$loom" eval --model "$out" --data "$work/valid.bin" --seq $SEQ --batch 8 --device $dev --dtype f32 --quiet \
    > "$work/eval.json"
  cat "$work/eval.json"
  "$loom" plot-loss "$work/run/log.jsonl" -o "$work/loss.svg" --title "loom default model: training and validation loss"
  : > "$work/samples.txt"
  for p in "It is a truth universally acknowledged" "The President said that" \
           "In the beginning" "A database index is" "The old man looked at the sea and"; do
    { echo "### $p (seed 1, temperature 0.8, top-p 0.95)"
      "$loom" generate --model "$out" --prompt "$p" --max-new 80 --seed 1 --temperature 0.8 --top-p 0.95
      echo; echo; } >> "$work/samples.txt"
  done
  cat "$work/samples.txt"
fi
