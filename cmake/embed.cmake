# Writes OUT, a C source defining `const char *lm__serve_page(size_t *len)` that returns
# the bytes of IN (the chat page) as a NUL-terminated array. Run by a custom command
# at build time, so editing the page rebuilds it.
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* generated from src/serve/page.html by cmake/embed.cmake: do not edit */\n#include <stddef.h>\nconst char *lm__serve_page(size_t *len);\nstatic const unsigned char page[${bytes} + 1] = {\n${body}0};\nconst char *lm__serve_page(size_t *len) {\n    *len = ${bytes};\n    return (const char *)page;\n}\n")
