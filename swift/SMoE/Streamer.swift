// A Swift wrapper of smoe's C API (module CSMoE, include/smoe.h).
//
// The header marks every pointer SMOE_NULLABLE or SMOE_NONNULL (_Nullable /
// _Nonnull under Clang), so the import is exact: `smoe_last_error()` returns a
// non-optional `UnsafePointer<CChar>`, `smoe_slot.data` an optional
// `UnsafePointer<UInt8>?`, the opaque `smoe_streamer *` an `OpaquePointer?`.
// This file owns the only conversions: a failed call becomes a thrown
// `SMoEError` carrying the status and `smoe_last_error()`; a claim becomes a
// `Claim`, a noncopyable struct (no allocation per claim) that releases
// itself when it goes out of scope.
import CSMoE

/// A failed smoe call: its status and the library's message for it
/// (`smoe_last_error()`, read on the calling thread right after the call).
public struct SMoEError: Error, Equatable, CustomStringConvertible, Sendable {
    public let status: Status
    public let message: String

    public init(status: Status, message: String) {
        self.status = status
        self.message = message
    }

    public var description: String { "\(status.name): \(message)" }

    /// Throws the last error of this thread if `status` is not `SMOE_OK`.
    /// `SMOE_PENDING` is not an error to the C API; callers that expect it
    /// test for it before calling this.
    public static func check(_ status: smoe_status) throws {
        guard status != SMOE_OK else { return }
        throw SMoEError(status: Status(status), message: String(cString: smoe_last_error()))
    }

    /// A `smoe_status` value, with the names `smoe_status_str` gives.
    public struct Status: RawRepresentable, Hashable, CustomStringConvertible, Sendable {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }
        public init(_ status: smoe_status) { rawValue = numericCast(status.rawValue) }

        public static let ok = Status(SMOE_OK)
        public static let pending = Status(SMOE_PENDING)
        public static let argument = Status(SMOE_ERR_ARGUMENT)
        public static let notFound = Status(SMOE_ERR_NOT_FOUND)
        public static let io = Status(SMOE_ERR_IO)
        public static let format = Status(SMOE_ERR_FORMAT)
        public static let noMemory = Status(SMOE_ERR_NO_MEMORY)
        public static let ringFull = Status(SMOE_ERR_RING_FULL)
        public static let stale = Status(SMOE_ERR_STALE)
        public static let unsupported = Status(SMOE_ERR_UNSUPPORTED)
        public static let `internal` = Status(SMOE_ERR_INTERNAL)

        /// The constant's name, e.g. "SMOE_ERR_NOT_FOUND".
        public var name: String {
            String(cString: smoe_status_str(smoe_status(rawValue: numericCast(rawValue))))
        }

        public var description: String { name }
    }
}

/// An open vault with its ring and I/O workers (`smoe_streamer`). Every
/// method may be called from any thread; `deinit` closes it, which a `Claim`
/// delays by holding a strong reference to its streamer.
///
/// `@unchecked Sendable`: its only stored property is the handle, never
/// changed after `init`, and the C API allows every call on one streamer
/// from any thread at once except `smoe_close`, which `deinit` makes after
/// the last reference (so after every other call) is gone.
public final class Streamer: @unchecked Sendable {
    /// Settings for `smoe_open` (`smoe_config`); zero means "default".
    public struct Config: Sendable {
        public enum DirectIO: UInt32, Sendable { case auto = 0, require = 1, off = 2 }
        /// The eviction policy (docs/c-api.md, "Eviction and retention").
        public enum Policy: UInt32, Sendable { case lru = 0, adaptive = 1 }
        /// When the ring's pages are committed (docs/c-api.md, "The ring's
        /// memory"): as slots are first loaded, by a thread after open, or
        /// during open.
        public enum Populate: UInt32, Sendable { case off = 0, background = 1, open = 2 }

        public var ringSlots: UInt32 = 0
        public var slotMiB: UInt32 = 0
        public var workers: UInt32 = 0
        public var directIO: DirectIO = .auto
        public var prewarm = true
        public var prewarmSlots: UInt32 = 0
        public var verify = false
        /// `UInt64.max`: the size of the vault's `scout.*` files.
        public var scoutBytes = UInt64.max
        /// 0: 2 GiB.
        public var engineOverheadBytes: UInt64 = 0
        /// `nil`: `<vault>/expert_freq.bin`; `""`: do not persist.
        public var freqPath: String?
        /// `nil` or `""`: no trace; else every OK claim is recorded and
        /// written to this file at close as a routing trace (docs/c-api.md,
        /// "Trace capture").
        public var tracePath: String?
        /// Which idle slot a load evicts.
        public var policy: Policy = .lru
        /// Pre-fault the ring's pages: in the background after open, or
        /// before open returns.
        public var populate: Populate = .off
        /// Lock the ring in memory (`mlock`); open fails if the OS refuses.
        public var lock = false
        /// Elastic ring: idle slots are given back under memory pressure.
        public var elastic = true
        /// The host pins the ring for a device: not elastic, populated
        /// (docs/c-api.md, "CUDA hosts").
        public var pinned = false

