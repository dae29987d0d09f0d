/* SHA-256 (FIPS 180-4) for the compiled core: one-shot digests of short messages.
 *
 * Written for pagedkv from the standard's text: a portable compression function and, on
 * x86-64 processors with the SHA extensions (checked once at run time with CPUID), one
 * built on the SHA-NI instructions. Both give the same digests; tests compare them with
 * hashlib on messages of every length class. */
#ifndef PAGEDKV_SHA256_H
#define PAGEDKV_SHA256_H

#include <stddef.h>
#include <stdint.h>

/* Pick the compression function for this processor (idempotent). */
void pk_sha256_init(void);

/* The SHA-256 digest of data[0 .. len) into out[0 .. 32). */
void pk_sha256(const uint8_t *data, size_t len, uint8_t out[32]);

/* 1 when the SHA-NI compression function is in use, else 0. */
int pk_sha256_accelerated(void);

/* Force the portable compression function (1) or the detected one (0): for tests. */
void pk_sha256_force_portable(int portable);

#endif
