// Tests of the Swift wrapper against the real library, on a synthetic vault
// written by `smoe synth` (SMOE_BIN, default ../target/release/smoe).
import CSMoE
import Foundation
import SMoE
import XCTest

final class StreamerTests: XCTestCase {
    static let layers: UInt32 = 3
    static let experts: UInt32 = 8
    static var vaultDir = ""

    /// Writes one vault for the whole class.
    override class func setUp() {
        super.setUp()
        let repo = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        let smoe = ProcessInfo.processInfo.environment["SMOE_BIN"]
            ?? repo.appendingPathComponent("target/release/smoe").path
        vaultDir = FileManager.default.temporaryDirectory
            .appendingPathComponent("smoe-swift-test-\(getpid())").path
        try? FileManager.default.removeItem(atPath: vaultDir)
        let synth = Process()
        synth.executableURL = URL(fileURLWithPath: smoe)
        synth.arguments = ["synth", vaultDir, "--layers", "\(layers)", "--experts", "\(experts)",
                           "--blob-kib", "48", "--dense", "0", "--seed", "7"]
        do {
            try synth.run()
            synth.waitUntilExit()
        } catch {
            fatalError("cannot run \(smoe) (set SMOE_BIN): \(error)")
        }
        precondition(synth.terminationStatus == 0, "smoe synth failed")
    }

    override class func tearDown() {
        try? FileManager.default.removeItem(atPath: vaultDir)
        super.tearDown()
    }

    func open() throws -> Streamer {
        var config = Streamer.Config()
        config.workers = 2
        config.freqPath = ""  // do not write a histogram into the vault
        return try Streamer(vault: Self.vaultDir, config: config)
    }

    /// The claim, or a thrown failure when there is none (XCTUnwrap takes
    /// only copyable values).
    func unwrap(_ claim: consuming Claim?, file: StaticString = #filePath, line: UInt = #line) throws -> Claim {
        guard let claim else {
            XCTFail("no claim", file: file, line: line)
            throw SMoEError(status: .pending, message: "no claim")
        }
        return claim
    }

    func fileBytes(offset: UInt64, count: Int) throws -> Data {
        let file = try XCTUnwrap(FileHandle(forReadingAtPath: Self.vaultDir + "/experts.smoe"))
        defer { try? file.close() }
        try file.seek(toOffset: offset)
        return try file.read(upToCount: count) ?? Data()
    }

    func testClaimedBytesEqualTheFile() throws {
        let streamer = try open()
        let ring = try streamer.ringRegion()
        XCTAssertEqual(Int(bitPattern: ring.base) % 16384, 0)
        XCTAssertEqual(ring.slotBytes % 16384, 0)
        for expert in 0..<Self.experts {
            let claim = try unwrap(streamer.claim(layer: 2, expert: expert, timeoutNanoseconds: 10_000_000_000))
            let info = try streamer.expertInfo(layer: 2, expert: expert)
            XCTAssertEqual(claim.layer, 2)
            XCTAssertEqual(claim.expert, expert)
            XCTAssertEqual(UInt64(claim.size), info.size)
            XCTAssertFalse(claim.hit, "first claim of a fresh streamer reads")
            let expected = try fileBytes(offset: info.offset, count: Int(info.size))
            XCTAssertEqual(expected.count, claim.size)
            let slotStart = UnsafeRawPointer(ring.base + Int(claim.slotIndex) * Int(ring.slotBytes))
            claim.withUnsafeBytes { bytes in
                XCTAssertEqual(bytes.baseAddress, slotStart)
                XCTAssertTrue(bytes.elementsEqual(expected), "layer 2 expert \(expert): bytes differ")
            }
            try claim.release()
        }
    }

    /// A working set larger than the ring, claimed whichever member is
    /// ready first: each member once, with the file's bytes.
    func testWorkingSetIsClaimedOnceEach() throws {
        var config = Streamer.Config()
        config.workers = 2
        config.ringSlots = 4
        config.freqPath = ""
        let streamer = try Streamer(vault: Self.vaultDir, config: config)
        var left: [UInt32] = Array(0..<Self.experts)
        XCTAssertEqual(try streamer.prefetchSet(layer: 1, experts: left), 4, "the ring takes 4")
        var claimed: [UInt32] = []
        while !left.isEmpty {
            let claim = try unwrap(streamer.claimAny(layer: 1, experts: left, timeoutNanoseconds: 10_000_000_000))
            let expert = claim.expert
            let info = try streamer.expertInfo(layer: 1, expert: expert)
            let expected = try fileBytes(offset: info.offset, count: Int(info.size))
            claim.withUnsafeBytes { bytes in
                XCTAssertTrue(bytes.elementsEqual(expected), "expert \(expert): bytes differ")
            }
            claimed.append(expert)
            left.removeAll { $0 == expert }
            try claim.release()
        }
        XCTAssertEqual(claimed.sorted(), Array(0..<Self.experts))
        XCTAssertEqual(try streamer.stats().slots_held, 0)
    }

