/* An LD_PRELOAD library for cli/tests/tool/llama.rs: posix_memalign refuses
   (ENOMEM) every request above SMOE_TEST_REFUSE_ABOVE bytes, as a host at
   its memory limit does. ggml allocates its CPU buffers (the compute
   buffers among them) with posix_memalign, so a test can make a raised
   n_ubatch's compute buffers fail to allocate for real. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

int posix_memalign(void **out, size_t alignment, size_t size) {
    static int (*real)(void **, size_t, size_t);
    if (real == NULL) {
        real = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
        if (real == NULL) {
            return ENOMEM;
        }
    }
    const char *above = getenv("SMOE_TEST_REFUSE_ABOVE");
    if (above != NULL && *above != '\0' && size > strtoull(above, NULL, 10)) {
        return ENOMEM;
    }
    return real(out, alignment, size);
}
