/*
 * smoe: stream Mixture-of-Experts expert weights from SSD (C API v1).
 *
 * GENERATED FILE, DO NOT EDIT. It is written by cbindgen from src/ffi/ when
 * the crate builds (`cargo build`), using cbindgen.toml; commit the result.
 * CI builds with CI set, which never rewrites this file, and fails when it
 * differs from what the source generates.
 */

#ifndef SMOE_H
#define SMOE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>
#if defined(__clang__)
#define SMOE_NULLABLE _Nullable
#define SMOE_NONNULL _Nonnull
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-extension"
#define SMOE_H_DIAGNOSTIC_PUSHED
#else
#define SMOE_NULLABLE
#define SMOE_NONNULL
#endif

/**
 * The version of the C ABI this library implements. Compare it with
 * `smoe_abi_version()` at run time to detect a header/library mismatch.
 */
#define SMOE_ABI_VERSION 1

/**
 * The result of every call that can fail. Values are fixed by the ABI and
 * never reused; `smoe_status_str()` names each one.
 */
typedef enum smoe_status {
  /**
   * Success.
   */
  SMOE_OK = 0,
  /**
   * Claim: not resident yet, its read is queued.
   */
  SMOE_PENDING = 1,
  /**
   * NULL, bad struct_size, out-of-range value.
   */
  SMOE_ERR_ARGUMENT = -1,
  /**
   * (layer, expert) is not in the vault.
   */
  SMOE_ERR_NOT_FOUND = -2,
  /**
   * Open or read failed (errno in the message).
   */
  SMOE_ERR_IO = -3,
  /**
   * Vault invalid, or a blob failed its checksum.
   */
  SMOE_ERR_FORMAT = -4,
  /**
   * The ring could not be allocated.
   */
  SMOE_ERR_NO_MEMORY = -5,
  /**
   * Every slot is claimed or loading.
   */
  SMOE_ERR_RING_FULL = -6,
  /**
   * Release of a ticket that is not held.
   */
  SMOE_ERR_STALE = -7,
  /**
   * E.g. direct I/O required but refused.
   */
  SMOE_ERR_UNSUPPORTED = -8,
  /**
   * A bug: a panic caught at the boundary.
   */
  SMOE_ERR_INTERNAL = -99,
} smoe_status;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * The ABI version of the library actually loaded, `SMOE_ABI_VERSION` of the
 * header it was built from.
 *
 * # Returns
 * Always `SMOE_ABI_VERSION` (1 for this library).
 *
 * # Safety
 * None: takes nothing, may be called at any time from any thread.
 */
uint32_t smoe_abi_version(void);

/**
 * The name of a status, e.g. `"SMOE_ERR_IO"`.
 *
 * # Returns
 * A static NUL-terminated string, never NULL, never to be freed: the
 * constant's name for each `smoe_status` value, or `"SMOE_UNKNOWN_STATUS"`
 * for any other `int`.
 *
 * # Safety
 * None: any `int` value is accepted.
 */
const char *SMOE_NONNULL smoe_status_str(smoe_status st);

/**
 * This thread's last error message: the message of the most recent call on
 * this thread that failed (or caught a panic), with its context (file,
 * offset, layer and expert, OS error).
 *
 * # Returns
 * A NUL-terminated string, never NULL, owned by the library: `""` if no call
 * on this thread has failed. It stays valid until the next `smoe_` call on
 * this thread (or the thread's exit); copy it to keep it.
 *
 * # Safety
 * From C: none beyond the lifetime above. From Rust this is `unsafe` because
 * the returned reference's `'static` lifetime is a lie: the caller must not
 * use it after the next call into this module on the same thread.
 */
const char *SMOE_NONNULL smoe_last_error(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* SMOE_H */

#if defined(SMOE_H_DIAGNOSTIC_PUSHED)
#undef SMOE_H_DIAGNOSTIC_PUSHED
#pragma clang diagnostic pop
#endif