        public init() {}
    }

    /// The counters and sizes of `smoe_get_stats`.
    public typealias Stats = smoe_stats

    /// Where an expert lives in `experts.smoe` (`smoe_expert_info`).
    public struct ExpertInfo: Equatable, Sendable {
        public let size: UInt64
        public let paddedSize: UInt64
        public let offset: UInt64
    }

    /// The whole ring (`smoe_ring_region`): slot `i` starts at
    /// `base + i × slotBytes`. Valid while the streamer is open.
    public struct RingRegion {
        public let base: UnsafeMutableRawPointer
        public let bytes: UInt64
        public let slotBytes: UInt64
    }

    /// The `smoe_streamer *`; for calls this wrapper does not cover. Valid
    /// as long as this object is alive.
    public let handle: OpaquePointer

    /// Opens `vault` (its directory or its `experts.smoe`).
    public init(vault: String, config: Config = Config()) throws {
        var cfg = smoe_config()
        // In C, smoe_config_init(cfg) is a macro that passes the caller's
        // sizeof(smoe_config); Swift cannot call a macro, so it passes the
        // size of the struct this module's header declares itself. (The
        // function named smoe_config_init is ABI v1's, for programs built
        // before the macro, and writes only the v1 struct.)
        try SMoEError.check(
            smoe_config_init_sized(&cfg, UInt32(MemoryLayout<smoe_config>.size)))
        cfg.ring_slots = config.ringSlots
        cfg.slot_mb = config.slotMiB
        cfg.workers = config.workers
        cfg.direct_io = config.directIO.rawValue
        cfg.prewarm = config.prewarm ? 1 : 0
        cfg.prewarm_slots = config.prewarmSlots
        cfg.verify = config.verify ? 1 : 0
        cfg.scout_bytes = config.scoutBytes
        cfg.engine_overhead_bytes = config.engineOverheadBytes
        cfg.policy = config.policy.rawValue
        cfg.populate = config.populate.rawValue
        cfg.lock = config.lock ? 1 : 0
        cfg.elastic = config.elastic ? 1 : 0
        cfg.pinned = config.pinned ? 1 : 0
        var out: OpaquePointer?
        // freq_path and trace_path are read during smoe_open only, so
        // temporary C strings are enough.
        let status: smoe_status = withOptionalCString(config.freqPath) {
            (freqPath: UnsafePointer<CChar>?) -> smoe_status in
            withOptionalCString(config.tracePath) {
                (tracePath: UnsafePointer<CChar>?) -> smoe_status in
                cfg.freq_path = freqPath
                cfg.trace_path = tracePath
                return smoe_open(vault, &cfg, &out)
            }
        }
        try SMoEError.check(status)
        guard let out else {
            throw SMoEError(status: .internal, message: "smoe_open returned SMOE_OK without a streamer")
        }
        handle = out
    }

    deinit {
        smoe_close(handle)
    }

    /// Queues the read of (`layer`, `expert`) unless it is resident or in
    /// flight. Never waits for I/O.
    public func prefetch(layer: UInt32, expert: UInt32, speculative: Bool = false) throws {
        try SMoEError.check(smoe_prefetch(handle, layer, expert, speculative))
    }

    /// Claims (`layer`, `expert`) if it is resident; `nil` if its read is
    /// still pending (the read is queued). Never blocks, never allocates.
    public func claim(layer: UInt32, expert: UInt32) throws -> Claim? {
        var slot = smoe_slot()
        let status = smoe_claim(handle, layer, expert, &slot)
        if status == SMOE_PENDING { return nil }
        try SMoEError.check(status)
        return Claim(streamer: self, slot: slot)
    }

    /// Claims (`layer`, `expert`), waiting up to `timeoutNanoseconds` for
    /// its read; `nil` if the timeout passed first.
    public func claim(layer: UInt32, expert: UInt32, timeoutNanoseconds: UInt64) throws -> Claim? {
        var slot = smoe_slot()
        let status = smoe_claim_wait(handle, layer, expert, timeoutNanoseconds, &slot)
        if status == SMOE_PENDING { return nil }
        try SMoEError.check(status)
        return Claim(streamer: self, slot: slot)
    }

    /// Queues the reads of a layer's working set, in order (docs/c-api.md,
    /// "Working sets"): returns how many members are now resident or in
    /// flight, fewer than `experts.count` when the ring could not take the
    /// rest (the `SMOE_ERR_RING_FULL` case is not thrown: `claimAny` queues
    /// the rest as slots free up).
    @discardableResult
    public func prefetchSet(layer: UInt32, experts: [UInt32], speculative: Bool = false) throws -> UInt32 {
        var queued: UInt32 = 0
        let status = experts.withUnsafeBufferPointer { set in
            smoe_prefetch_set(handle, layer, set.baseAddress, UInt32(set.count), speculative, &queued)
        }
        if status != SMOE_ERR_RING_FULL { try SMoEError.check(status) }
        return queued
    }

