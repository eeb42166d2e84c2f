/* The installed C API (scripts/install.sh PREFIX puts it in PREFIX/include,
 * which smoe.pc's Cflags name). */
#include <smoe.h>
