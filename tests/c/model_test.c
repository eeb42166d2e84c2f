/* A model opened in place through the C API (SPEC §6): smoe_open on a GGUF
 * or safetensors path, then every (layer, expert) named on the command line
 * claimed with smoe_claim_wait, its bytes written to OUT one after the
 * other, and smoe_expert_info checked against the claim. The metadata is
 * written to OUT.meta. The Rust test (tests/library/in_place.rs) compares
 * the bytes with the model file's slices an independent reader found.
 *
 * usage: model_test MODEL OUT LAYER:EXPERT...
 * prints "ok" and exits 0, or a message and exits 1. */
#include <smoe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, enum smoe_status st) {
    printf("%s: %s: %s\n", what, smoe_status_str(st), smoe_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        printf("usage: model_test MODEL OUT LAYER:EXPERT...\n");
        return 1;
    }
    struct smoe_config cfg;
    enum smoe_status st = smoe_config_init(&cfg);
    if (st != SMOE_OK) return fail("smoe_config_init", st);
    cfg.ring_slots = 4;
    cfg.workers = 2;
    cfg.freq_path = ""; /* nothing is written anywhere */
    struct smoe_streamer *s = NULL;
    st = smoe_open(argv[1], &cfg, &s);
    if (st != SMOE_OK) return fail("smoe_open", st);

    char meta_path[4096];
    snprintf(meta_path, sizeof meta_path, "%s.meta", argv[2]);
    FILE *meta = fopen(meta_path, "wb");
    FILE *out = fopen(argv[2], "wb");
    if (meta == NULL || out == NULL) {
        printf("cannot create the output files\n");
        return 1;
    }
    const char *json = smoe_vault_metadata(s);
    fwrite(json, 1, strlen(json), meta);
    fclose(meta);

    for (int i = 3; i < argc; i++) {
        unsigned layer = 0, expert = 0;
        if (sscanf(argv[i], "%u:%u", &layer, &expert) != 2) {
            printf("bad pair %s\n", argv[i]);
            return 1;
        }
        struct smoe_slot slot;
        st = smoe_claim_wait(s, layer, expert, 10ull * 1000 * 1000 * 1000, &slot);
        if (st != SMOE_OK) return fail("smoe_claim_wait", st);
        uint64_t size = 0, padded = 0, offset = 0;
        st = smoe_expert_info(s, layer, expert, &size, &padded, &offset);
        if (st != SMOE_OK) return fail("smoe_expert_info", st);
        if (size != slot.size || padded < size || padded % 4096 != 0) {
            printf("layer %u expert %u: claim size %llu, info size %llu padded %llu\n", layer, expert,
                   (unsigned long long)slot.size, (unsigned long long)size, (unsigned long long)padded);
            return 1;
        }
        if (((uintptr_t)slot.data) % 4096 != 0) {
            printf("layer %u expert %u: the claim does not start at its slot\n", layer, expert);
            return 1;
        }
        uint64_t n = slot.size;
        fwrite(&n, sizeof n, 1, out);
        fwrite(slot.data, 1, (size_t)slot.size, out);
        st = smoe_release(s, &slot);
        if (st != SMOE_OK) return fail("smoe_release", st);
    }
    fclose(out);

    struct smoe_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.struct_size = sizeof stats;
    st = smoe_get_stats(s, &stats);
    if (st != SMOE_OK) return fail("smoe_get_stats", st);
    if (stats.io_errors != 0) {
        printf("%llu I/O errors\n", (unsigned long long)stats.io_errors);
        return 1;
    }
    smoe_close(s);
    printf("ok\n");
    return 0;
}
