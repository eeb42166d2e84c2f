//! The vault: `experts.smoe` and the files beside it (SPEC §1).
