/* base/version.c — lm_version(): the library's version, from the LM_VERSION_* macros
 * of loom/base.h (CMakeLists.txt checks them against project(VERSION) at configure
 * time). The string is rebuilt from the three numbers so the macros cannot disagree.
 */
#include "internal.h"

#define LM__STR(x) #x
#define LM__XSTR(x) LM__STR(x)
#define LM__VERSION LM__XSTR(LM_VERSION_MAJOR) "." LM__XSTR(LM_VERSION_MINOR) "." LM__XSTR(LM_VERSION_PATCH)

_Static_assert(sizeof(LM__VERSION) == sizeof(LM_VERSION_STRING), "LM_VERSION_STRING disagrees with LM_VERSION_MAJOR/MINOR/PATCH");

const char *lm_version(void) { return LM__VERSION; }
