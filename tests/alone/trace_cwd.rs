//! A relative `trace_path` names a file relative to the working directory at
//! open: a host that changes directory before close still gets its trace
//! where it asked. In the `alone` binary, because it changes the process's
//! working directory, which every other test thread would see.

use smoe_test_support as common;

use std::path::Path;
use std::time::Duration;

use smoe::{Config, Streamer};

#[test]
fn a_relative_trace_path_is_resolved_at_open() {
    let _alone = crate::alone();
    let v = common::vault(2, 4, 3000, &[]);
    let at_open = tempfile::tempdir().unwrap();
    let at_close = tempfile::tempdir().unwrap();
    let start = std::env::current_dir().unwrap();
    std::env::set_current_dir(at_open.path()).unwrap();
    let opened = Streamer::open(
        v.dir.path(),
        Config {
            trace_path: Some("trace.csv".into()),
            ..common::quiet_config(4, 1)
        },
    );
    std::env::set_current_dir(at_close.path()).unwrap();
    let s = opened.unwrap();
    assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    v.stream(&s, 1, 0..2, Duration::from_secs(10));
    drop(s);
    std::env::set_current_dir(start).unwrap();
    assert!(
        !at_close.path().join("trace.csv").exists(),
        "written relative to the directory at close"
    );
    let written = std::fs::read_to_string(at_open.path().join("trace.csv")).unwrap();
    assert_eq!(written, "token,layer,r0,r1\n0,1,0,1\n");
    assert!(Path::new(v.dir.path()).join("experts.smoe").exists());
}