    /// Claims one member of a layer's working set: a resident one first, in
    /// the set's order, else the first whose read lands within
    /// `timeoutNanoseconds`; `nil` if the timeout passed first. The claim's
    /// `expert` says which member it is. Throws `SMOE_ERR_RING_FULL` at once
    /// when every slot is held (release first), and a member's failed read.
    public func claimAny(layer: UInt32, experts: [UInt32], timeoutNanoseconds: UInt64) throws -> Claim? {
        var slot = smoe_slot()
        let status = experts.withUnsafeBufferPointer { set in
            smoe_claim_any(handle, layer, set.baseAddress, UInt32(set.count), timeoutNanoseconds, &slot)
        }
        if status == SMOE_PENDING { return nil }
        try SMoEError.check(status)
        return Claim(streamer: self, slot: slot)
    }

    /// The counters and sizes now (each counter exact, not one snapshot).
    public func stats() throws -> Stats {
        var stats = smoe_stats()
        stats.struct_size = UInt32(MemoryLayout<smoe_stats>.size)
        try SMoEError.check(smoe_get_stats(handle, &stats))
        return stats
    }

    public func expertInfo(layer: UInt32, expert: UInt32) throws -> ExpertInfo {
        var size: UInt64 = 0
        var paddedSize: UInt64 = 0
        var offset: UInt64 = 0
        try SMoEError.check(smoe_expert_info(handle, layer, expert, &size, &paddedSize, &offset))
        return ExpertInfo(size: size, paddedSize: paddedSize, offset: offset)
    }

    public func ringRegion() throws -> RingRegion {
        var base: UnsafeMutableRawPointer?
        var bytes: UInt64 = 0
        var slotBytes: UInt64 = 0
        try SMoEError.check(smoe_ring_region(handle, &base, &bytes, &slotBytes))
        guard let base else {
            throw SMoEError(status: .internal, message: "smoe_ring_region returned a NULL base")
        }
        return RingRegion(base: base, bytes: bytes, slotBytes: slotBytes)
    }

    /// Tells the pre-warm thread the engine is busy (stop) or idle (resume).
    public func prewarmPause(_ busy: Bool) {
        smoe_prewarm_pause(handle, busy)
    }

    /// Persists the claim histogram now.
    public func flushStats() throws {
        try SMoEError.check(smoe_flush_stats(handle))
    }

    /// The vault's metadata (a JSON object), "" if none.
    public var metadata: String { String(cString: smoe_vault_metadata(handle)) }

    /// The warnings of `smoe_open`, one per line, "" if none.
    public var warnings: String { String(cString: smoe_warnings(handle)) }

    /// `smoe_abi_version()` of the loaded library; `SMOE_ABI_VERSION` is the
    /// header's.
    public static var abiVersion: UInt32 { smoe_abi_version() }

    /// `smoe_version()` of the loaded library, e.g. "0.1.0";
    /// `SMOE_VERSION_STRING` is the header's.
    public static var version: String { String(cString: smoe_version()) }
}

/// One claimed expert (`smoe_slot`). Its bytes stay valid until it is
/// released: by `release()`, or when it goes out of scope. It holds its
/// streamer open.
///
/// Noncopyable: a claim is released exactly once, which the compiler checks
/// (`release()` consumes it), and it costs no allocation, only the
/// streamer's reference count.
public struct Claim: ~Copyable {
    public let streamer: Streamer
    public let slot: smoe_slot
    /// Set by `release()`, so that the `deinit` that ends it does not release
    /// again.
    private var released = false

    init(streamer: Streamer, slot: smoe_slot) {
        self.streamer = streamer
        self.slot = slot
    }

    deinit {
        if !released {
            var slot = slot
            _ = smoe_release(streamer.handle, &slot)
        }
    }

    public var layer: UInt32 { slot.layer }
    public var expert: UInt32 { slot.expert }
    /// No demand read was needed (retained, speculated or pre-warmed).
    public var hit: Bool { slot.hit }
    public var slotIndex: UInt32 { slot.slot_index }
    public var size: Int { Int(slot.size) }

    /// The payload (16 KiB aligned), for reading while the claim is held.
    /// Do not keep the buffer past the claim.
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try body(UnsafeRawBufferPointer(start: slot.data, count: size))
    }

    /// Releases the claim now, reporting the library's error.
    public consuming func release() throws {
        var slot = slot
        let status = smoe_release(streamer.handle, &slot)
        released = true
        try SMoEError.check(status)
    }
}

/// `body` with a C string of `string`, or NULL for `nil`; the pointer is
/// valid during `body` only.
private func withOptionalCString<R>(
    _ string: String?, _ body: (UnsafePointer<CChar>?) -> R
) -> R {
    guard let string else { return body(nil) }
    return string.withCString { body($0) }
}