    func testReclaimIsAHit() throws {
        let streamer = try open()
        try streamer.prefetch(layer: 1, expert: 5)
        let first = try unwrap(streamer.claim(layer: 1, expert: 5, timeoutNanoseconds: 10_000_000_000))
        let firstSlot = first.slotIndex
        try first.release()
        let again = try unwrap(streamer.claim(layer: 1, expert: 5))  // resident: no wait
        XCTAssertTrue(again.hit)
        XCTAssertEqual(again.slotIndex, firstSlot)
        try again.release()
        let stats = try streamer.stats()
        XCTAssertEqual(stats.claims, 2)
        XCTAssertEqual(stats.hits, 1)
        XCTAssertEqual(stats.reads_demand, 1)
    }

    func testStaleReleaseThrowsWithTheMessage() throws {
        let streamer = try open()
        // A second release() of one Claim does not compile (release consumes
        // it). The library's STALE: a ticket that `deinit` already released.
        var slot = smoe_slot()
        do {
            let dropped = try unwrap(streamer.claim(layer: 1, expert: 1, timeoutNanoseconds: 10_000_000_000))
            slot = dropped.slot
        }
        XCTAssertThrowsError(try SMoEError.check(smoe_release(streamer.handle, &slot))) { error in
            let error = error as? SMoEError
            XCTAssertEqual(error?.status, .stale)
            XCTAssertEqual(error?.status.name, "SMOE_ERR_STALE")
            XCTAssertEqual(error?.message.isEmpty, false)
            XCTAssertEqual(error?.message, String(cString: smoe_last_error()))
            print("library STALE message: \(error?.message ?? "")")
        }
    }

    func testOutOfRangeExpertThrowsNotFound() throws {
        let streamer = try open()
        for (layer, expert) in [(1, Self.experts), (Self.layers, 0), (0, 0)] {  // layer 0 is dense
            // (XCTAssertThrowsError takes only copyable values: drop the claim)
            XCTAssertThrowsError(try { _ = try streamer.claim(layer: layer, expert: expert) }()) { error in
                let error = error as? SMoEError
                XCTAssertEqual(error?.status, .notFound)
                XCTAssertEqual(error?.message.isEmpty, false)
                print("NOT_FOUND message: \(error?.description ?? "")")
            }
            XCTAssertThrowsError(try streamer.prefetch(layer: layer, expert: expert)) { error in
                XCTAssertEqual((error as? SMoEError)?.status, .notFound)
            }
        }
    }

    func testOpenFailureThrowsIO() {
        XCTAssertThrowsError(try Streamer(vault: Self.vaultDir + "/missing")) { error in
            let error = error as? SMoEError
            XCTAssertEqual(error?.status, .io)
            XCTAssertEqual(error?.message.contains("missing"), true, error?.message ?? "")
        }
    }

    func testStatsAreReadable() throws {
        let streamer = try open()
        let before = try streamer.stats()
        XCTAssertEqual(Int(before.struct_size), MemoryLayout<smoe_stats>.size)
        XCTAssertEqual(before.claims, 0)
        XCTAssertGreaterThan(before.ring_slots, 0)
        XCTAssertEqual(before.slot_bytes % 16384, 0)
        XCTAssertEqual(before.workers, 2)
        XCTAssertEqual(Streamer.abiVersion, UInt32(SMOE_ABI_VERSION))
        XCTAssertEqual(Streamer.version, SMOE_VERSION_STRING)
        let claim = try unwrap(streamer.claim(layer: 2, expert: 7, timeoutNanoseconds: 10_000_000_000))
        let after = try streamer.stats()
        XCTAssertEqual(after.claims, 1)
        XCTAssertGreaterThanOrEqual(after.bytes_read, UInt64(claim.size))
        XCTAssertGreaterThanOrEqual(after.resident, 1)
        XCTAssertTrue(streamer.metadata.hasPrefix("{"))
    }

    /// A Streamer is Sendable (checked when this compiles) and used from
    /// several threads at once: each claims and checks its own experts.
    func testStreamerIsSharedAcrossThreads() throws {
        func requireSendable<T: Sendable>(_: T.Type) {}
        requireSendable(Streamer.self)
        let streamer = try open()
        let failures = Failures()
        DispatchQueue.concurrentPerform(iterations: Int(Self.experts)) { expert in
            do {
                guard let claim = try streamer.claim(
                    layer: 1, expert: UInt32(expert), timeoutNanoseconds: 10_000_000_000)
                else { return failures.add("expert \(expert): no claim") }
                if claim.expert != UInt32(expert) { failures.add("expert \(expert): got \(claim.expert)") }
                try claim.release()
            } catch {
                failures.add("expert \(expert): \(error)")
            }
        }
        XCTAssertEqual(failures.all, [])
        XCTAssertEqual(try streamer.stats().claims, UInt64(Self.experts))
    }
}

/// Messages collected from several threads.
final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var messages: [String] = []

    func add(_ message: String) {
        lock.lock()
        messages.append(message)
        lock.unlock()
    }

    var all: [String] {
        lock.lock()
        defer { lock.unlock() }
        return messages
    }
}
