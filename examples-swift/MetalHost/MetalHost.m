// An Objective-C Metal host for smoe: the whole ring is wrapped ONCE in one
// MTLBuffer, without a copy, and each claimed expert is bound to a kernel by
// its offset in that buffer (slot_index × slot_bytes). No per-expert buffer,
// no copy, no re-registration when slots are reused.
//
// macOS on Apple silicon only; NOT BUILT on Linux (no Metal there) and not
// built by CI. Build on a Mac, from the repository root, after
// `cargo build --release`:
//
//   clang -fobjc-arc -O2 -Iinclude examples-swift/MetalHost/MetalHost.m \
//       target/release/libsmoe.a -framework Metal -framework Foundation \
//       -o metal-host
//   ./metal-host VAULT
//
// Every Metal call is annotated with its Apple documentation page.
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <string.h>
#include <unistd.h>

#include "smoe.h"

// Copies the first 4 bytes of the expert bound at buffer(0) to buffer(1).
static NSString *const kKernel =
    @"kernel void first_word(device const uint *expert [[buffer(0)]],\n"
    @"                       device uint *out [[buffer(1)]]) { out[0] = expert[0]; }\n";

static int fail(const char *what, smoe_status st) {
    fprintf(stderr, "metal-host: %s: %s: %s\n", what, smoe_status_str(st), smoe_last_error());
    return 1;
}

int main(int argc, const char *argv[]) {
    @autoreleasepool {
        if (argc != 2) {
            fprintf(stderr, "usage: metal-host VAULT\n");
            return 2;
        }
        smoe_streamer *s = NULL;
        smoe_status st = smoe_open(argv[1], NULL, &s);
        if (st != SMOE_OK) return fail("smoe_open", st);

        void *base = NULL;
        uint64_t bytes = 0, slot_bytes = 0;
        st = smoe_ring_region(s, &base, &bytes, &slot_bytes);
        if (st != SMOE_OK) return fail("smoe_ring_region", st);

        // https://developer.apple.com/documentation/metal/mtlcreatesystemdefaultdevice()
        id<MTLDevice> device = MTLCreateSystemDefaultDevice();
        // No-copy buffers need a page-aligned pointer and a length that is a
        // multiple of the page size. The ring is 16 KiB aligned and slots are
        // 16 KiB multiples: Apple silicon's page size.
        size_t page = (size_t)getpagesize();
        // https://developer.apple.com/documentation/metal/mtldevice/maxbufferlength
        if ((uintptr_t)base % page != 0 || bytes % page != 0 || bytes > device.maxBufferLength) {
            fprintf(stderr, "metal-host: ring %p + %llu is not page-aligned or exceeds maxBufferLength\n",
                    base, (unsigned long long)bytes);
            return 1;
        }
        // Shared storage: CPU (smoe's I/O workers) and GPU see the same
        // memory. deallocator nil: smoe owns the ring and frees it in
        // smoe_close, which must come after the buffer is released.
        // https://developer.apple.com/documentation/metal/mtldevice/makebuffer(bytesnocopy:length:options:deallocator:)?language=objc
        // https://developer.apple.com/documentation/metal/mtlresourceoptions/storagemodeshared?language=objc
        id<MTLBuffer> ring = [device newBufferWithBytesNoCopy:base
                                                       length:(NSUInteger)bytes
                                                      options:MTLResourceStorageModeShared
                                                  deallocator:nil];
        // https://developer.apple.com/documentation/metal/mtldevice/makebuffer(length:options:)?language=objc
        id<MTLBuffer> out = [device newBufferWithLength:sizeof(uint32_t)
                                                options:MTLResourceStorageModeShared];
        NSError *error = nil;
        // https://developer.apple.com/documentation/metal/mtldevice/makelibrary(source:options:)?language=objc
        id<MTLLibrary> library = [device newLibraryWithSource:kKernel options:nil error:&error];
        // https://developer.apple.com/documentation/metal/mtllibrary/makefunction(name:)?language=objc
        id<MTLFunction> function = [library newFunctionWithName:@"first_word"];
        // https://developer.apple.com/documentation/metal/mtldevice/makecomputepipelinestate(function:)?language=objc
        id<MTLComputePipelineState> pipeline =
            [device newComputePipelineStateWithFunction:function error:&error];
        if (ring == nil || out == nil || pipeline == nil) {
            fprintf(stderr, "metal-host: Metal setup failed: %s\n", error.description.UTF8String);
            return 1;
        }
        // https://developer.apple.com/documentation/metal/mtldevice/makecommandqueue()?language=objc
        id<MTLCommandQueue> queue = [device newCommandQueue];

        // One expert: claim it, let the GPU read it in place, release it.
        smoe_slot slot;
        st = smoe_claim_wait(s, 1, 0, 10ull * 1000 * 1000 * 1000, &slot);
        if (st != SMOE_OK) return fail("smoe_claim_wait", st);
        NSUInteger offset = (NSUInteger)slot.slot_index * (NSUInteger)slot_bytes;

        // https://developer.apple.com/documentation/metal/mtlcommandqueue/makecommandbuffer()?language=objc
        id<MTLCommandBuffer> commands = [queue commandBuffer];
        // https://developer.apple.com/documentation/metal/mtlcommandbuffer/makecomputecommandencoder()?language=objc
        id<MTLComputeCommandEncoder> encoder = [commands computeCommandEncoder];
        // https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/setcomputepipelinestate(_:)?language=objc
        [encoder setComputePipelineState:pipeline];
        // The claimed slot, by its offset in the one ring buffer.
        // https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/setbuffer(_:offset:index:)?language=objc
        [encoder setBuffer:ring offset:offset atIndex:0];
        [encoder setBuffer:out offset:0 atIndex:1];
        // https://developer.apple.com/documentation/metal/mtlcomputecommandencoder/dispatchthreads(_:threadsperthreadgroup:)?language=objc
        [encoder dispatchThreads:MTLSizeMake(1, 1, 1) threadsPerThreadgroup:MTLSizeMake(1, 1, 1)];
        // https://developer.apple.com/documentation/metal/mtlcommandencoder/endencoding()?language=objc
        [encoder endEncoding];
        // https://developer.apple.com/documentation/metal/mtlcommandbuffer/commit()?language=objc
        [commands commit];
        // The GPU reads the slot until the command buffer completes: release
        // the claim only then (or from an addCompletedHandler: block).
        // https://developer.apple.com/documentation/metal/mtlcommandbuffer/waituntilcompleted()?language=objc
        [commands waitUntilCompleted];

        uint32_t expected;
        memcpy(&expected, slot.data, sizeof expected);
        // https://developer.apple.com/documentation/metal/mtlbuffer/contents()?language=objc
        uint32_t seen = *(const uint32_t *)out.contents;
        printf("layer 1 expert 0: slot %u at offset %lu; GPU read 0x%08x, CPU 0x%08x: %s\n",
               slot.slot_index, (unsigned long)offset, seen, expected,
               seen == expected ? "equal" : "DIFFERENT");
        st = smoe_release(s, &slot);
        if (st != SMOE_OK) return fail("smoe_release", st);

        // Drop every Metal reference to the ring before smoe frees it.
        ring = nil;
        encoder = nil;
        commands = nil;
        smoe_close(s);
        return seen == expected ? 0 : 1;
    }
}
