/* loom/loom.h — umbrella header: includes every public loom header. */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include "loom/base.h"
#include "loom/runtime.h"
#include "loom/tensor.h"
#include "loom/graph.h"
#include "loom/ops.h"
#include "loom/safetensors.h"
#include "loom/config.h"
#include "loom/tokenizer.h"
#include "loom/model.h"
#include "loom/sampler.h"
#include "loom/generate.h"
#include "loom/ops_backward.h"
#include "loom/autograd.h"
#include "loom/data.h"
#include "loom/io_write.h"
#include "loom/train.h"
#include "loom/exec.h"
#include "loom/plan.h"
#include "loom/tokenizer_train.h"
#include "loom/chat.h"
#include "loom/serve.h"
#include "loom/server.h"
#include "loom/trace.h"

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0
#define LOOM_VERSION_STRING "0.1.0"

#endif
