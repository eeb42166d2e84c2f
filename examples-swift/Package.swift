// swift-tools-version:5.9
// The Swift wrapper of smoe's C API, an example executable and its tests.
//
// The C API is imported through the module map in Sources/CSMoE (module
// `CSMoE`), which names this repository's include/smoe.h by relative path,
// so no include flag is needed. The library is linked with `-lsmoe` from
// SMOE_LIB_DIR (default: ../target/release, i.e. after `cargo build
// --release`):
//
//   SMOE_LINK unset or "dynamic"  links libsmoe.so and records SMOE_LIB_DIR
//                                 as the executables' rpath;
//   SMOE_LINK=static              for a SMOE_LIB_DIR holding only libsmoe.a
//                                 (a linker prefers the .so when both are
//                                 there); adds the native libraries Rust's
//                                 std needs (`cargo rustc --release --lib
//                                 --crate-type staticlib -- --print
//                                 native-static-libs`).
//
// Both settings are unsafeFlags, allowed for a root package: this is an
// example to build in place, not a dependency for other packages.
import PackageDescription

let packageDir = Context.packageDirectory
let repoDir = String(packageDir[..<(packageDir.lastIndex(of: "/") ?? packageDir.endIndex)])
let libDir = Context.environment["SMOE_LIB_DIR"] ?? "\(repoDir)/target/release"
let linkStatic = Context.environment["SMOE_LINK"] == "static"

var smoeLinker: [LinkerSetting] = [
    .linkedLibrary("smoe"),
    .unsafeFlags(["-L\(libDir)"]),
]
if linkStatic {
    // Linux's list; on Apple platforms libSystem, always linked, has them.
    smoeLinker += ["gcc_s", "util", "rt", "pthread", "m", "dl", "c"].map {
        .linkedLibrary($0, .when(platforms: [.linux]))
    }
} else {
    smoeLinker.append(.unsafeFlags(["-Xlinker", "-rpath", "-Xlinker", libDir]))
}

let package = Package(
    name: "SMoE",
    products: [
        .library(name: "SMoE", targets: ["SMoE"]),
        .executable(name: "smoe-swift-stream", targets: ["smoe-swift-stream"]),
    ],
    targets: [
        .systemLibrary(name: "CSMoE", path: "Sources/CSMoE"),
        .target(name: "SMoE", dependencies: ["CSMoE"], linkerSettings: smoeLinker),
        .executableTarget(name: "smoe-swift-stream", dependencies: ["SMoE"]),
        .testTarget(name: "SMoETests", dependencies: ["SMoE", "CSMoE"]),
    ]
)
