// Streams a vault through smoe from Swift: for each layer, prefetch all of
// its experts, then claim each one, check its bytes against experts.smoe,
// and release it; twice (the second pass is served from the ring when it
// holds the vault). Prints the stats.
//
// Usage: smoe-swift-stream VAULT [PASSES]
import Foundation
import SMoE

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("smoe-swift-stream: \(message)\n".utf8))
    exit(1)
}

let arguments = CommandLine.arguments
guard arguments.count >= 2 else { fail("usage: smoe-swift-stream VAULT [PASSES]") }
let vault = arguments[1]
let passes = arguments.count > 2 ? Int(arguments[2]) ?? 2 : 2
var isDirectory: ObjCBool = false
let vaultFile = FileManager.default.fileExists(atPath: vault, isDirectory: &isDirectory)
    && isDirectory.boolValue ? vault + "/experts.smoe" : vault

do {
    let streamer = try Streamer(vault: vault)
    guard let file = FileHandle(forReadingAtPath: vaultFile) else { fail("cannot open \(vaultFile)") }
    defer { try? file.close() }
    let shape = try streamer.stats()
    print("opened \(vault): ABI \(Streamer.abiVersion), \(shape.ring_slots) slots × \(shape.slot_bytes) bytes, "
        + "\(shape.workers) workers, direct I/O \(shape.direct_io == 1 ? "on" : "off")")
    if !streamer.warnings.isEmpty { print("warnings: \(streamer.warnings)") }

    // The shape, from the header (docs/format.md §2: n_layers and n_experts are
    // little-endian u32 at offsets 16 and 20); the C API does not expose it.
    // Layers without experts (dense) answer NOT_FOUND and are skipped.
    let header = try file.read(upToCount: 24) ?? Data()
    guard header.count == 24 else { fail("\(vaultFile): short header") }
    func u32(_ at: Int) -> UInt32 { header[at..<at + 4].reversed().reduce(0) { $0 << 8 | UInt32($1) } }
    let (nLayers, nExperts) = (u32(16), u32(20))
    var layers: [UInt32: [UInt32]] = [:]
    for layer in 0..<nLayers {
        let experts = (0..<nExperts).filter { (try? streamer.expertInfo(layer: layer, expert: $0)) != nil }
        if !experts.isEmpty { layers[layer] = experts }
    }
    print("vault: \(nLayers) layers × \(nExperts) experts, \(layers.count) layers with experts")

    var checked = 0
    var checkedBytes = 0
    let start = Date()
    for pass in 1...passes {
        var hits = 0
        for layer in layers.keys.sorted() {
            for expert in layers[layer]! {
                try streamer.prefetch(layer: layer, expert: expert)
            }
            for expert in layers[layer]! {
                guard let claim = try streamer.claim(layer: layer, expert: expert, timeoutNanoseconds: 10_000_000_000)
                else { fail("layer \(layer) expert \(expert): no data in 10 s") }
                let info = try streamer.expertInfo(layer: layer, expert: expert)
                try file.seek(toOffset: info.offset)
                let expected = try file.read(upToCount: Int(info.size)) ?? Data()
                let same = claim.withUnsafeBytes { $0.elementsEqual(expected) }
                if !same { fail("layer \(layer) expert \(expert): bytes differ from \(vaultFile)") }
                if claim.hit { hits += 1 }
                checked += 1
                checkedBytes += claim.size
                try claim.release()
            }
        }
        print("pass \(pass): \(hits) hits")
    }
    let seconds = Date().timeIntervalSince(start)
    let stats = try streamer.stats()
    print("checked \(checked) claims, \(checkedBytes) bytes, equal to the file, in \(String(format: "%.3f", seconds)) s")
    print("stats: claims \(stats.claims), hits \(stats.hits), pending \(stats.pending), "
        + "bytes_read \(stats.bytes_read), reads_demand \(stats.reads_demand), "
        + "reads_speculative \(stats.reads_speculative), evictions \(stats.evictions), "
        + "io_errors \(stats.io_errors), resident \(stats.resident)/\(stats.ring_slots)")
} catch {
    fail("\(error)")
}
