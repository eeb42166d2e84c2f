// swift-tools-version:6.0
// smoe's Swift wrapper, for SwiftPM (docs/swift-objc.md):
//
//   .package(url: "https://…/smoe.git", from: "0.1.0")
//   .product(name: "SMoE", package: "smoe")
//
// The C library is not built here: it is the one an install tree holds
// (scripts/install.sh PREFIX, or a distribution's package), which the
// system-library target CSMoE finds with pkg-config (smoe.pc; set
// PKG_CONFIG_PATH=PREFIX/lib/pkgconfig for a prefix pkg-config does not
// search). No unsafe flags, so any package can depend on this one.
import PackageDescription

let package = Package(
    name: "smoe",
    products: [
        .library(name: "SMoE", targets: ["SMoE"]),
    ],
    targets: [
        .systemLibrary(name: "CSMoE", path: "swift/CSMoE", pkgConfig: "smoe"),
        .target(name: "SMoE", dependencies: ["CSMoE"], path: "swift/SMoE"),
    ]
)
