/* tools/loom/main.c — the loom command-line interface: dispatches subcommands.
 * Errors go to stderr with a non-zero exit status; results go to stdout. */
#include "commands.h"
#include "loom/loom.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: loom <command> [options]\n"
            "commands:\n"
            "  generate       continue a prompt with a model (streams text)\n"
            "  info           describe a model directory (JSON)\n"
            "  convert        copy a model directory with its weights in another dtype (bf16, f16, f32)\n"
            "  quantize       copy a model directory with int8/int4/fp8 projection weights (loom loads it directly)\n"
            "  eval           a model's loss and perplexity over a token shard (JSON)\n"
            "  tokenize       text <-> token ids with a tokenizer.json (JSON lines on stdin)\n"
            "  tokenizer      'tokenizer train': learn a byte-level BPE tokenizer.json from text files\n"
            "  logits         run one forward pass and print logits per position (JSON lines)\n"
            "  train          train or fine-tune a model on token shards\n"
            "  serve          an OpenAI-compatible HTTP server (completions, chat, streaming, metrics)\n"
            "  chat           an interactive chat in the terminal (the model's chat template)\n"
            "  data           'data prepare': tokenize text files into a token shard\n"
            "  plot-loss      draw a training log's loss curve as SVG\n"
            "  plan           compile a workload (or a model's decoder layer) for a tile machine and simulate it\n"
            "  run-plan       run an executable plan package (.lmx) in the tile-machine simulator\n"
            "  trace          'trace view': a step trace (--trace FILE.json) as an offline HTML timeline\n"
            "  bench          measure speed (bandwidth, decode, prefill, tokenize, serve) as JSON\n"
            "  cpu            print the CPU features loom detected\n"
            "  version        print the loom version and build features\n"
            "run 'loom <command> --help' for a command's options\n");
}

static int cmd_version(void) {
    printf("loom %s (cuda %s)\n", LOOM_VERSION_STRING, lm_cuda_compiled() ? "on" : "off");
    return 0;
}

static int cmd_cpu(void) {
    const lm_cpu_features *f = lm_cpu_get_features();
    printf("{\"logical_cpus\":%d,\"avx2\":%d,\"fma\":%d,\"f16c\":%d,\"avx512f\":%d,\"avx512bw\":%d,"
           "\"avx512vl\":%d,\"avx512_bf16\":%d,\"avx512_fp16\":%d,\"avx512_vnni\":%d,\"avx_vnni\":%d,"
           "\"amx_tile\":%d,\"amx_bf16\":%d,\"amx_int8\":%d}\n",
           f->logical_cpus, f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl, f->avx512_bf16,
           f->avx512_fp16, f->avx512_vnni, f->avx_vnni, f->amx_tile, f->amx_bf16, f->amx_int8);
    return 0;
}

/* LOOM_CPU_ISA (scalar, avx2, avx512: the library's CPU kernels on a lower vector path,
 * for measurements) must name a path this CPU runs: the library only logs and ignores a
 * bad one, so the CLI refuses it up front. */
static int check_isa_env(void) {
    const char *e = getenv("LOOM_CPU_ISA");
    if (!e || !*e) return 0;
    const lm_cpu_features *f = lm_cpu_get_features();
    const int avx2 = f->avx2 && f->fma && f->f16c, avx512 = avx2 && f->avx512f && f->avx512bw && f->avx512vl;
    if (strcmp(e, "scalar") && strcmp(e, "avx2") && strcmp(e, "avx512")) {
        fprintf(stderr, "loom: LOOM_CPU_ISA=%s: expected scalar, avx2 or avx512\n", e);
        return 2;
    }
    if ((!strcmp(e, "avx2") && !avx2) || (!strcmp(e, "avx512") && !avx512)) {
        fprintf(stderr, "loom: LOOM_CPU_ISA=%s: this CPU cannot run that path (see `loom cpu`)\n", e);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (check_isa_env()) return 2;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) return cmd_version();
    if (!strcmp(cmd, "cpu")) return cmd_cpu();
    if (!strcmp(cmd, "logits")) return cmd_logits(argc - 2, argv + 2);
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenizer")) return cmd_tokenizer(argc - 2, argv + 2);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "convert")) return cmd_convert(argc - 2, argv + 2);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 2, argv + 2);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 2, argv + 2);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return cmd_serve(argc - 2, argv + 2);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 2, argv + 2);
    if (!strcmp(cmd, "data")) return cmd_data(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot-loss")) return cmd_plot(argc - 2, argv + 2);
    if (!strcmp(cmd, "plan")) return cmd_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "run-plan")) return cmd_run_plan(argc - 2, argv + 2);
    if (!strcmp(cmd, "trace")) return cmd_trace(argc - 2, argv + 2);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "loom: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
