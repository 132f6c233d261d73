/* chat/unicode.c — UTF-8 coding, the Unicode classes Python's str methods use, and
 * Python's float repr.
 *
 * Strings in templates are valid UTF-8 (sources and JSON are validated on entry), so
 * decoding does not re-check. Character classes follow CPython: str.isspace (the
 * whitespace that strip(), split() and Jinja's `\s` see), str.isprintable (repr
 * escaping) and the one-to-one case mappings of utf8proc (CPython's upper()/lower()
 * also apply the few one-to-many special casings, such as 'ß'.upper() == 'SS'; loom
 * does not). Float repr is the
 * shortest string that reads back to the same double, laid out as CPython's repr:
 * fixed notation for decimal exponents in [-4, 16), scientific otherwise.
 */
#include "chat/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

uint32_t lm__cutf8_get(const char *p, size_t *len) {
    const unsigned char *s = (const unsigned char *)p;
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    if ((s[0] & 0xE0) == 0xC0) {
        *len = 2;
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if ((s[0] & 0xF0) == 0xE0) {
        *len = 3;
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

size_t lm__cutf8_put(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int64_t lm__cutf8_count(const char *p, size_t n) {
    int64_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

int lm__cuni_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t lm__cuni_upper(uint32_t cp) {
    if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    return (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
}

uint32_t lm__cuni_lower(uint32_t cp) {
    if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

uint32_t lm__cuni_title(uint32_t cp) {
    if (cp < 0x80) return lm__cuni_upper(cp);
    return (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
}

int lm__cuni_cased(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
           lm__cuni_upper(cp) != cp || lm__cuni_lower(cp) != cp;
}

int lm__cuni_printable(uint32_t cp) {
    if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

size_t lm__cfloat_repr(double f, char *buf) {
    if (isnan(f)) return (size_t)sprintf(buf, "nan");
    if (isinf(f)) return (size_t)sprintf(buf, f > 0 ? "inf" : "-inf");
    if (f == 0) return (size_t)sprintf(buf, signbit(f) ? "-0.0" : "0.0");
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) { /* the shortest digits that read back exactly */
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d[.ddd]e(+|-)xx */
    const char *p = tmp;
    int neg = *p == '-';
    if (neg) p++;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(p + 1);
    int decpt = exp10 + 1; /* digits[0] is followed by the decimal point at position decpt */
    size_t o = 0;
    if (neg) buf[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            buf[o++] = '0';
            buf[o++] = '.';
            for (int i = 0; i < -decpt; i++) buf[o++] = '0';
            for (int i = 0; i < nd; i++) buf[o++] = digits[i];
        } else if (decpt >= nd) {
            for (int i = 0; i < nd; i++) buf[o++] = digits[i];
            for (int i = nd; i < decpt; i++) buf[o++] = '0';
            buf[o++] = '.';
            buf[o++] = '0';
        } else {
            for (int i = 0; i < nd; i++) {
                if (i == decpt) buf[o++] = '.';
                buf[o++] = digits[i];
            }
        }
        buf[o] = '\0';
        return o;
    }
    buf[o++] = digits[0];
    if (nd > 1) {
        buf[o++] = '.';
        for (int i = 1; i < nd; i++) buf[o++] = digits[i];
    }
    o += (size_t)sprintf(buf + o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    return o;
}
