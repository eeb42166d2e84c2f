// swift-tools-version:6.0
// An example executable and the tests of smoe's Swift wrapper, the package
// at the repository root (product SMoE), which this package depends on by
// path, as another package would by URL.
//
// The C library is an installed one (scripts/install.sh PREFIX), found with
// pkg-config: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig. Running the binaries
// needs PREFIX/lib on LD_LIBRARY_PATH (or the library in a system directory).
//
// SMOE_LINK=static, with a PREFIX whose lib/ holds libsmoe.a only (a linker
// takes the shared library when both are there), also links the native
// libraries Rust's std needs on Linux (`cargo rustc --release --lib
// --crate-type staticlib -- --print native-static-libs`; on Apple platforms
// libSystem, always linked, has them).
import PackageDescription

let nativeStaticLibs: [LinkerSetting] = Context.environment["SMOE_LINK"] == "static"
    ? ["gcc_s", "util", "rt", "pthread", "m", "dl", "c"].map {
        .linkedLibrary($0, .when(platforms: [.linux]))
    }
    : []

let package = Package(
    name: "SMoEExamples",
    dependencies: [
        .package(name: "smoe", path: ".."),
    ],
    targets: [
        .executableTarget(
            name: "smoe-swift-stream",
            dependencies: [.product(name: "SMoE", package: "smoe")],
            linkerSettings: nativeStaticLibs),
        .testTarget(
            name: "SMoETests",
            dependencies: [.product(name: "SMoE", package: "smoe")],
            swiftSettings: [.swiftLanguageMode(.v5)]),
    ]
)
