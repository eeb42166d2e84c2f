/*
 * An "old" header: a hand-written copy of the parts of C API v1 that
 * tests/c/old_struct_test.c uses, with smoe_config and smoe_stats as an
 * older header declared them. The program is built against this file, not
 * include/smoe.h, to check that the library never writes past the structs
 * of a program built against a header older than itself.
 *
 * Knobs (-D on the compiler's command line):
 *   OLD_CONFIG_WITHOUT_FREQ_PATH  smoe_config without its last v1 field,
 *                                 smaller than the library's: refused.
 *   OLD_STATS_WITHOUT_DIRECT_IO   smoe_stats without its last v1 field,
 *                                 smaller than v1: refused.
 *   OLD_UNSIZED_INIT              smoe_config_init is the function, as in
 *                                 every header before
 *                                 smoe_config_init_sized existed (a program
 *                                 built then); otherwise it is the macro of
 *                                 include/smoe.h.
 */
#ifndef SMOE_V1_H
#define SMOE_V1_H

#include <stdbool.h>
#include <stdint.h>

typedef enum smoe_status {
  SMOE_OK = 0,
  SMOE_PENDING = 1,
  SMOE_ERR_ARGUMENT = -1,
} smoe_status;

typedef struct smoe_streamer smoe_streamer;

typedef struct smoe_config {
  uint32_t struct_size;
  uint32_t ring_slots;
  uint32_t slot_mb;
  uint32_t workers;
  uint32_t direct_io;
  uint32_t prewarm;
  uint32_t prewarm_slots;
  uint32_t verify;
  uint64_t scout_bytes;
  uint64_t engine_overhead_bytes;
#if !defined(OLD_CONFIG_WITHOUT_FREQ_PATH)
  const char *freq_path;
#endif
} smoe_config;

typedef struct smoe_stats {
  uint32_t struct_size;
  uint64_t claims;
  uint64_t hits;
  uint64_t pending;
  uint64_t bytes_read;
  uint64_t reads_demand;
  uint64_t reads_speculative;
  uint64_t reads_prewarm;
  uint64_t evictions;
  uint64_t io_errors;
  uint64_t checksum_errors;
  uint64_t resident;
  uint64_t ring_slots;
  uint64_t slot_bytes;
  uint64_t workers;
#if !defined(OLD_STATS_WITHOUT_DIRECT_IO)
  uint64_t direct_io;
#endif
} smoe_stats;

smoe_status smoe_open(const char *vault_path, const smoe_config *cfg, smoe_streamer **out);
void smoe_close(smoe_streamer *s);
smoe_status smoe_get_stats(const smoe_streamer *s, smoe_stats *out);
const char *smoe_last_error(void);
const char *smoe_status_str(smoe_status st);

#if defined(OLD_UNSIZED_INIT)
void smoe_config_init(smoe_config *cfg);
#else
smoe_status smoe_config_init_sized(smoe_config *cfg, uint32_t struct_size);
#define smoe_config_init(cfg) smoe_config_init_sized((cfg), (uint32_t)sizeof(smoe_config))
#endif

#endif /* SMOE_V1_H */
