/* Built by tests/cmake/CMakeLists.txt against smoe's CMake targets and run
 * by tests/library/cmake.rs: the library's version is the header's, and
 * every expert of layer LAYER claimed from VAULT equals its bytes in
 * experts.smoe.
 *
 * usage: consumer VAULT LAYER EXPERTS; prints "ok VERSION N" */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "smoe.h"

static int fail(const char *what, smoe_status st) {
  fprintf(stderr, "consumer: %s: %s: %s\n", what, smoe_status_str(st), smoe_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s VAULT LAYER EXPERTS\n", argv[0]);
    return 2;
  }
  const uint32_t layer = (uint32_t)strtoul(argv[2], NULL, 10);
  const uint32_t experts = (uint32_t)strtoul(argv[3], NULL, 10);
  if (strcmp(smoe_version(), SMOE_VERSION_STRING) != 0 || smoe_abi_version() != SMOE_ABI_VERSION) {
    fprintf(stderr, "consumer: library %s (ABI %u), header %s (ABI %d)\n", smoe_version(),
            (unsigned)smoe_abi_version(), SMOE_VERSION_STRING, SMOE_ABI_VERSION);
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/experts.smoe", argv[1]);
  const int fd = open(path, O_RDONLY);
  if (fd < 0) {
    perror(path);
    return 1;
  }
  smoe_streamer *s = NULL;
  smoe_status st = smoe_open(argv[1], NULL, &s);
  if (st != SMOE_OK) return fail("smoe_open", st);
  for (uint32_t e = 0; e < experts; e++) {
    uint64_t size = 0, padded = 0, offset = 0;
    if ((st = smoe_expert_info(s, layer, e, &size, &padded, &offset)) != SMOE_OK)
      return fail("smoe_expert_info", st);
    if ((st = smoe_prefetch(s, layer, e, false)) != SMOE_OK) return fail("smoe_prefetch", st);
    smoe_slot slot;
    if ((st = smoe_claim_wait(s, layer, e, 10000000000ull, &slot)) != SMOE_OK)
      return fail("smoe_claim_wait", st);
    unsigned char *expected = malloc(size);
    if (expected == NULL || pread(fd, expected, size, (off_t)offset) != (ssize_t)size ||
        slot.size != size || memcmp(slot.data, expected, size) != 0) {
      fprintf(stderr, "consumer: layer %u expert %u differs from %s\n", (unsigned)layer,
              (unsigned)e, path);
      return 1;
    }
    free(expected);
    if ((st = smoe_release(s, &slot)) != SMOE_OK) return fail("smoe_release", st);
  }
  smoe_close(s);
  close(fd);
  printf("ok %s %u\n", smoe_version(), (unsigned)experts);
  return 0;
}
