/* tools/loom/commands.h — entry points of the loom subcommands. Each takes the
 * arguments after its name and returns the process exit status (0 ok, 1 failure,
 * 2 usage error). */
#ifndef LOOM_CLI_COMMANDS_H
#define LOOM_CLI_COMMANDS_H

int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv); /* `loom tokenizer train` */
int cmd_info(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_quantize(int argc, char **argv); /* `loom quantize --to int8` */
int cmd_eval(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_serve(int argc, char **argv); /* `loom bench serve` */
int cmd_train(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_data(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_plan_layer(int argc, char **argv); /* `loom plan layer` */
int cmd_plan_decode(int argc, char **argv); /* `loom plan decode` */
int cmd_run_plan(int argc, char **argv);   /* `loom run-plan FILE.lmx` */
int cmd_trace(int argc, char **argv);      /* `loom trace view TRACE.json` */

#endif
