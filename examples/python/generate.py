"""generate.py MODEL_DIR PROMPT [N] — the Python twin of examples/c/generate.c: loads a
Hugging Face model directory with loom, streams a greedy continuation of PROMPT (at
most N new tokens, default 32) and prints the prompt followed by it. Then prints the
top-5 next tokens after the prompt from the logits, a NumPy array over loom's memory
(skipped without NumPy).

Run it with the package on PYTHONPATH and libloom.so found (LOOM_LIBRARY, a build tree,
an installed prefix, or LD_LIBRARY_PATH), e.g. after `cmake --install build/release
--prefix P`:  PYTHONPATH=P/share/loom/python python3 generate.py models/default "Hi"
"""
import sys

import loom


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    model_dir, prompt = argv[1], argv[2]
    n = int(argv[3]) if len(argv) > 3 else 32
    try:
        model = loom.Model(model_dir)
    except loom.Error as e:
        print("generate.py: %s" % e, file=sys.stderr)
        return 1
    sys.stdout.write(prompt)
    for piece in model.generate(prompt, max_new_tokens=n, temperature=0):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")

    try:
        import numpy as np
    except ImportError:
        print("(no NumPy: skipping the logits)", file=sys.stderr)
        return 0
    logits = model.logits(model.tokenizer.encode(prompt))  # f32 [vocab] over loom memory, no copy
    top = np.argsort(-logits)[:5]
    print("next-token candidates:", ", ".join("%r %.2f" % (model.tokenizer.decode([int(i)]), logits[i]) for i in top),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
