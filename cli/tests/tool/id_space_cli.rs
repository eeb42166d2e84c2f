//! The id cap, as the tool reports it: a vault with more than 2^20 expert
//! ids is refused by `smoe inspect` in one line naming the limit. The cap
//! itself and what a vault at the cap costs are tested in the library's
//! `tests/alone/id_space.rs`.

use smoe_test_support as common;

use std::process::Command;

use common::forge::one_entry_vault;

#[test]
fn inspect_refuses_more_than_2_pow_20_ids_in_one_line() {
    for (layers, experts) in [(4096, 4096), (1 << 20, 2), (1024, 1025)] {
        let dir = tempfile::tempdir().unwrap();
        one_entry_vault(dir.path(), layers, experts);
        let out = Command::new(env!("CARGO_BIN_EXE_smoe"))
            .arg("inspect")
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("limit of 1048576 expert ids"), "{stderr}");
        assert!(
            !dir.path().join("expert_freq.bin").exists(),
            "nothing is written for a refused vault"
        );
    }
}
